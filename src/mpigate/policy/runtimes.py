"""ClusterTrainingRuntimes and TrainingRuntimes, judged on their own (see :mod:`mpigate.policy.engine`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from mpigate.config import Config
from mpigate.trainjob import Resolution, resolve_runtime
from mpigate.trainjob.jsontypes import is_mapping

from .context import RuntimeContext, as_mapping, labels_of, request_identity, request_object
from .custom import custom_findings
from .decision import AdmissionInput, Decision
from .findings import Finding
from .jobchecks import declared_implementation, dedupe, guarded, problem_findings
from .prepared import config_image_refs
from .rules.image import check_images
from .rules.runtime import check_mpi_sanity, check_runtime_drift
from .rules.security import check_pod_security, check_secrets
from .verdict import audited, decide

__all__ = ["judge_runtime"]


def judge_runtime(config: Config, request: AdmissionInput, now: dt.datetime) -> Decision:
    obj = request_object(request) if request.obj is not None else as_mapping(request.old_obj)
    namespace, name = request_identity(request, obj)
    namespace_opt = namespace if request.kind == "TrainingRuntime" else None
    team = config.team_for_namespace(namespace) if namespace_opt else None
    if request.operation in ("DELETE", "CONNECT"):
        return audited(config, request, namespace, name, team)
    findings, notes = _runtime_findings(config, request, obj, namespace_opt, name)
    annotations: dict[str, str] = {}
    if request.operation == "UPDATE" and is_mapping(request.old_obj):
        old_findings, _ = _runtime_findings(config, request, request.old_obj, namespace_opt, name)
        before = {f.identity for f in old_findings}
        findings = [f for f in findings if f.identity not in before]
    findings.extend(
        custom_findings(
            config,
            request,
            target="Runtime",
            obj=obj,
            old=request.old_obj if request.operation == "UPDATE" and is_mapping(request.old_obj) else None,
            team=team,
            namespace=namespace,
            name=name,
            labels=labels_of(obj),
            classification=None,
            resolution=resolve_runtime(obj),
            runtime=obj,
            notes=notes,
            today=now.astimezone(dt.UTC).date() if now.tzinfo else now.date(),
            annotations=annotations,
        )
    )
    return decide(
        config,
        request,
        namespace or None,
        name,
        team,
        findings,
        [],
        None,
        labels_of(obj),
        now,
        notes=notes,
        annotations=annotations,
    )


def _runtime_findings(
    config: Config, request: AdmissionInput, obj: Mapping[str, Any], namespace: str | None, name: str
) -> tuple[list[Finding], list[str]]:
    """The findings on a runtime object, and the notes (what Trainer accepts but that is probably
    not meant, e.g. a trainer job where no TrainJob field can land)."""
    org = config.org
    resolution: Resolution = resolve_runtime(obj)
    ctx = RuntimeContext(config, request.operation, obj, request.kind, namespace, name, resolution)
    out: list[Finding] = []
    out += guarded("MPG-RT-001", lambda: check_runtime_drift(config, obj, ctx.kind, namespace, name))
    out += guarded("MPG-RT-001", lambda: problem_findings(resolution.problems))
    declared = declared_implementation(config, ctx.kind, name)
    out += guarded("MPG-RT-002", lambda: check_mpi_sanity(config, resolution, "", declared=declared))
    out += guarded(
        "MPG-SEC-PRIVILEGED", lambda: check_pod_security(org.security, resolution.jobs, pods_note=False)
    )
    if org.security.forbid_plaintext_secrets:
        out += guarded("MPG-SEC-SECRETS", lambda: check_secrets(resolution.jobs))
    out += guarded(
        "MPG-IMG-001",
        lambda: check_images(
            org.images,
            resolution.jobs,
            require_digest=org.images.require_digest,
            digest_reason="the org",
            known=config_image_refs(config),
        ),
    )
    return dedupe(out), [p.message for p in resolution.problems if p.advisory]

"""The catalogue's rule families run on a job's context (each guarded: a family that fails on a
malformed object fails closed under its first rule), and resolution problems as findings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from mpigate.config import Config
from mpigate.config.mpienv import Implementation
from mpigate.trainjob import Problem

from .context import JobContext, as_mapping, as_str
from .decision import Demand
from .findings import Finding
from .mpijob import MPIJOB_PROBLEM_RULES
from .prepared import config_image_refs
from .rules.image import check_image_ref, check_images, config_clean_images
from .rules.lifecycle import check_lifecycle
from .rules.network import check_network
from .rules.quota import check_quota
from .rules.residency import check_residency
from .rules.runtime import check_managed_by, check_mpi_sanity, check_runtime_approval
from .rules.secrets import check_secret_refs
from .rules.security import (
    check_pod_security,
    check_secrets,
    check_service_accounts,
    config_credential_reasons,
    credential_reason,
    value_digest,
)
from .shapes import TRAINJOB, JobShape

__all__ = ["declared_implementation", "dedupe", "guarded", "problem_findings", "trainjob_findings"]

log = logging.getLogger(__name__)


def guarded(rule: str, produce: Callable[[], Iterable[Finding]]) -> list[Finding]:
    """Run one rule family; if it fails on a malformed object, fail closed under its first rule."""
    try:
        return list(produce())
    except Exception as exc:  # pragma: no cover - defensive, see tests/policy/test_fuzz.py
        log.exception("rule %s failed", rule)
        return [
            Finding(
                rule,
                "(object)",
                f"could not be evaluated: the object is malformed ({type(exc).__name__}).",
                "Check the object against the CRD schema (kubectl apply --dry-run=server).",
                "object could not be evaluated",
            )
        ]


# Resolution problems (wrong types, patches Trainer rejects) are reported under the rule that
# needed the field, and under MPG-RT-001 where that rule never denies (MPG-Q004 is advisory, so a
# malformed numProcPerNode is MPG-RT-001): malformed is refused, never absent.
_PROBLEM_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("spec", "trainer", "numNodes"), "MPG-Q002"),
    (("spec", "trainer", "resourcesPerNode"), "MPG-Q003"),
    (("spec", "trainer", "image"), "MPG-IMG-001"),
    (("spec", "trainer", "env"), "MPG-SEC-SECRETS"),
    (("spec", "initializer"), "MPG-RES-003"),
)


def problem_findings(problems: Iterable[Problem], shape: JobShape = TRAINJOB) -> Iterator[Finding]:
    # A TrainJob's problems are its runtime's (MPG-RT-001) unless a field of its own has the wrong
    # type; an MPIJob has no runtime: what the MPI Operator would refuse is MPI sanity (MPG-RT-002)
    # unless a rule owns the field.
    table, default = (
        (_PROBLEM_RULES, "MPG-RT-001") if shape is TRAINJOB else (MPIJOB_PROBLEM_RULES, "MPG-RT-002")
    )
    for problem in problems:
        if problem.advisory:
            continue
        rule = default
        if (problem.malformed or shape is not TRAINJOB) and not problem.in_runtime:
            rule = next((r for prefix, r in table if problem.field[: len(prefix)] == prefix), default)
        message = problem.message if problem.in_runtime else f"{problem.message}."
        path = problem.path if not problem.in_runtime else problem.message.split(": ", 1)[0]
        if problem.in_runtime:
            message = problem.message.split(": ", 1)[-1]
        fix = (
            ("Fix the field's type (see the Trainer CRD)." if shape is TRAINJOB else "Fix the field's type.")
            if problem.malformed
            else "Change the MPIJob as the message says: the MPI Operator would not run it."
            if shape is not TRAINJOB
            else (
                "Make the TrainJob fit its runtime: patch only jobs and containers it has, and "
                "configure only the "
                "initializers it runs."
            )
        )
        yield Finding(
            rule, path, message[0].upper() + message[1:] if message else message, fix, message[:100]
        )


def trainjob_findings(ctx: JobContext, demand: Demand | None) -> list[Finding]:
    config = ctx.config
    org = config.org
    resolution = ctx.resolution
    out: list[Finding] = []
    ref = as_mapping(ctx.spec.get("runtimeRef"))
    approval: list[Finding] = []
    if ctx.shape is TRAINJOB:  # an MPIJob has no runtime: its pod templates are judged directly
        approval = guarded(
            "MPG-RT-001",
            lambda: check_runtime_approval(
                config, ctx.team, ref, ctx.namespace, in_tree=resolution is not None or ctx.runtime_known
            ),
        )
        out += approval
    out += guarded("MPG-RT-001", lambda: check_managed_by(ctx.spec))
    out += guarded("MPG-Q001", lambda: check_quota(ctx, demand))
    out += guarded("MPG-RES-001", lambda: check_residency(ctx))
    out += guarded("MPG-NET-001", lambda: check_network(ctx))
    out += guarded("MPG-LIFE-001", lambda: check_lifecycle(ctx))
    if resolution is not None:
        out += guarded("MPG-RT-001", lambda: problem_findings(resolution.problems, ctx.shape))
        root = f"runtime {resolution.runtime_name}: " if ctx.shape is TRAINJOB else ""
        declared = declared_implementation(config, ctx.runtime_kind, ctx.runtime_name)
        out += guarded("MPG-RT-002", lambda: check_mpi_sanity(config, resolution, root, ctx.shape, declared))
        out += guarded("MPG-SEC-PRIVILEGED", lambda: check_pod_security(org.security, resolution.jobs))
        if org.security.forbid_plaintext_secrets:
            out += guarded(
                "MPG-SEC-SECRETS", lambda: check_secrets(resolution.jobs, config_credential_reasons(config))
            )
        out += guarded("MPG-SA-001", lambda: check_service_accounts(ctx, resolution))
        if ctx.team is not None:
            team = ctx.team
            out += guarded(
                "MPG-SEC-SECRETREF",
                lambda: check_secret_refs(resolution.jobs, ctx.name, team.name, config.secrets_of(team.name)),
            )
        out += guarded(
            "MPG-IMG-001",
            lambda: check_images(
                org.images,
                resolution.jobs,
                require_digest=ctx.require_digest,
                digest_reason=ctx.require_digest_reason,
                known=config_image_refs(config),
                clean=config_clean_images(config),
            ),
        )
    else:
        if ctx.runtime_known and not approval:  # approved as external; its manifest is not at hand
            out += guarded("MPG-RT-003", lambda: _unresolved_runtime(ctx))
        out += guarded("MPG-IMG-001", lambda: _trainer_only(ctx))
    return dedupe(out)


def _unresolved_runtime(ctx: JobContext) -> Iterator[Finding]:
    """MPG-RT-003: a runtime approved as external whose manifest could not be read. Without it the
    job's pods cannot be built, so images, Pod Security, residency, service accounts and network
    would go unjudged: denied by default, a warning where the org says ``MPG-RT-003: warn``."""
    live = ctx.live
    if live is not None and (live.runtime_reason or live.unavailable_reason):
        reason = live.runtime_reason or live.unavailable_reason
    else:
        reason = "no cluster was asked: mpigate explain/test, or serve --no-live"
    kind = ctx.runtime_kind or "ClusterTrainingRuntime"
    yield Finding(
        "MPG-RT-003",
        "spec.runtimeRef.name",
        f"{kind} {ctx.runtime_name} is approved as external, but its manifest could not be read "
        f"({reason}); without it mpigate cannot judge the job's pods (images, Pod Security, "
        "residency, service accounts, network), only spec.trainer.",
        f"Retry once the runtime can be read (kubectl get {kind.lower()} {ctx.runtime_name}); with "
        "mpigate explain, pass its manifest with --runtime FILE. To admit such jobs with a warning, "
        "set spec.enforcement.overrides MPG-RT-003: warn in the OrgPolicy.",
        f"runtime {ctx.runtime_name} could not be read; the job's pods were not judged",
    )


def _trainer_only(ctx: JobContext) -> Iterator[Finding]:
    """Checks that need no runtime: the trainer image and env (runtime unknown or external)."""
    org = ctx.config.org
    image = ctx.trainer.get("image")
    if image is not None:
        yield from check_image_ref(
            org.images,
            image,
            "spec.trainer.image",
            require_digest=ctx.require_digest,
            digest_reason=ctx.require_digest_reason,
            patchable=True,
        )
    if org.security.forbid_plaintext_secrets:
        for var in ctx.trainer.get("env") or [] if isinstance(ctx.trainer.get("env"), list) else []:
            var = as_mapping(var)
            name, value = as_str(var.get("name")), var.get("value")
            if name and isinstance(value, str) and (reason := credential_reason(name, value)):
                yield Finding(
                    "MPG-SEC-SECRETS",
                    f"spec.trainer.env[name={name}]",
                    f"env {name} has a literal value that looks like a credential: {reason} "
                    f"({len(value)} characters; the value is not shown).",
                    "Store it in a Secret and reference it with valueFrom.secretKeyRef.",
                    f"env {name} looks like a literal credential",
                    value=value_digest(value),
                )


def dedupe(findings: Iterable[Finding]) -> list[Finding]:
    seen: set[tuple[str, str, str]] = set()
    out: list[Finding] = []
    for f in findings:
        if f.key not in seen:
            seen.add(f.key)
            out.append(f)
    return out


def declared_implementation(config: Config, kind: str, name: str) -> Implementation | None:
    """The MPI implementation the approved-runtimes entry of runtime ``kind``/``name`` declares."""
    approval = config.org.runtime_approval(name, kind) if name else None
    return approval.mpi_implementation if approval is not None else None

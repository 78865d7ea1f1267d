"""Answers the engine prepares once per config give exactly what computing them per request gives:
the credential check of the env entries of the config's runtimes and of the pinned port
environment mpigate injects (MPG-SEC-SECRETS) — each the same reason as :func:`credential_reason`
— and which of the runtimes' images break no image rule
(MPG-IMG-001/002); the same findings, paths and messages whether the prepared answers are used or
not, on the example TrainJobs and on generated and hostile ones whose env and images repeat,
shadow or add to the runtime's, with and without a required digest."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpigate.config.mpienv import IMPLEMENTATIONS
from mpigate.policy import AdmissionInput, UserInfo, mutations
from mpigate.policy.jobcontext import job_context
from mpigate.policy.jsonpatch import apply_patch
from mpigate.policy.prepared import config_image_refs
from mpigate.policy.rules.image import check_image_ref, check_images, config_clean_images
from mpigate.policy.rules.security import check_secrets, config_credential_reasons, credential_reason
from tests.conftest import REPO
from tests.policy.helpers import example_org, read
from tests.policy.test_properties import trainjobs

ORG = example_org()
EXAMPLES = sorted((REPO / "examples" / "trainjobs").glob("*.yaml"))

# Literal env values a tenant might write: credential shapes, names that say "credential", values
# equal to one of the runtime's own, harmless ones.
ENV_VALUES = st.sampled_from(
    [
        "AKIAABCDEFGHIJKLMNOP",
        "ghp_" + "a" * 36,
        "hunter2hunter2",
        "true",
        "$(HOME)",
        "x" * 40,
        "Zx9_kQ2-pL7mN4vB8cR1tY6wE3uI0oPa",
        "/etc/mpi/hostfile",
        "",
    ]
)
ENV_NAMES = st.sampled_from(
    ["PASSWORD", "API_KEY", "HF_TOKEN", "B", "OMPI_MCA_orte_default_hostfile", "NCCL_DEBUG"]
)


def _both_ways(obj: dict[str, Any]) -> None:
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "nlp-team")
    team = ORG.team_for_namespace(namespace)
    ctx, _ = job_context(ORG, "CREATE", obj, namespace, "job", team, None, UserInfo())
    if ctx.resolution is None:
        return
    jobs = ctx.resolution.jobs
    assert list(check_secrets(jobs, config_credential_reasons(ORG))) == list(check_secrets(jobs))
    known = config_image_refs(ORG)
    for require_digest in (False, True):
        reason = "data classified phi" if require_digest else "the org"
        prepared = check_images(
            ORG.org.images,
            jobs,
            require_digest=require_digest,
            digest_reason=reason,
            known=known,
            clean=config_clean_images(ORG),
        )
        plain = check_images(ORG.org.images, jobs, require_digest=require_digest, digest_reason=reason)
        assert list(prepared) == list(plain)


def test_each_prepared_answer_is_credential_reason() -> None:
    known = config_credential_reasons(ORG)
    assert known, "the example runtimes have literal env entries"
    for (name, value), reason in known.items():
        assert reason == credential_reason(name, value)


def test_the_pinned_port_environment_is_prepared() -> None:
    known = config_credential_reasons(ORG)
    pinned = {
        pair
        for profile in ORG.network_profiles.values()
        for implementation in IMPLEMENTATIONS
        for pair in profile.pinned_env(implementation)
    }
    assert pinned, "the example org has a pinned-ports profile"
    assert pinned <= set(known)


def _mutated(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as mpigate's mutation leaves it (with the pinned port environment where the job's
    network profile pins ports)."""
    meta = obj.get("metadata") or {}
    request = AdmissionInput(
        operation="CREATE",
        kind=str(obj.get("kind", "TrainJob")),
        namespace=str(meta.get("namespace") or "nlp-team"),
        name=str(meta.get("name") or "job"),
        obj=obj,
    )
    patch = mutations(ORG, request).patch
    return apply_patch(obj, list(patch)) if patch else obj


def test_the_mutated_examples_get_the_same_findings() -> None:
    pinned_jobs = 0
    for path in EXAMPLES:
        obj = _mutated(read(path))
        pinned_jobs += "OMPI_MCA_btl_tcp_port_min_v4" in str(obj)
        _both_ways(obj)
        # the pinned entries again, changed, and beside a credential
        hostile = copy.deepcopy(obj)
        env = hostile.setdefault("spec", {}).setdefault("trainer", {}).setdefault("env", [])
        if isinstance(env, list):
            env += [
                {"name": "OMPI_MCA_btl_tcp_port_min_v4", "value": "AKIAABCDEFGHIJKLMNOP"},
                {"name": "I_MPI_PORT_RANGE", "value": "ghp_" + "a" * 36},
            ]
            _both_ways(hostile)
    assert pinned_jobs, "some example runs with the pinned-ports profile"


def test_a_wrong_prepared_answer_is_caught() -> None:
    # The comparison above must be able to fail: a prepared answer that calls a pinned entry a
    # credential changes the findings of a job that carries it.
    obj = _mutated(read(REPO / "examples" / "trainjobs" / "phi-pinned.yaml"))
    ctx, _ = job_context(
        ORG, "CREATE", obj, "nlp-team", "job", ORG.team_for_namespace("nlp-team"), None, UserInfo()
    )
    assert ctx.resolution is not None
    jobs = ctx.resolution.jobs
    wrong = dict(config_credential_reasons(ORG))
    pinned = next(pair for pair in wrong if pair[0] == "OMPI_MCA_btl_tcp_port_min_v4")
    wrong[pinned] = "the name says it is a credential"
    assert list(check_secrets(jobs, wrong)) != list(check_secrets(jobs))
    assert list(check_secrets(jobs, config_credential_reasons(ORG))) == list(check_secrets(jobs))


def test_each_clean_image_breaks_no_image_rule() -> None:
    clean = config_clean_images(ORG)
    assert clean, "the example runtimes have images"
    for image in config_image_refs(ORG):
        for require_digest in (False, True):
            findings = list(
                check_image_ref(ORG.org.images, image, "x", require_digest=require_digest, digest_reason="r")
            )
            assert ((image, require_digest) in clean) == (not findings)


def test_the_examples_get_the_same_findings() -> None:
    for path in EXAMPLES:
        obj = read(path)
        _both_ways(obj)
        # the runtime's own entries repeated in spec.trainer.env, with a credential beside them
        hostile = copy.deepcopy(obj)
        trainer = hostile.setdefault("spec", {}).setdefault("trainer", {})
        trainer["env"] = [
            {"name": name, "value": value} for (name, value) in list(config_credential_reasons(ORG))[:3]
        ] + [{"name": "AWS_SECRET_ACCESS_KEY", "value": "AKIAABCDEFGHIJKLMNOP"}]
        # a runtime's image as the trainer's, and one no rule allows
        for image in [*list(config_image_refs(ORG))[:2], "evil.example/x:latest", "busybox"]:
            trainer["image"] = image
            _both_ways(hostile)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trainjobs(),
    st.lists(st.tuples(ENV_NAMES, ENV_VALUES), max_size=4),
    st.sampled_from([None, *sorted(config_image_refs(ORG)), "evil.example/x:latest", "busybox"]),
)
def test_generated_jobs_get_the_same_findings(
    job: dict[str, Any], env: list[tuple[str, str]], image: str | None
) -> None:
    if env:
        job["spec"]["trainer"]["env"] = [{"name": n, "value": v} for n, v in env]
    if image is not None:
        job["spec"]["trainer"]["image"] = image
    _both_ways(job)

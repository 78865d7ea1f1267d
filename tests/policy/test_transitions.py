"""UPDATE transitions as an attacker with a tenant's rights would chain them.

The property: starting from any example TrainJob that CREATE admits, no sequence of individually
admitted UPDATEs (a tenant's, interleaved with Kueue's suspend/admit updates) ends in a stored
object that a CREATE of the same object would deny, or would store differently. Whatever an UPDATE
can reach, a CREATE could have reached too — so every CREATE-time guarantee holds for every stored
TrainJob.

That property alone cannot see grandfathering (an admitted start has no finding to grandfather),
so a second one starts from every example, also those today's policy denies: no admitted UPDATE
adds a denial a CREATE of the start did not have. Run against grandfathering by rule and path
alone (the engine before issue 16), its random search found a counterexample with each of seeds 1-7
(another foreign image at the same path, more nodes over the same quota, a longer deadline); the
explicit examples keep those three.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mpigate.config import Config, load
from mpigate.policy import Decision, apply_patch
from tests.conftest import REPO, TODAY
from tests.policy.helpers import EXAMPLES, decide, example_org, read, runtime_patch

ORG: Config = example_org()
OWN = "mpigate.io/admission"
KUEUE = "system:serviceaccount:kueue-system:kueue-controller-manager"
TENANTS = ("maria@acme.example", "lena@acme.example", "omar@acme.example", "ines@acme.example")


def _creatable() -> list[tuple[str, dict[str, Any], str]]:
    """(example, stored object, creating user) for every example TrainJob CREATE admits."""
    out = []
    for path in sorted((EXAMPLES / "trainjobs").glob("*.yaml")):
        obj = read(path)
        for user in TENANTS:
            decision = decide(ORG, obj, user=user)
            if decision.allowed:
                out.append((path.stem, apply_patch(obj, decision.patch), user))
                break
    return out


CREATABLE = _creatable()

PATCHES: dict[str, dict[str, Any]] = {
    "kueue": runtime_patch(
        "kueue.x-k8s.io/manager",
        "node",
        {"nodeSelector": {"nvidia.com/gpu.product": "A100-SXM4-80GB"}},
        {"labels": {"kueue.x-k8s.io/podset": "node"}},
    ),
    "privileged": runtime_patch(
        "acme.example/debug",
        "node",
        {"containers": [{"name": "node", "securityContext": {"privileged": True}}]},
    ),
    "pipeline-sa": runtime_patch("acme.example/sa", "launcher", {"serviceAccountName": "nlp-pipeline"}),
    "cv-sa": runtime_patch("acme.example/sa", "launcher", {"serviceAccountName": "cv-pipeline"}),
    "other-region": runtime_patch(
        "acme.example/place", "node", {"nodeSelector": {"topology.kubernetes.io/region": "us-east-1"}}
    ),
    "team-spoof": runtime_patch(
        "acme.example/labels", "node", {}, {"labels": {"mpigate.io/team": "cv-team"}}
    ),
    "forged-own": runtime_patch(
        OWN,
        "node",
        {
            "serviceAccountName": "nlp-pipeline",
            "tolerations": [
                {"key": "topology.kubernetes.io/region", "operator": "Equal", "value": "us-east-1"}
            ],
        },
    ),
    "harmless": runtime_patch("acme.example/tidy", "node", {"terminationGracePeriodSeconds": 30}),
}

LABELS = {
    "kueue.x-k8s.io/queue-name": ["nlp-team", "cv-team", "research-team", None],
    "kueue.x-k8s.io/priority-class": ["standard", "urgent", "low", None],
    "mpigate.io/data-classification": ["public", "internal", "phi", None],
    "mpigate.io/cost-center": ["cc-4711", "cc-9999", None],
    "mpigate.io/team": ["nlp-team", "cv-team", None],
    "app.kubernetes.io/name": ["trainer", None],
}

operations = st.one_of(
    st.tuples(st.just("suspend"), st.booleans()),
    st.tuples(st.just("kueue-admits"), st.booleans()),
    st.tuples(st.just("label"), st.sampled_from(sorted(LABELS)), st.integers(0, 3)),
    st.tuples(st.just("add-patch"), st.sampled_from(sorted(PATCHES))),
    st.tuples(st.just("drop-patch"), st.integers(0, 4)),
    st.tuples(st.just("own-entry"), st.sampled_from(["drop", "strip-selector", "strip-team"])),
    st.tuples(st.just("num-nodes"), st.integers(1, 8)),
    st.tuples(
        st.just("image"),
        st.sampled_from(
            ["docker.io/evil/miner:1", "registry.acme.internal/nlp/x:latest", "vendor.example.com/x:1"]
        ),
    ),
    st.tuples(st.just("deadline"), st.sampled_from([None, 60, 10**7])),
    st.tuples(
        st.just("runtime"), st.sampled_from(["mpi-openmpi-gpu", "mpi-openmpi-data", "torch-distributed"])
    ),
    st.tuples(st.just("env"), st.sampled_from(["secret", "pinned-override", "drop-all"])),
    st.tuples(st.just("managed-by"), st.sampled_from([None, "kueue.x-k8s.io/multikueue", "acme.example/x"])),
)


def _apply(obj: dict[str, Any], op: tuple[Any, ...]) -> tuple[dict[str, Any], bool]:
    """``obj`` after ``op`` (a copy), and whether Kueue's controller (not the tenant) sends it."""
    new = copy.deepcopy(obj)
    spec = new.setdefault("spec", {})
    labels = new.setdefault("metadata", {}).setdefault("labels", {})
    patches = spec.setdefault("runtimePatches", [])
    trainer = spec.setdefault("trainer", {})
    kind = op[0]
    if kind == "suspend":
        spec["suspend"] = op[1]
    elif kind == "kueue-admits":  # RunWithPodSetsInfo / Stop: its patch entry and suspend together
        spec["suspend"] = not op[1]
        patches[:] = [p for p in patches if p.get("manager") != "kueue.x-k8s.io/manager"]
        if op[1]:
            patches.append(copy.deepcopy(PATCHES["kueue"]))
        return new, True
    elif kind == "label":
        choices = LABELS[op[1]]
        value = choices[op[2] % len(choices)]
        if value is None:
            labels.pop(op[1], None)
        else:
            labels[op[1]] = value
    elif kind == "add-patch":
        patch = copy.deepcopy(PATCHES[op[1]])
        patches[:] = [p for p in patches if p.get("manager") != patch["manager"] or patch["manager"] == OWN]
        patches.append(patch)
    elif kind == "drop-patch":
        if patches:
            del patches[op[1] % len(patches)]
    elif kind == "own-entry":
        for entry in patches:
            if entry.get("manager") != OWN:
                continue
            if op[1] == "drop":
                patches.remove(entry)
                break
            for job in entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                template = job["template"]["spec"]["template"]
                if op[1] == "strip-selector":
                    template.get("spec", {}).pop("nodeSelector", None)
                else:
                    template.get("metadata", {}).pop("labels", None)
            break
    elif kind == "num-nodes":
        trainer["numNodes"] = op[1]
    elif kind == "image":
        trainer["image"] = op[1]
    elif kind == "deadline":
        if op[1] is None:
            spec.pop("activeDeadlineSeconds", None)
        else:
            spec["activeDeadlineSeconds"] = op[1]
    elif kind == "runtime":
        spec["runtimeRef"] = {"name": op[1]}
    elif kind == "env":
        env = trainer.setdefault("env", [])
        if op[1] == "secret":
            env.append({"name": "HF_TOKEN", "value": "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"})
        elif op[1] == "pinned-override":
            env[:] = [e for e in env if e.get("name") != "OMPI_MCA_btl_tcp_port_min_v4"]
            env.append({"name": "OMPI_MCA_btl_tcp_port_min_v4", "value": "1024"})
        else:
            env.clear()
    elif kind == "managed-by":
        if op[1] is None:
            spec.pop("managedBy", None)
        else:
            spec["managedBy"] = op[1]
    if not patches:
        del spec["runtimePatches"]
    return new, False


def _outside_own_entry(decision: Decision, stored: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The patch operations of a CREATE that change anything but mpigate's own runtime patch entry
    (which CREATE recomputes from the job: a stored entry that is a superset of it is fine)."""
    own = next(
        (
            i
            for i, p in enumerate(stored.get("spec", {}).get("runtimePatches") or [])
            if p.get("manager") == OWN
        ),
        None,
    )
    prefix = f"/spec/runtimePatches/{own}" if own is not None else None
    return [op for op in decision.patch if prefix is None or not str(op["path"]).startswith(prefix)]


def _admitted(
    stored: dict[str, Any], tenant: str, ops: list[tuple[Any, ...]]
) -> Iterator[tuple[dict[str, Any], list[str]]]:
    """Sends each of ``ops`` as an UPDATE (by Kueue or the tenant) of the object stored so far;
    yields the stored object and the operations admitted so far after each admitted one."""
    trail: list[str] = []
    for op in ops:
        new, by_kueue = _apply(stored, op)
        decision = decide(ORG, new, operation="UPDATE", old=stored, user=KUEUE if by_kueue else tenant)
        if decision.allowed:
            stored = new
            trail.append(repr(op))
            yield stored, trail


@pytest.mark.skipif(not CREATABLE, reason="no example TrainJob is admitted on CREATE")
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CREATABLE), st.lists(operations, min_size=1, max_size=8))
def test_no_sequence_of_admitted_updates_reaches_what_create_denies(
    start: tuple[str, dict[str, Any], str], ops: list[tuple[Any, ...]]
) -> None:
    _, stored, tenant = start
    trail: list[str] = []
    for last in _admitted(stored, tenant, ops):
        stored, trail = last
    # Kueue resumes an admitted job (its own update above): the suspension is Kueue's state, so the
    # stored job is judged as CREATE stored it, suspended; a tenant's resume stays denied.
    stored = copy.deepcopy(stored)
    stored["spec"]["suspend"] = True
    final = decide(ORG, stored, user=tenant)
    assert final.allowed, f"after {trail}: {final.message}"
    assert not _outside_own_entry(final, stored), f"after {trail}: CREATE would change {final.patch}"


def _stored_anyhow() -> list[tuple[str, dict[str, Any], str]]:
    """(example, stored object, its creator) for every example TrainJob, admitted or not: a stored
    object may carry what the policy denies today (the policy tightened since its CREATE, a quota
    lowered, a rule once in ``warn``). mpigate's CREATE patch is applied where CREATE makes one."""
    out = []
    for path in sorted((EXAMPLES / "trainjobs").glob("*.yaml")):
        obj = read(path)
        decisions = [(user, decide(ORG, obj, user=user)) for user in TENANTS]
        user, decision = next(((u, d) for u, d in decisions if d.allowed), decisions[0])
        out.append((path.stem, apply_patch(obj, decision.patch) if decision.patch else obj, user))
    return out


STORED = _stored_anyhow()


def _denials(obj: Mapping[str, Any], user: str) -> set[tuple[str, str, str]]:
    return {(v.rule, v.path, v.message) for v in decide(ORG, obj, user=user).denying}


def _start(name: str) -> tuple[str, dict[str, Any], str]:
    return next(s for s in STORED if s[0] == name)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(STORED), st.lists(operations, min_size=1, max_size=6))
@example(_start("deny-foreign-registry"), [("image", "docker.io/evil/miner:1")])
@example(_start("deny-too-many-nodes"), [("num-nodes", 8)])
@example(_start("deny-lifecycle"), [("deadline", 10**7)])
def test_no_admitted_update_adds_what_create_denies(
    start: tuple[str, dict[str, Any], str], ops: list[tuple[Any, ...]]
) -> None:
    """Grandfathering as a property: from any stored object — also one today's policy denies (the
    policy tightened since its CREATE, a quota lowered) — no admitted UPDATE reaches an object whose
    CREATE is denied for anything (rule, path, message) the starting object's CREATE was not."""
    _, start_obj, tenant = start
    before = _denials(start_obj, tenant)
    for stored, trail in _admitted(start_obj, tenant, ops):
        added = _denials(stored, tenant) - before
        assert not added, f"after {trail}: CREATE now also denies {sorted(added)}"


def test_the_examples_give_the_property_something_to_chew_on() -> None:
    names = {name for name, _, _ in CREATABLE}
    assert {"minimal", "phi-pinned", "llm-finetune", "legacy-vendor-image"} <= names, names


def test_forged_own_entries_are_judged_as_a_tenants_patch(tmp_path: Path) -> None:
    """A tenant's entry under mpigate's manager name cannot smuggle a service account or a
    node selector past the rules that skip mpigate's own entry — on CREATE as received
    (judge) and on UPDATE (a second entry under the same name)."""
    from mpigate.policy import AdmissionInput, UserInfo, judge

    name, stored, tenant = next(c for c in CREATABLE if c[0] == "minimal")
    forged = copy.deepcopy(stored)
    entry = next(p for p in forged["spec"]["runtimePatches"] if p["manager"] == OWN)
    jobs = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    jobs[0]["template"]["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "topology.kubernetes.io/region", "operator": "Equal", "value": "us-east-1"}
    ]
    request = AdmissionInput(
        "CREATE", "TrainJob", "nlp-team", name, forged, user=UserInfo(tenant, ("nlp-team-scientists",))
    )
    decision = judge(ORG, request)
    assert not decision.allowed
    rules = {v.rule for v in decision.denying}
    assert {"MPG-LIFE-003", "MPG-RES-002"} <= rules, decision.message
    assert "was not written by mpigate" in decision.message
    # the untouched stored object is mpigate's own entry: trusted, admitted
    assert judge(
        ORG, AdmissionInput("CREATE", "TrainJob", "nlp-team", name, stored, user=request.user)
    ).allowed
    # a second entry under mpigate's name on UPDATE
    twice = copy.deepcopy(stored)
    twice["spec"]["suspend"] = True
    twice["spec"]["runtimePatches"].append(copy.deepcopy(PATCHES["forged-own"]))
    update = decide(ORG, twice, operation="UPDATE", old=stored, user=tenant)
    assert {"MPG-LIFE-003", "MPG-RES-002"} <= {v.rule for v in update.denying}, update.message
    assert json.dumps(stored)  # the stored object itself was never modified


def test_a_swapped_credential_is_a_new_finding_not_a_grandfathered_one() -> None:
    """The credential rule hides the value (it names only its length): two credentials of one
    length would read the same. Its hidden value (a digest) tells them apart on UPDATE."""
    _, stored, tenant = next(c for c in CREATABLE if c[0] == "minimal")
    old = copy.deepcopy(stored)
    old["spec"]["trainer"]["env"] = [{"name": "HF_TOKEN", "value": "hf_" + "a" * 34}]
    same = copy.deepcopy(old)
    same["spec"]["suspend"] = True  # a condition that predates the update does not block Kueue
    assert decide(ORG, same, operation="UPDATE", old=old, user=KUEUE).allowed
    swapped = copy.deepcopy(old)
    swapped["spec"]["trainer"]["env"] = [{"name": "HF_TOKEN", "value": "hf_" + "b" * 34}]
    decision = decide(ORG, swapped, operation="UPDATE", old=old, user=tenant)
    assert "MPG-SEC-SECRETS" in {v.rule for v in decision.denying}, decision.message
    assert "hf_" + "b" * 34 not in json.dumps(decision.to_dict())  # never shown


@pytest.mark.skipif(not CREATABLE, reason="no example TrainJob is admitted on CREATE")
def test_only_kueue_resumes_a_job_mpigate_created_suspended() -> None:
    """The suspension mpigate sets on CREATE (MPG-Q005) is Kueue's to lift on admission and to set
    again on preemption; a tenant who lifts it would start the job outside the queue."""
    _, stored, tenant = CREATABLE[0]
    assert stored["spec"]["suspend"] is True
    resumed = copy.deepcopy(stored)
    resumed["spec"]["suspend"] = False
    denied = decide(ORG, resumed, operation="UPDATE", old=stored, user=tenant)
    assert not denied.allowed
    assert [v.path for v in denied.violations if v.rule == "MPG-LIFE-003"] == ["spec.suspend"], denied.message
    assert decide(ORG, resumed, operation="UPDATE", old=stored, user=KUEUE).allowed
    assert decide(ORG, stored, operation="UPDATE", old=resumed, user=KUEUE).allowed  # preemption


@pytest.mark.skipif(not CREATABLE, reason="no example TrainJob is admitted on CREATE")
def test_the_kueue_controller_is_whom_the_config_names(tmp_path: Path) -> None:
    """A Kueue installed under another account (GPUFlavors.spec.kueue.controller): that account
    resumes and suspends, and the default one is a tenant like any other."""
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    flavors = tmp_path / "quotas" / "flavors.yaml"
    custom = "system:serviceaccount:queueing:kueue"
    flavors.write_text(flavors.read_text().replace("  kueue:\n", f"  kueue:\n    controller: {custom}\n", 1))
    org = load(tmp_path, revision="test", today=TODAY)
    assert org.kueue.controller == custom and ORG.kueue.controller == KUEUE
    _, stored, _ = CREATABLE[0]
    resumed = copy.deepcopy(stored)
    resumed["spec"]["suspend"] = False
    assert decide(org, resumed, operation="UPDATE", old=stored, user=custom).allowed
    assert decide(org, stored, operation="UPDATE", old=resumed, user=custom).allowed  # preemption
    denied = decide(org, resumed, operation="UPDATE", old=stored, user=KUEUE)
    assert [v.path for v in denied.violations if v.rule == "MPG-LIFE-003"] == ["spec.suspend"], denied.message

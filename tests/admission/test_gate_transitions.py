"""Issue 16's UPDATE, lookup and identity bypasses, reproduced through the real webhook over TLS:
the example org behind ``mpigate serve``'s server, requests as the API server sends them (CREATE
through /mutate, the JSONPatch applied, then /validate; UPDATE straight to /validate with the
stored object as ``oldObject``)."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import trustme
import yaml

from mpigate.admission.client import ReplayResult, ReviewClient, replay
from mpigate.admission.recorder import MemoryRecorder
from mpigate.admission.server import ServeOptions
from mpigate.policy import UserInfo
from tests.conftest import REPO, TODAY
from tests.policy.helpers import runtime_patch

from .conftest import ThreadedWebhook, write_cert

MARIA = UserInfo("maria@acme.example", ("nlp-team-scientists", "system:authenticated"))
LENA = UserInfo("lena@acme.example", ("system:authenticated",))  # nlp-team's team admin
KUEUE = UserInfo(
    "system:serviceaccount:kueue-system:kueue-controller-manager",
    ("system:serviceaccounts", "system:serviceaccounts:kueue-system", "system:authenticated"),
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReviewClient]:
    base = tmp_path_factory.mktemp("transitions")
    ca = trustme.CA()
    cert, key = write_cert(ca, base / "tls")
    ca.cert_pem.write_to_path(str(base / "ca.crt"))
    options = ServeOptions(
        config=REPO, tls_cert=cert, tls_key=key, host="127.0.0.1", port=0, reload_interval=3600
    )
    moment = dt.datetime.combine(TODAY, dt.time(12, 0), dt.UTC)
    server = ThreadedWebhook(options, recorder=MemoryRecorder(), clock=lambda: moment)
    c = ReviewClient(server.server.url, ca_file=str(base / "ca.crt"))
    yield c
    c.close()
    server.stop()


def example(name: str) -> dict[str, Any]:
    data = yaml.safe_load((REPO / "examples" / "trainjobs" / f"{name}.yaml").read_text())
    assert isinstance(data, dict)
    return data


def created(client: ReviewClient, obj: dict[str, Any], user: UserInfo = MARIA) -> dict[str, Any]:
    """``obj`` as stored after an admitted CREATE."""
    result = replay(client, obj, user=user)
    assert result.allowed, result.message
    assert result.patched is not None
    return result.patched


def update(
    client: ReviewClient, new: dict[str, Any], old: dict[str, Any], user: UserInfo = MARIA
) -> ReplayResult:
    result = replay(client, new, operation="UPDATE", old=old, user=user)
    assert not result.error, result.error
    return result


def denied_by(result: ReplayResult, rule: str, *fragments: str) -> None:
    assert not result.allowed, "expected a denial"
    assert f"[{rule}]" in result.message, result.message
    for fragment in fragments:
        assert fragment in result.message, result.message


def test_item_2_queue_label_removed_while_suspended_is_denied(client: ReviewClient) -> None:
    stored = created(client, example("minimal"))
    suspended = copy.deepcopy(stored)
    suspended["spec"]["suspend"] = True
    assert update(client, suspended, stored, KUEUE).allowed  # Kueue suspending a job is fine
    escaped = copy.deepcopy(suspended)
    del escaped["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    denied_by(
        update(client, escaped, suspended),
        "MPG-LIFE-003",
        'metadata.labels["kueue.x-k8s.io/queue-name"]',
        "removes",
    )
    # ... and resuming a job that somehow lost its queue label is refused too (whole object judged)
    resumed = copy.deepcopy(escaped)
    resumed["spec"]["suspend"] = False
    denied_by(update(client, resumed, escaped), "MPG-LIFE-003", "kueue.x-k8s.io/queue-name")


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("mpigate.io/data-classification", "public"),
        ("mpigate.io/cost-center", "cc-9999"),
        ("kueue.x-k8s.io/priority-class", "urgent"),
        ("kueue.x-k8s.io/queue-name", "nlp-team-interactive"),
        ("mpigate.io/team", "cv-team"),
    ],
)
def test_item_6_policy_labels_cannot_change_after_create(
    client: ReviewClient, label: str, value: str
) -> None:
    stored = created(client, example("phi-pinned"))
    changed = copy.deepcopy(stored)
    changed["metadata"]["labels"][label] = value
    denied_by(update(client, changed, stored), "MPG-LIFE-003", f'metadata.labels["{label}"]')
    removed = copy.deepcopy(stored)
    if label in removed["metadata"]["labels"]:
        del removed["metadata"]["labels"][label]
        denied_by(update(client, removed, stored), "MPG-LIFE-003", f'metadata.labels["{label}"]')


def test_the_config_names_who_may_move_a_suspended_job_between_the_teams_queues(
    client: ReviewClient,
) -> None:
    """policies/org.yaml lets nlp-team's team admin re-queue and re-prioritise (as Kueue allows
    on a suspended job); a data scientist may not, and nobody may take a job out of its queues."""
    stored = created(client, example("minimal"))
    stored["spec"]["suspend"] = True
    moved = copy.deepcopy(stored)
    moved["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    assert update(client, moved, stored, LENA).allowed
    denied_by(update(client, moved, stored, MARIA), "MPG-LIFE-003", "lena")
    gone = copy.deepcopy(stored)
    del gone["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert not update(client, gone, stored, LENA).allowed


def test_kueue_update_of_its_own_patch_and_suspend_is_allowed(client: ReviewClient) -> None:
    """What Kueue writes on UPDATE (pkg/controller/jobs/trainjob RunWithPodSetsInfo/Stop: spec.suspend
    and its `kueue.x-k8s.io/manager` runtime patch) is never refused."""
    stored = created(client, example("phi-pinned"))
    stored["spec"]["suspend"] = True
    admitted = copy.deepcopy(stored)
    admitted["spec"]["suspend"] = False
    admitted["spec"].setdefault("runtimePatches", []).append(
        runtime_patch(
            "kueue.x-k8s.io/manager",
            "node",
            {"nodeSelector": {"nvidia.com/gpu.product": "A100-SXM4-80GB"}},
            {"labels": {"kueue.x-k8s.io/podset": "node"}},
        )
    )
    assert update(client, admitted, stored, KUEUE).allowed


def with_service_account(obj: dict[str, Any], account: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["spec"]["runtimePatches"] = [
        runtime_patch("acme.example/pipeline", "launcher", {"serviceAccountName": account})
    ]
    return out


def test_item_7_service_accounts_follow_the_requesters_persona(client: ReviewClient) -> None:
    """maria (data-scientist) may not run a job as nlp-pipeline, the account TeamAccess binds to the
    mlops-engineer persona (secrets write); an mlops engineer and the pipeline itself may, and Kueue's
    later updates of that job are not refused for it."""
    job = with_service_account(example("minimal"), "nlp-pipeline")
    denied_by(
        replay(client, job, user=MARIA),
        "MPG-SA-001",
        "service account nlp-pipeline is bound to nlp-team's mlops-engineer persona",
        "maria@acme.example (data-scientist) may run jobs only as: none but default",
    )
    mlops = UserInfo("ravi@acme.example", ("nlp-team-mlops", "system:authenticated"))
    pipeline = UserInfo(
        "system:serviceaccount:nlp-team:nlp-pipeline",
        ("system:serviceaccounts", "system:serviceaccounts:nlp-team", "system:authenticated"),
    )
    assert replay(client, job, user=pipeline).allowed
    stored = created(client, job, mlops)
    suspended = copy.deepcopy(stored)
    suspended["spec"]["suspend"] = True
    assert update(client, suspended, stored, KUEUE).allowed
    # an account of another team is refused whoever asks
    denied_by(
        replay(client, with_service_account(example("minimal"), "cv-pipeline"), user=mlops),
        "MPG-SA-001",
        "cv-pipeline is not one of nlp-team's",
    )


def test_item_9_an_exception_does_not_follow_a_name_the_tenant_chooses(client: ReviewClient) -> None:
    """policies/exceptions/cv-team-legacy-image.yaml waives the image rules for legacy-* jobs that
    cv-team's mlops-engineer persona submits; a data scientist naming a job legacy-x gets nothing."""
    legacy = example("legacy-vendor-image")
    scientist = UserInfo("sam@acme.example", ("cv-team-scientists", "system:authenticated"))
    denied_by(replay(client, legacy, user=scientist), "MPG-IMG-001", "vendor.example.com")
    omar = UserInfo("omar@acme.example", ("system:authenticated",))
    result = replay(client, legacy, user=omar)
    assert result.allowed, result.message
    assert result.validate is not None
    assert result.validate["auditAnnotations"]["exceptions"] == "cv-team-legacy-image"


@pytest.mark.parametrize(
    ("image", "allowed", "fragment"),
    [
        ("python:3.12-slim", True, ""),  # docker.io/library is allowed upstream: pulled through the mirror
        ("docker.io/evil/miner:1", False, "pulled from docker.io"),
        (
            "registry.acme.internal/mirror/docker.io/evil/miner:1",
            False,
            "pulled from docker.io/evil/miner through the mirror registry.acme.internal",
        ),
        ("registry.acme.internal/mirror/ghcr.io/evil/x:1", False, "ghcr.io/evil/x through the mirror"),
    ],
)
def test_item_9_the_docker_hub_mirror_admits_only_what_is_allowed_upstream(
    client: ReviewClient, image: str, allowed: bool, fragment: str
) -> None:
    job = example("minimal")
    job["spec"]["trainer"]["image"] = image
    result = replay(client, job, user=MARIA)
    if allowed:
        assert result.allowed, result.message
        assert result.patched is not None
        assert result.patched["spec"]["trainer"]["image"] == (
            "registry.acme.internal/mirror/docker.io/library/python:3.12-slim"
        )
    else:
        denied_by(result, "MPG-IMG-001", fragment)


def test_item_9_managed_by_is_judged(client: ReviewClient) -> None:
    """A MultiKueue job is judged like any other (Kueue copies its spec to a worker cluster); a
    controller neither Trainer nor MultiKueue is refused, on CREATE and UPDATE."""
    job = example("minimal")
    job["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    assert replay(client, job, user=MARIA).allowed
    privileged = copy.deepcopy(job)
    privileged["spec"]["runtimePatches"] = [
        runtime_patch(
            "acme.example/pipeline",
            "launcher",
            {"containers": [{"name": "node", "securityContext": {"privileged": True}}]},
        )
    ]
    denied_by(replay(client, privileged, user=MARIA), "MPG-SEC-PRIVILEGED")
    other = example("minimal")
    other["spec"]["managedBy"] = "acme.example/runner"
    denied_by(replay(client, other, user=MARIA), "MPG-RT-001", "spec.managedBy: acme.example/runner")
    stored = created(client, example("minimal"))
    moved = copy.deepcopy(stored)
    moved["spec"]["managedBy"] = "acme.example/runner"
    denied_by(update(client, moved, stored), "MPG-RT-001", "spec.managedBy")


def test_item_5_resume_and_patch_in_one_request_is_judged_whole(client: ReviewClient) -> None:
    """Trainer lets runtimePatches change when the job is suspended before *or* after the update
    (Trainer: pkg/runtime/framework/plugins/jobset/jobset.go (*JobSet).checkRuntimePatchesImmutability),
    so a tenant can resume and patch in one request; the new object is judged whole. A changed
    runtimeRef (immutable in Trainer's CRD, which mpigate does not rely on) is judged against the
    new runtime, not grandfathered against the old one."""
    stored = created(client, example("minimal"))
    stored["spec"]["suspend"] = True
    resumed = copy.deepcopy(stored)
    resumed["spec"]["runtimePatches"].append(
        runtime_patch("acme.example/pipeline", "launcher", {"hostNetwork": True})
    )
    resumed["spec"]["suspend"] = False
    denied_by(update(client, resumed, stored), "MPG-SEC-HOSTNAMESPACES")
    data = created(client, example("phi-pinned"))
    switched = copy.deepcopy(data)
    switched["spec"]["runtimeRef"] = {"name": "mpi-openmpi-gpu"}
    result = update(client, switched, data)
    assert not result.allowed and "[MPG-RT-001]" in result.message, result.message


def test_update_grandfathers_only_the_identical_finding(client: ReviewClient) -> None:
    """A job admitted under cv-team's legacy-image exception (omar, mlops-engineer) keeps its vendor
    image through Kueue's updates; a data scientist of the team who swaps in another unapproved image
    at the same path is denied (grandfathering by rule and path admitted that). Likewise a credential
    a stored object already had is not a licence for another one of the same length."""
    omar = UserInfo("omar@acme.example", ("system:authenticated",))
    sam = UserInfo("sam@acme.example", ("cv-team-scientists", "system:authenticated"))
    stored = created(client, example("legacy-vendor-image"), omar)
    suspended = copy.deepcopy(stored)
    suspended["spec"]["suspend"] = True
    assert update(client, suspended, stored, KUEUE).allowed
    swapped = copy.deepcopy(suspended)
    swapped["spec"]["trainer"]["image"] = "docker.io/evil/miner:1"
    denied_by(update(client, swapped, suspended, sam), "MPG-IMG-001", "docker.io/evil/miner:1")
    # a stored object that predates the credential rule
    old = created(client, example("minimal"))
    old["spec"]["trainer"]["env"] = [{"name": "HF_TOKEN", "value": "hf_" + "a" * 34}]
    resumed = copy.deepcopy(old)
    resumed["spec"]["suspend"] = True
    assert update(client, resumed, old, KUEUE).allowed
    token = copy.deepcopy(old)
    token["spec"]["trainer"]["env"] = [{"name": "HF_TOKEN", "value": "hf_" + "b" * 34}]
    result = update(client, token, old)
    denied_by(result, "MPG-SEC-SECRETS", "HF_TOKEN")
    assert "hf_" + "b" * 34 not in result.message

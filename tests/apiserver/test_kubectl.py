"""Real kubectl (the oldest and newest on the machine) against the API server emulator, which sends
requests through the install base's webhook configurations to the real mpigate webhook: what a
data scientist sees in the terminal for the example jobs — allowed, mutated, denied with the fix,
warned — and that dry runs store nothing."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.admission.test_examples import expectation
from tests.conftest import REPO

from .cluster import Cluster
from .kubectl import Kubectl, no_server_dry_run, oldest_and_newest, run

KUBECTLS = oldest_and_newest()
pytestmark = pytest.mark.skipif(
    not KUBECTLS, reason="no kubectl found (make system-deps installs Debian's kubernetes-client)"
)
EXAMPLES = sorted((REPO / "examples" / "trainjobs").glob("*.yaml")) + sorted(
    (REPO / "examples" / "runtimes").glob("*.yaml")
)
# kubectl asks for server-side field validation (fieldValidation=Strict) from 1.25, where it went beta
# and on by default (KEP-2885); 1.20 sends none and the API server's default, Warn, applies.
STRICT_FIELD_VALIDATION_SINCE = (1, 25)
DENIED_PREFIX = (
    'Error from server (Forbidden): error when creating "{path}": '
    'admission webhook "{hook}" denied the request: '
)


@pytest.fixture(params=KUBECTLS, ids=lambda k: k.id)
def kubectl(request: pytest.FixtureRequest, cluster: Cluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    binary: Kubectl = request.param

    def call(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return run(binary, cluster.kubeconfig, tmp_path, *args, stdin=stdin)

    call.version = binary.version  # type: ignore[attr-defined]
    call.binary = binary  # type: ignore[attr-defined]
    return call


def renamed(path: Path, suffix: str) -> str:
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["name"] += f"-{suffix}"
    return yaml.safe_dump(obj)


def test_discovery_lists_the_trainer_resources(kubectl) -> None:  # type: ignore[no-untyped-def]
    result = kubectl("api-resources", "--api-group=trainer.kubeflow.org", "-o", "name")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "clustertrainingruntimes.trainer.kubeflow.org",
        "trainingruntimes.trainer.kubeflow.org",
        "trainjobs.trainer.kubeflow.org",
    ]


def _as_user(path: Path) -> list[str]:
    for line in path.read_text().splitlines():
        if line.startswith("# as:"):
            return ["--as", line.split(":", 1)[1].split()[0], "--as-group", "system:authenticated"]
    return []


def test_every_example_with_server_dry_run(kubectl, cluster: Cluster) -> None:  # type: ignore[no-untyped-def]
    """`kubectl create --dry-run=server -f` of each example: the verdict its `# expect:` header
    states, each denying rule in the API server's error, the webhook that denied it, and nothing
    stored."""
    why = no_server_dry_run(kubectl.binary)
    if why:
        pytest.skip(why)
    before = dict(cluster.api.storage)
    plain = [p for p in EXAMPLES if not _as_user(p) and "unknown-version" not in p.stem]
    args = [a for p in plain for a in ("-f", str(p.relative_to(REPO)))]
    bulk = subprocess.CompletedProcess([], 0, "", "")
    result = kubectl("create", "--dry-run=server", *args)
    bulk.stdout, bulk.stderr = result.stdout, result.stderr
    for path in [p for p in EXAMPLES if _as_user(p)]:
        one = kubectl("create", "--dry-run=server", "-f", str(path.relative_to(REPO)), *_as_user(path))
        bulk.stdout += one.stdout
        bulk.stderr += one.stderr
    errors = re.split(r"\n(?=Error from server|Warning: )", bulk.stderr)
    for path in [p for p in EXAMPLES if "unknown-version" not in p.stem]:
        obj = yaml.safe_load(path.read_text())
        expected = expectation(path)
        name, kind = obj["metadata"]["name"], obj["kind"].lower()
        created = f"{kind}.trainer.kubeflow.org/{name} created (server dry run)"
        denial = next((e for e in errors if f'"{path.relative_to(REPO)}"' in e), None)
        if expected.allowed:
            assert created in bulk.stdout.splitlines(), (path.name, denial)
            assert denial is None
        else:
            assert denial is not None and created not in bulk.stdout, path.name
            assert re.match(r'Error from server \(Forbidden\): error when creating "[^"]+": '
                            r'admission webhook "validate\.(team|unmanaged|cluster)\.mpigate\.io" '
                            r"denied the request: mpigate denied ",
                            denial), denial  # fmt: skip
            assert set(re.findall(r"^  \[(MPG-[A-Z0-9-]+)\]", denial, re.M)) == expected.denies, denial
    for warned in ("warn-latest-tag", "warn-slots-mismatch"):
        rule = next(iter(expectation(REPO / "examples" / "trainjobs" / f"{warned}.yaml").warns))
        assert re.search(rf"^Warning: \[{rule}\] ", bulk.stderr, re.M), bulk.stderr
    assert cluster.api.storage == before  # dry runs store nothing


def test_a_version_the_cluster_does_not_serve_never_reaches_the_server(kubectl) -> None:  # type: ignore[no-untyped-def]
    """deny-unknown-version.yaml asks for trainer.kubeflow.org/v1beta1, which the upstream CRD does
    not serve: kubectl refuses it from discovery (MPG-API-001 is for versions the cluster serves
    that this mpigate does not know)."""
    result = kubectl("create", "--dry-run=server", "-f", "examples/trainjobs/deny-unknown-version.yaml")
    assert result.returncode == 1
    assert 'no matches for kind "TrainJob" in version "trainer.kubeflow.org/v1beta1"' in result.stderr


def test_denied_with_the_fix_exactly_as_the_user_sees_it(kubectl) -> None:  # type: ignore[no-untyped-def]
    result = kubectl("create", "-f", "examples/trainjobs/deny-over-quota.yaml")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        DENIED_PREFIX.format(path="examples/trainjobs/deny-over-quota.yaml", hook="validate.team.mpigate.io")
        + "mpigate denied TrainJob nlp-team/llm-pretrain-huge:\n"
        "  [MPG-Q001] spec.trainer: asks 32 nvidia.com/gpu (4 nodes × 8 GPUs) but Kueue can admit at "
        "most 16 for nlp-team (a100-eu: nominal 16, no borrowing); it would never admit the job. Set "
        "spec.trainer.numNodes to 2 or fewer, or ask #nlp-admins to raise quotas/nlp-team.yaml.\n"
    )


def test_warned_job_is_created_and_the_warning_printed(kubectl, cluster: Cluster) -> None:  # type: ignore[no-untyped-def]
    suffix = "v" + "".join(map(str, kubectl.version))
    result = kubectl(
        "apply", "-f", "-", stdin=renamed(REPO / "examples" / "trainjobs" / "warn-latest-tag.yaml", suffix)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"trainjob.trainer.kubeflow.org/untagged-{suffix} created\n"
    assert result.stderr == (
        "Warning: [MPG-IMG-002] image registry.acme.internal/nlp/llm-train has no tag (which means :latest)\n"
    )
    assert cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", f"untagged-{suffix}") is not None


def test_mutated_job_update_patch_and_delete(kubectl, cluster: Cluster) -> None:  # type: ignore[no-untyped-def]
    """create → mpigate's mutations are what is stored and read back; apply of a changed label →
    UPDATE judged; a patch of the immutable trainer → the CRD's error; another team's queue →
    denied with the fix; suspend (a release) → allowed;
    delete → allowed; strict field validation of an unknown field → the API server's error."""
    suffix = "v" + "".join(map(str, kubectl.version))
    name = f"minimal-{suffix}"
    manifest = renamed(REPO / "examples" / "trainjobs" / "minimal.yaml", suffix)
    created = kubectl("apply", "-f", "-", stdin=manifest)
    assert (created.returncode, created.stdout, created.stderr) == (
        0,
        f"trainjob.trainer.kubeflow.org/{name} created\n",
        "",
    )
    got = kubectl("get", "trainjob", name, "-n", "nlp-team", "-o", "json")
    stored = json.loads(got.stdout)
    assert stored == cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", name)
    labels = stored["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "nlp-team"
    assert stored["spec"]["activeDeadlineSeconds"] == 86400
    assert "mpigate.io/admission" in [p["manager"] for p in stored["spec"]["runtimePatches"]]
    # kubectl apply with a changed label: a merge patch, an UPDATE through validate.team
    relabelled = yaml.safe_load(manifest)
    relabelled["metadata"]["labels"]["stage"] = "eval"
    applied = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(relabelled))
    assert (applied.returncode, applied.stdout) == (
        0,
        f"trainjob.trainer.kubeflow.org/{name} configured\n",
    ), applied.stderr
    # a patch of the immutable trainer: the CRD's CEL rule answers before any validating webhook
    patch = kubectl(
        "patch",
        "trainjob",
        name,
        "-n",
        "nlp-team",
        "--type=merge",
        "-p",
        '{"spec":{"trainer":{"numNodes":8}}}',
    )
    assert (patch.returncode, patch.stderr) == (
        1,
        f'The TrainJob "{name}" is invalid: spec.trainer: Invalid value: "object": field is immutable\n',
    )
    # another team's queue by a patch: an UPDATE mpigate denies, with the fix
    patch = kubectl("patch", "trainjob", name, "-n", "nlp-team", "--type=merge", "-p",
                    '{"metadata":{"labels":{"kueue.x-k8s.io/queue-name":"cv-team"}}}')  # fmt: skip
    assert patch.returncode == 1
    assert patch.stderr.startswith(
        f'Error from server (Forbidden): admission webhook "validate.team.mpigate.io" denied the request: '
        f"mpigate denied TrainJob nlp-team/{name}:\n  [MPG-Q005] "
    ), patch.stderr
    assert "Remove the label (mpigate sets nlp-team) or use one of: nlp-team." in patch.stderr
    # suspending releases resources: routed to validate.release (failurePolicy Ignore), allowed. The
    # job is stored suspended (mpigate's mutation) until Kueue admits it: Kueue's controller lifts
    # the suspension first (written to storage, as its own write would be), so the patch is a change.
    running = copy.deepcopy(cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", name))
    assert running is not None and running["spec"]["suspend"] is True
    running["spec"]["suspend"] = False
    cluster.api.put(running)
    seen = len(cluster.api.outcomes)
    suspend = kubectl(
        "patch", "trainjob", name, "-n", "nlp-team", "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    assert (suspend.returncode, suspend.stdout) == (0, f"trainjob.trainer.kubeflow.org/{name} patched\n"), (
        suspend.stderr
    )
    release = [o for o in cluster.api.outcomes[seen:] if ("validate.release.mpigate.io", 0) in o.called]
    assert release, "the suspend went around validate.release.mpigate.io"
    deleted = kubectl("delete", "trainjob", name, "-n", "nlp-team")
    assert (deleted.returncode, deleted.stdout) == (0, f'trainjob.trainer.kubeflow.org "{name}" deleted\n')
    assert cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", name) is None
    # an unknown field: kubectl asks for strict field validation, the API server refuses
    typo = yaml.safe_load(manifest)
    typo["spec"]["trainer"]["numNode"] = 2
    refused = kubectl("create", "-f", "-", stdin=yaml.safe_dump(typo))
    if kubectl.version < STRICT_FIELD_VALIDATION_SINCE:
        # an older kubectl does not ask (no fieldValidation): the API server's default, Warn, drops
        # the field and says so
        assert (refused.returncode, refused.stderr) == (0, 'Warning: unknown field "spec.trainer.numNode"\n')
        kept = cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", name)
        assert kept is not None and "numNode" not in kept["spec"]["trainer"]
        assert kubectl("delete", "trainjob", name, "-n", "nlp-team").returncode == 0
        return
    assert refused.returncode == 1
    assert refused.stderr == (
        'Error from server (BadRequest): error when creating "STDIN": '
        'TrainJob in version "v1alpha1" cannot be '
        'handled as a TrainJob: strict decoding error: unknown field "spec.trainer.numNode"\n'
    )


def test_server_side_apply(kubectl, cluster: Cluster) -> None:  # type: ignore[no-untyped-def]
    """`kubectl apply --server-side`: an apply patch of a missing object is a CREATE through the
    same webhooks (mutated on the way in); an over-quota one is denied with the fix."""
    suffix = "ssa" + "".join(map(str, kubectl.version))
    name = f"minimal-{suffix}"
    result = kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        stdin=renamed(REPO / "examples" / "trainjobs" / "minimal.yaml", suffix),
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"trainjob.trainer.kubeflow.org/{name} serverside-applied\n",
        "",
    )
    stored = cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", name)
    assert stored is not None and stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "nlp-team"
    denied = kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        stdin=renamed(REPO / "examples" / "trainjobs" / "deny-over-quota.yaml", suffix),
    )
    assert denied.returncode == 1
    assert denied.stderr.startswith(
        'Error from server (Forbidden): admission webhook "validate.team.mpigate.io" denied the request: '
        f"mpigate denied TrainJob nlp-team/llm-pretrain-huge-{suffix}:\n  [MPG-Q001] "
    ), denied.stderr
    assert "Set spec.trainer.numNodes to 2 or fewer" in denied.stderr

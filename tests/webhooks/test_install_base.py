"""webhooks/: the install base agrees with the server's routes, builds as kustomize would, and its
matchConditions exclude exactly the identities they should."""

from __future__ import annotations

import tomllib
from pathlib import Path

import cel
import pytest
import yaml

from mpigate.admission import routes
from mpigate.policy.kinds import UNDERSTOOD
from mpigate.render import read_objects
from tests.conftest import REPO

WEBHOOKS = REPO / "webhooks"
RELEASE_WEBHOOK = "validate.release.mpigate.io"
IDENTITY_CONDITIONS = ("not-a-node", "not-a-system-identity", "not-kube-system", "not-a-job-controller")


def _objects() -> list[dict]:
    return [o for _, o in read_objects(WEBHOOKS)]


def _one(kind: str, name: str) -> dict:
    found = [o for o in _objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def _kustomize_files(directory: Path) -> list[Path]:
    """Every resource file a kustomization pulls in (recursively through directories)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    files: list[Path] = []
    for entry in kustomization["resources"]:
        path = directory / entry
        assert path.exists(), f"{directory}/kustomization.yaml lists missing {entry}"
        files += _kustomize_files(path) if path.is_dir() else [path]
    return files


def test_kustomizations_include_every_manifest_once() -> None:
    included = _kustomize_files(WEBHOOKS)
    assert len(included) == len(set(included))
    manifests = {p for p in WEBHOOKS.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert set(included) == manifests
    base = {p.name for p in _kustomize_files(WEBHOOKS / "base")}
    assert "certificates.yaml" not in base  # base/ alone works without cert-manager


def _webhooks() -> list[tuple[str, dict]]:
    mutating = _one("MutatingWebhookConfiguration", "mpigate")
    validating = _one("ValidatingWebhookConfiguration", "mpigate")
    return [("mutate", w) for w in mutating["webhooks"]] + [("validate", w) for w in validating["webhooks"]]


def test_webhook_paths_operations_and_resources_match_the_server_routes() -> None:
    paths = {"mutate": routes.MUTATE_PATH, "validate": routes.VALIDATE_PATH}
    seen: dict[str, set[tuple[str, str, str, str]]] = {"mutate": set(), "validate": set()}
    for role, webhook in _webhooks():
        service = webhook["clientConfig"]["service"]
        assert service == {
            "namespace": "mpigate-system",
            "name": "mpigate-webhook",
            "path": paths[role],
            "port": 443,
        }
        for rule in webhook["rules"]:
            # the release entry takes only DELETE and (suspend) UPDATE: see the outage tests below
            release = webhook["name"] == RELEASE_WEBHOOK
            assert (
                set(rule["operations"]) <= set(routes.WEBHOOK_OPERATIONS[role])
                if release
                else (rule["operations"] == list(routes.WEBHOOK_OPERATIONS[role]))
            )
            for group in rule["apiGroups"]:
                for version in rule["apiVersions"]:
                    for resource in rule["resources"]:
                        seen[role].add((group, version, resource, rule["scope"]))
    # every version of every routed resource: a version the engine does not understand reaches it
    # and is denied (MPG-API-001) instead of passing unjudged
    routed = {(g, "*", r, "Namespaced" if namespaced else "Cluster") for g, r, _, namespaced in routes.ROUTED}
    assert seen["validate"] == routed
    assert seen["mutate"] == {
        ("trainer.kubeflow.org", "*", "trainjobs", "Namespaced"),
        ("kubeflow.org", "*", "mpijobs", "Namespaced"),
    }
    # what the engine understands is a subset of what is routed
    for g, _, r, kind, namespaced in routes.RESOURCES:
        assert (g, r, kind, namespaced) in routes.ROUTED


def _routed_versions(role: str, group: str, resource: str) -> set[str]:
    versions: set[str] = set()
    for each_role, webhook in _webhooks():
        if each_role != role:
            continue
        for rule in webhook["rules"]:
            if group in rule["apiGroups"] and resource in rule["resources"]:
                versions.update(rule["apiVersions"])
    return versions


@pytest.mark.upstream
def test_every_version_the_upstream_crds_serve_is_routed_and_understood(upstream: Path) -> None:
    """Nothing passes unjudged: each version Trainer's CRDs serve reaches both webhooks, and the
    engine understands it (so it is judged, not denied as unknown)."""
    crds = upstream / "trainer" / "crds"
    served: list[tuple[str, str, str, str]] = []
    for path in sorted(crds.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            names = doc["spec"]["names"]
            for version in doc["spec"]["versions"]:
                if version.get("served"):
                    served.append((doc["spec"]["group"], version["name"], names["plural"], names["kind"]))
    assert {p for _, _, p, _ in served} == {"trainjobs", "trainingruntimes", "clustertrainingruntimes"}
    for group, version, plural, kind in served:
        validate = _routed_versions("validate", group, plural)
        assert version in validate or "*" in validate, (plural, version)
        if plural == "trainjobs":
            mutate = _routed_versions("mutate", group, plural)
            assert version in mutate or "*" in mutate
        assert (f"{group}/{version}", kind) in UNDERSTOOD, (group, version, kind)


def test_mpijobs_are_routed_to_both_webhooks_in_team_and_other_namespaces() -> None:
    validating = {w["name"]: w for _, w in _webhooks()}
    for name in ("mutate.trainjobs.mpigate.io", "validate.team.mpigate.io", "validate.unmanaged.mpigate.io"):
        rules = validating[name]["rules"]
        assert any("kubeflow.org" in r["apiGroups"] and "mpijobs" in r["resources"] for r in rules), name


def test_webhook_settings() -> None:
    for role, webhook in _webhooks():
        assert webhook["sideEffects"] == "None"
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["failurePolicy"] == ("Ignore" if webhook["name"] == RELEASE_WEBHOOK else "Fail")
        assert webhook["timeoutSeconds"] > 2  # the server answers within its 2 s deadline
        if role == "mutate":
            assert webhook["reinvocationPolicy"] == "IfNeeded"
        namespaced = any(r["scope"] == "Namespaced" for r in webhook["rules"])
        selector = webhook.get("namespaceSelector", {}).get("matchExpressions", [])
        if namespaced:
            assert any(e["key"] in ("mpigate.io/team", "kubernetes.io/metadata.name") for e in selector), (
                webhook["name"]
            )
        else:
            assert selector == [], "namespaceSelector does not apply to cluster-scoped resources"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = _one(kind, "mpigate")["metadata"]["annotations"]
        certificate = _one("Certificate", "mpigate-webhook-tls")
        assert annotations["cert-manager.io/inject-ca-from"] == "mpigate-system/mpigate-webhook-tls"
        assert certificate["spec"]["secretName"] == "mpigate-webhook-tls"
        assert "mpigate-webhook.mpigate-system.svc" in certificate["spec"]["dnsNames"]


def test_service_and_statefulset_serve_the_routes_port_and_probes() -> None:
    service = _one("Service", "mpigate-webhook")
    webhook = _one("StatefulSet", "mpigate-webhook")
    pod = webhook["spec"]["template"]["spec"]
    container = pod["containers"][0]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    assert port_names["https"] == routes.DEFAULT_PORT
    args = container["args"]
    assert args[0] == "serve"
    assert args[args.index("--port") + 1] == str(routes.DEFAULT_PORT)
    assert args[args.index("--config") + 1] == "/etc/mpigate/config"
    assert args[args.index("--tls-cert") + 1] == "/etc/mpigate/tls/tls.crt"
    assert args[args.index("--tls-key") + 1] == "/etc/mpigate/tls/tls.key"
    assert args[args.index("--audit-dir") + 1] == "/var/lib/mpigate/audit"
    assert container["readinessProbe"]["httpGet"] == {
        "path": routes.READYZ_PATH,
        "port": "https",
        "scheme": "HTTPS",
    }
    assert container["livenessProbe"]["httpGet"] == {
        "path": routes.HEALTHZ_PATH,
        "port": "https",
        "scheme": "HTTPS",
    }
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert (
        mounts["config"] == "/etc/mpigate/config"
        and volumes["config"]["configMap"]["name"] == "mpigate-config"
    )
    assert (
        mounts["tls"] == "/etc/mpigate/tls"
        and volumes["tls"]["secret"]["secretName"] == "mpigate-webhook-tls"
    )
    assert mounts["audit-key"] == "/etc/mpigate/audit-key"
    assert mounts["audit"] == "/var/lib/mpigate/audit"
    assert webhook["spec"]["replicas"] == 3
    assert pod["affinity"]["podAntiAffinity"]
    assert _one("PodDisruptionBudget", "mpigate-webhook")["spec"]["minAvailable"] == 2
    controller = _one("StatefulSet", "mpigate-controller")
    assert controller["spec"]["replicas"] == 2
    # the controller's own arguments, RBAC and probes: tests/controller/test_install.py
    assert controller["spec"]["template"]["spec"]["containers"][0]["args"][:3] == [
        "controller",
        "--config",
        "/etc/mpigate/config",
    ]


@pytest.mark.parametrize(("name", "size"), [("mpigate-webhook", "10Gi"), ("mpigate-controller", "2Gi")])
def test_each_replica_keeps_its_audit_chain_on_its_own_volume(name: str, size: str) -> None:
    """Issue 23 item 2: the audit directory is a claim per replica (a StatefulSet's
    volumeClaimTemplate), never an emptyDir that dies with the pod; the claims outlive a scale-down
    or a deleted StatefulSet; the non-root user can write to them (fsGroup)."""
    workload = _one("StatefulSet", name)
    spec = workload["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    args = container["args"]
    assert mounts["audit"] == args[args.index("--audit-dir") + 1] == "/var/lib/mpigate/audit"
    assert "audit" not in {v["name"] for v in pod["volumes"]}  # a pod volume would shadow the claim
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "audit"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == size
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 65532
    # no pod volume is an emptyDir except the scratch /tmp
    assert [v["name"] for v in pod["volumes"] if "emptyDir" in v] == ["tmp"]
    assert not [o for o in _objects() if o["kind"] == "Deployment"]


def test_the_install_base_runs_the_image_make_image_builds() -> None:
    """One source of truth: the image name (pyproject's [tool.mpigate.image]) and the tag (the
    project's version) that `make image` builds are what every container and the kustomization name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    name, version = project["tool"]["mpigate"]["image"]["name"], project["project"]["version"]
    pods = [o["spec"]["template"]["spec"] for o in _objects() if o["kind"] == "StatefulSet"]
    containers = [c for pod in pods for c in pod.get("initContainers", []) + pod["containers"]]
    assert len(containers) == 2
    assert {c["image"] for c in containers} == {f"{name}:{version}"}
    kustomization = yaml.safe_load((WEBHOOKS / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["images"] == [{"name": name, "newTag": version}]


def test_pods_run_restricted() -> None:
    for name in ("mpigate-webhook", "mpigate-controller"):
        pod = _one("StatefulSet", name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"] == {"drop": ["ALL"]}
            assert ctx["readOnlyRootFilesystem"] is True
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    labels = _one("Namespace", "mpigate-system")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert "mpigate.io/team" not in labels


def _request(username: str, groups: list[str] | None) -> dict:
    user: dict = {"username": username}
    if groups is not None:
        user["groups"] = groups
    return {"userInfo": user, "operation": "CREATE", "namespace": "nlp-team"}


@pytest.mark.parametrize(
    ("username", "groups", "judged"),
    [
        ("maria@acme.example", ["nlp-team-scientists", "system:authenticated"], True),
        (
            "system:serviceaccount:nlp-team:nlp-pipeline",
            ["system:serviceaccounts", "system:authenticated"],
            True,
        ),
        ("system:serviceaccount:argocd:argocd-application-controller", ["system:serviceaccounts"], True),
        ("anonymous-groupless@acme.example", None, True),
        ("system:node:gpu-node-7", ["system:nodes", "system:authenticated"], False),
        ("system:kube-controller-manager", ["system:authenticated"], False),
        ("system:apiserver", ["system:masters"], False),
        ("system:serviceaccount:kube-system:generic-garbage-collector", ["system:serviceaccounts"], False),
        ("system:serviceaccount:kueue-system:kueue-controller-manager", ["system:serviceaccounts"], False),
        (
            "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager",
            ["system:serviceaccounts"],
            False,
        ),
        ("system:serviceaccount:mpigate-system:mpigate-controller", ["system:serviceaccounts"], False),
        ("someone", ["system:nodes"], False),
    ],
)
def test_match_conditions_exclude_system_identities_but_keep_pipelines(
    username: str, groups, judged: bool
) -> None:
    request = _request(username, groups)
    for _, webhook in _webhooks():
        conditions = [c for c in webhook["matchConditions"] if c["name"] in IDENTITY_CONDITIONS]
        assert [c["name"] for c in conditions] == list(IDENTITY_CONDITIONS), webhook["name"]
        results = [cel.evaluate(c["expression"], {"request": request}) for c in conditions]
        assert all(isinstance(r, bool) for r in results)
        assert all(results) is judged, (webhook["name"], username, results)


# ---------------------------------------------------------------------- outage scope (issue 18 item 8)

SYSTEM_NAMESPACES = (
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "mpigate-system",
    "kueue-system",
    "kubeflow-system",
)


def _selects(selector: dict | None, labels: dict[str, str]) -> bool:
    for expr in (selector or {}).get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values):
            return False
    return True


QUEUE = {"kueue.x-k8s.io/queue-name": "q"}
REQUEUED = {"kueue.x-k8s.io/queue-name": "other"}
PATCHED = [{"manager": "acme.example/debug"}]
RUNTIME = {"spec": {}}
CHANGED = {"spec": {"x": 1}}


def _job(suspend: bool | None = None, patches: list | None = None, labels: dict | None = None) -> dict:
    spec: dict = {"runtimeRef": {"name": "mpi-openmpi-gpu"}, "trainer": {"numNodes": 2}}
    if suspend is not None:
        spec["suspend"] = suspend
    if patches is not None:
        spec["runtimePatches"] = patches
    metadata = {"name": "llm", "namespace": "nlp-team", "labels": labels or QUEUE, "annotations": {"a": "1"}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": spec,
    }


def _validators_called(
    operation: str, resource: str, old: dict | None, new: dict | None, namespace_labels: dict[str, str]
) -> list[dict]:
    """The validating webhooks the API server calls for a request by a data scientist."""
    request = {
        "operation": operation,
        "userInfo": {"username": "maria", "groups": ["nlp-team-scientists", "system:authenticated"]},
        "resource": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "resource": resource},
    }
    called = []
    for role, webhook in _webhooks():
        if role != "validate":
            continue
        rules = [r for r in webhook["rules"] if operation in r["operations"] and resource in r["resources"]]
        if not rules:
            continue
        cluster = all(r["scope"] == "Cluster" for r in rules)
        if not cluster and not _selects(webhook.get("namespaceSelector"), namespace_labels):
            continue
        variables = {"request": request, "object": new, "oldObject": old}
        if all(cel.evaluate(c["expression"], variables) is True for c in webhook["matchConditions"]):
            called.append(webhook)
    return called


TEAM_NS = {"mpigate.io/team": "nlp-team", "kubernetes.io/metadata.name": "nlp-team"}
OTHER_NS = {"kubernetes.io/metadata.name": "scratch"}


@pytest.mark.parametrize(
    ("case", "operation", "resource", "old", "new", "namespace", "blocks"),
    [
        ("create", "CREATE", "trainjobs", None, _job(), TEAM_NS, True),
        ("create outside teams", "CREATE", "trainjobs", None, _job(), OTHER_NS, True),
        ("re-queue", "UPDATE", "trainjobs", _job(), _job(labels=REQUEUED), TEAM_NS, True),
        ("resume", "UPDATE", "trainjobs", _job(suspend=True), _job(suspend=False), TEAM_NS, True),
        ("patch while suspended", "UPDATE", "trainjobs", _job(True), _job(True, PATCHED), TEAM_NS, True),
        ("suspend and patch", "UPDATE", "trainjobs", _job(False), _job(True, PATCHED), TEAM_NS, True),
        ("suspend and re-queue", "UPDATE", "trainjobs", _job(), _job(True, labels=REQUEUED), TEAM_NS, True),
        ("runtime update", "UPDATE", "trainingruntimes", RUNTIME, CHANGED, TEAM_NS, True),
        ("cluster runtime update", "UPDATE", "clustertrainingruntimes", RUNTIME, CHANGED, {}, True),
        ("suspend", "UPDATE", "trainjobs", _job(suspend=False), _job(suspend=True), TEAM_NS, False),
        ("suspend (field unset before)", "UPDATE", "trainjobs", _job(), _job(suspend=True), TEAM_NS, False),
        ("suspend outside teams", "UPDATE", "trainjobs", _job(), _job(suspend=True), OTHER_NS, False),
        ("delete", "DELETE", "trainjobs", _job(), None, TEAM_NS, False),
        ("delete outside teams", "DELETE", "trainjobs", _job(), None, OTHER_NS, False),
        ("delete runtime", "DELETE", "trainingruntimes", RUNTIME, None, TEAM_NS, False),
        ("delete cluster runtime", "DELETE", "clustertrainingruntimes", RUNTIME, None, {}, False),
        ("create mpijob", "CREATE", "mpijobs", None, RUNTIME, TEAM_NS, True),
        ("delete mpijob", "DELETE", "mpijobs", RUNTIME, None, OTHER_NS, False),
    ],
)  # fmt: skip
def test_an_outage_blocks_only_what_mpigate_judges(
    case: str,
    operation: str,
    resource: str,
    old: dict | None,
    new: dict | None,
    namespace: dict,
    blocks: bool,
) -> None:
    """While the webhook is down, a request is refused only if a failurePolicy: Fail webhook is
    called for it. DELETE and an UPDATE that only suspends a TrainJob release resources and are never
    denied, so they fail open — and are still recorded (by a fail-open webhook) while it is up."""
    called = _validators_called(operation, resource, old, new, namespace)
    assert len(called) == 1, f"{case}: recorded by {[w['name'] for w in called]}"
    assert called[0]["failurePolicy"] == ("Fail" if blocks else "Ignore"), (case, called[0]["name"])


def test_the_fail_closed_webhooks_exclude_exactly_what_the_release_webhook_takes() -> None:
    validating = _one("ValidatingWebhookConfiguration", "mpigate")["webhooks"]
    [release] = [w for w in validating if w["name"] == RELEASE_WEBHOOK]
    takes = next(c["expression"] for c in release["matchConditions"] if c["name"] == "a-release")
    for webhook in validating:
        if webhook is not release:
            leaves = next(c["expression"] for c in webhook["matchConditions"] if c["name"] == "not-a-release")
            assert leaves == f"!({takes})", webhook["name"]

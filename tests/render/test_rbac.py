"""The rendered RBAC, evaluated like the Kubernetes authorizer, against a written expectation table."""

from __future__ import annotations

import pytest
import yaml

from mpigate.render import Rendering, read_objects
from tests.conftest import FIXTURES, REPO

from .rbac_eval import Authorizer, Identity

RBAC = FIXTURES / "render" / "rbac"
EXPECTATIONS = yaml.safe_load((RBAC / "expectations.yaml").read_text(encoding="utf-8"))


def _identity(spec: dict) -> Identity:
    if "serviceAccount" in spec:
        namespace, name = spec["serviceAccount"].split("/")
        return Identity.service_account(namespace, name)
    return Identity(spec["user"], tuple(spec.get("groups", ())))


@pytest.fixture(scope="module")
def authorizer(example_rendering: Rendering) -> Authorizer:
    objects = [o.data for o in example_rendering.objects]
    objects += [o for _, o in read_objects(REPO / "webhooks")]
    objects += list(yaml.safe_load_all((RBAC / "kueue-roles.yaml").read_text(encoding="utf-8")))
    return Authorizer(objects)


def _split(resource: str) -> tuple[str, str]:
    name, _, group = resource.partition(".")
    return name, group


@pytest.mark.parametrize(
    ("who", "verb", "resource", "namespace", "expected"),
    EXPECTATIONS["cases"],
    ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3] or 'cluster'}" for c in EXPECTATIONS["cases"]],
)
def test_expectation(
    authorizer: Authorizer, who: str, verb: str, resource: str, namespace: str | None, expected: bool
) -> None:
    name, group = _split(resource)
    identity = _identity(EXPECTATIONS["identities"][who])
    assert authorizer.allowed(identity, verb, group, name, namespace) is expected


def test_every_binding_refers_to_a_rendered_role(authorizer: Authorizer) -> None:
    assert authorizer.unresolved_role_refs() == []


def test_no_persona_can_touch_another_teams_namespaces(
    example_rendering: Rendering, authorizer: Authorizer
) -> None:
    """Exhaustively: every member of every team, every persona verb, every other team's namespace."""
    from mpigate.config import load
    from tests.conftest import TODAY

    config = load(REPO, today=TODAY)
    verbs = ("get", "list", "create", "update", "patch", "delete")
    resources = [
        ("trainjobs", "trainer.kubeflow.org"),
        ("pods", ""),
        ("pods/log", ""),
        ("serviceaccounts", ""),
        ("secrets", ""),
        ("localqueues", "kueue.x-k8s.io"),
        ("configmaps", ""),
    ]
    checked = 0
    for team, access in config.access.items():
        identities = []
        for members in access.members.values():
            identities += [Identity(u) for u in members.users]
            identities += [Identity("someone", (g,)) for g in members.groups]
            identities += [
                Identity.service_account(ns, sa)
                for ns in config.teams[team].namespaces
                for sa in members.service_accounts
            ]
        foreign = [ns for other, t in config.teams.items() if other != team for ns in t.namespaces] + [
            "mpigate-system",
            "default",
        ]
        for identity in identities:
            for namespace in foreign:
                for verb in verbs:
                    for resource, group in resources:
                        checked += 1
                        assert not authorizer.allowed(identity, verb, group, resource, namespace), (
                            identity,
                            verb,
                            resource,
                            namespace,
                        )
            for verb in verbs:
                assert not authorizer.allowed(identity, verb, "kueue.x-k8s.io", "clusterqueues", None)
    assert checked > 1000

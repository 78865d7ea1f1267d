"""What a rendered tree must carry for the gate's guarantees to hold (docs/security.md, "What the gate
relies on"), checked by ``mpigate check``: every team namespace carries

- ``mpigate.io/team``, the label the webhook configurations select team namespaces by (without it a
  namespace's TrainJobs and MPIJobs are neither mutated nor judged with the team's rules); and
- the Pod Security labels, so that the API server itself enforces, at pod creation, the level
  mpigate judged the effective pods at: the backstop for pods that reach the cluster some other
  way. ``enforce`` may sit below the org's level where mpigate itself admits such pods (a PSS rule
  in ``warn``/``audit``, an active exception; render/context.py ``pod_security_levels``): that is
  said too, since the backstop is weaker there.

An organisation's own templates (``templates/team/namespaces.yaml.j2``) can change what is
rendered; these checks read the rendered objects, not the built-in template.
"""

from __future__ import annotations

from typing import Any

from mpigate.config import Config, Problem, Severity

from .context import PSS_LEVELS
from .renderer import Rendering

__all__ = ["PSA_ENFORCE", "SELECTOR_LABEL", "backstop_problems"]

SELECTOR_LABEL = "mpigate.io/team"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
_RELAXED = "mpigate.io/pod-security-relaxed"


def backstop_problems(config: Config, rendering: Rendering) -> list[Problem]:
    """Warnings for team namespaces whose rendered object lacks what the gate relies on (located at
    the team's TeamQuota, which lists the namespace)."""
    namespaces: dict[str, dict[str, Any]] = {}
    for obj in rendering.objects:
        meta = obj.data.get("metadata")
        if (
            obj.data.get("kind") == "Namespace"
            and isinstance(meta, dict)
            and isinstance(meta.get("name"), str)
        ):
            namespaces[meta["name"]] = meta
    problems: list[Problem] = []
    for team in sorted(config.teams.values(), key=lambda t: t.name):
        for name in team.namespaces:
            for message, code, hint in _namespace_findings(config, team.name, name, namespaces.get(name)):
                problems.append(
                    Problem(team.source, "spec.namespaces", message, code, Severity.WARNING, hint)
                )
    return problems


def _namespace_findings(
    config: Config, team: str, name: str, meta: dict[str, Any] | None
) -> list[tuple[str, str, str]]:
    """(message, code, hint) of what the rendered Namespace ``name`` of ``team`` lacks."""
    template = "templates/team/namespaces.yaml.j2"
    if meta is None:
        return [
            (
                f"mpigate render writes no Namespace {name}: it must still carry {SELECTOR_LABEL}={team} "
                "(the webhooks select team namespaces by it) and the Pod Security labels (the API "
                "server's backstop)",
                "reliance.namespace-not-rendered",
                f"label the namespace where it is managed, or render it ({template})",
            )
        ]
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    assert isinstance(labels, dict) and isinstance(annotations, dict)
    found: list[tuple[str, str, str]] = []
    if labels.get(SELECTOR_LABEL) != team:
        found.append(
            (
                f"the rendered Namespace {name} does not carry {SELECTOR_LABEL}={team}: the webhooks select "
                "team namespaces by it, so its jobs would get neither the team's mutation nor its rules",
                "reliance.webhook-selector",
                f"keep the label in {template}",
            )
        )
    enforce = labels.get(PSA_ENFORCE)
    org_level = config.org.security.level
    if enforce not in PSS_LEVELS:
        found.append(
            (
                f"the rendered Namespace {name} has no valid {PSA_ENFORCE} label: the API server does "
                "not enforce Pod Security there, so pods that reach it around mpigate are not held back",
                "reliance.pod-security",
                f"keep the Pod Security labels in {template}",
            )
        )
    elif PSS_LEVELS.index(str(enforce)) < PSS_LEVELS.index(org_level):
        why = annotations.get(_RELAXED) or "the template"
        found.append(
            (
                f"Pod Security enforce is {enforce} in {name}, below the org's {org_level} (relaxed by "
                f"{why}): there the API server backs mpigate up only at {enforce}",
                "reliance.pod-security-relaxed",
                "end the exception or enforce the rule to restore the backstop",
            )
        )
    return found

"""`mpigate check` warns when the rendered tree lacks what the gate relies on (docs/security.md):
the webhooks' namespace label and the Pod Security labels on every team namespace."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.config import load
from mpigate.render import render
from mpigate.render.backstop import backstop_problems
from tests.conftest import REPO, TODAY


def example_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "org"
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, tree / folder)
    return tree


def test_the_example_org_renders_every_team_namespace_with_the_labels_the_gate_relies_on() -> None:
    config = load(REPO, today=TODAY)
    assert backstop_problems(config, render(config, today=TODAY)) == []


def test_a_namespace_template_that_drops_the_labels_is_reported_by_check(tmp_path: Path) -> None:
    tree = example_tree(tmp_path)
    template = tree / "templates" / "team" / "namespaces.yaml.j2"
    template.parent.mkdir(parents=True)
    template.write_text(
        "{% for ns in team.namespaces %}\n---\napiVersion: v1\nkind: Namespace\n"
        "metadata:\n  name: {{ ns.name | to_json }}\n{% endfor %}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(cli, ["check", str(tree)])
    assert result.exit_code == 0, result.output  # warnings; --strict fails
    # render itself puts mpigate.io/team on every team object, so only the Pod Security labels can go
    for namespace in ("nlp-team", "cv-team", "research"):
        assert (
            f"warning: spec.namespaces: the rendered Namespace {namespace} has no valid "
            "pod-security.kubernetes.io/enforce label" in result.output
        )
    assert "quotas/nlp-team.yaml:" in result.output
    strict = CliRunner().invoke(cli, ["check", str(tree), "--strict", "-o", "json"])
    assert strict.exit_code == 1
    assert '"code": "reliance.pod-security"' in strict.output


def test_a_relaxed_backstop_says_what_relaxed_it(tmp_path: Path) -> None:
    tree = example_tree(tmp_path)
    org = tree / "policies" / "org.yaml"
    text = org.read_text(encoding="utf-8")
    assert "    overrides:\n" in text
    org.write_text(
        text.replace("    overrides:\n", "    overrides:\n      MPG-SEC-RUNASNONROOT: warn\n"), "utf-8"
    )
    config = load(tree, today=TODAY)
    found = backstop_problems(config, render(config, today=TODAY))
    assert found and all(p.code == "reliance.pod-security-relaxed" for p in found)
    assert "Pod Security enforce is baseline in nlp-team, below the org's restricted (relaxed by " in (
        next(p.message for p in found if " nlp-team," in p.message)
    )
    assert "MPG-SEC-RUNASNONROOT" in found[0].message


def test_a_namespace_without_the_webhooks_label_is_reported() -> None:
    config = load(REPO, today=TODAY)
    rendering = render(config, today=TODAY)
    stripped = [
        dataclasses.replace(o, data={**o.data, "metadata": {"name": o.data["metadata"]["name"]}})
        if o.data["kind"] == "Namespace"
        else o
        for o in rendering.objects
        if not (o.data["kind"] == "Namespace" and o.data["metadata"]["name"] == "cv-team")
    ]
    found = backstop_problems(config, dataclasses.replace(rendering, objects=tuple(stripped)))
    codes = {(p.code, p.location.file) for p in found}
    assert ("reliance.namespace-not-rendered", "quotas/cv-team.yaml") in codes
    assert ("reliance.webhook-selector", "quotas/nlp-team.yaml") in codes
    assert ("reliance.pod-security", "quotas/nlp-team.yaml") in codes

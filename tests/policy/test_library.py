"""The rule library (src/mpigate/catalogue/library/): every rule is a valid CustomRule, enabled from
the OrgPolicy with parameters, and passes its PolicyTest suite (tests/policy/library/<name>.yaml)
on a copy of the example org with every library rule enabled (tests/policy/library/rules.yaml)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from mpigate.catalogue import library_rules
from mpigate.config import Config, check_tree, load
from mpigate.policytest import run_suites
from tests.conftest import TODAY
from tests.policy.helpers import decide, org_tree, runtime_patch, smoke_job

SUITES = Path(__file__).parent / "library"
NAMES = sorted(library_rules())


def org_with_library(root: Path, entries: list[object]) -> Path:
    """A copy of the example org (without its tests) at ``root`` whose OrgPolicy enables ``entries``."""
    org_file = org_tree(root) / "policies" / "org.yaml"
    org = yaml.safe_load(org_file.read_text(encoding="utf-8"))
    org["spec"].setdefault("rules", {})["library"] = entries
    org_file.write_text(yaml.safe_dump(org, sort_keys=False), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    entries = yaml.safe_load((SUITES / "rules.yaml").read_text(encoding="utf-8"))
    root = org_with_library(tmp_path_factory.mktemp("library") / "org", entries)
    (root / "policies" / "tests").mkdir()
    for name in NAMES:
        shutil.copy(SUITES / f"{name}.yaml", root / "policies" / "tests" / f"{name}.yaml")
    result = check_tree(root, today=TODAY)
    assert result.ok, result.errors
    return load(root, today=TODAY)


def test_every_library_rule_is_enabled_by_the_suites_org() -> None:
    entries = yaml.safe_load((SUITES / "rules.yaml").read_text(encoding="utf-8"))
    assert sorted(e["name"] for e in entries) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_library_rule_passes_its_suite(config: Config, name: str) -> None:
    suites = [s for s in config.tests if s.name == f"library-{name}"]
    assert len(suites) == 1, f"tests/policy/library/{name}.yaml: one PolicyTest named library-{name}"
    (result,) = run_suites(config, suites)
    failed = {case.name: (case.differences, case.error) for case in result.cases if not case.passed}
    assert not failed
    assert len(result.cases) >= 2


@pytest.mark.parametrize("name", NAMES)
def test_each_suite_shows_the_rule_firing_and_not_firing(name: str) -> None:
    suite = yaml.safe_load((SUITES / f"{name}.yaml").read_text(encoding="utf-8"))
    expects = [case["expect"] for case in suite["spec"]["cases"]]
    rule = library_rules()[name].id
    assert any(rule in e.get("includes", []) + e.get("warnings", []) for e in expects)
    assert any(rule in e.get("excludes", []) for e in expects)


def _problems(tmp_path: Path, entries: list[object]) -> list[str]:
    result = check_tree(org_with_library(tmp_path / "org", entries), today=TODAY)
    return [f"{p.path}: {p.message}" for p in result.errors]


def test_check_refuses_unknown_rules_params_teams_and_controls(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        [
            {"name": "allowed-capabilitie"},
            {"name": "host-ports", "params": {"min": "40000", "maxx": 1}},
            {"name": "sysctls", "teamParams": {"no-such-team": {}}, "controls": ["CC9.9"]},
            {"name": "sysctls"},
            {"name": "required-labels", "match": {"replicatedJobs": ["node"]}},
        ],
    )
    assert any("library[0].name: no library rule 'allowed-capabilitie'" in p for p in problems), problems
    assert any("library[1].params.min" in p and "is not of type 'integer'" in p for p in problems), problems
    assert any("library[1].params" in p and "maxx" in p for p in problems), problems
    assert any("library[2].teamParams.no-such-team: no team" in p for p in problems), problems
    assert any("library[2].controls[0]: no control 'CC9.9'" in p for p in problems), problems
    assert any("library[3].name: library rule sysctls is enabled twice" in p for p in problems), problems
    assert any("library[4].match.replicatedJobs" in p for p in problems), problems


def test_an_enabled_rule_is_a_rule_like_the_catalogues(tmp_path: Path) -> None:
    """Overrides and exceptions name it; its controls are the rule's and the entry's; it is judged
    only when enabled."""
    root = org_with_library(
        tmp_path / "org", [{"name": "host-ports", "action": "enforce", "controls": ["CC7.2"]}]
    )
    org_file = root / "policies" / "org.yaml"
    org = yaml.safe_load(org_file.read_text(encoding="utf-8"))
    org["spec"]["enforcement"]["overrides"] = {"MPG-LIB": "warn"}
    org_file.write_text(yaml.safe_dump(org, sort_keys=False), encoding="utf-8")
    result = check_tree(root, today=TODAY)
    assert result.ok, result.errors
    config = load(root, today=TODAY)
    (rule,) = [r for r in config.custom_rules if r.id == "MPG-LIB-HOSTPORTS"]
    assert rule.controls == ("CC6.6", "CC6.8", "1.3.1", "CC7.2")
    job = smoke_job(runtime_patch("acme.example/t", "node", {"hostNetwork": True}))
    decision = decide(config, job)
    modes = {v.mode for v in decision.violations if v.rule == "MPG-LIB-HOSTPORTS"}
    assert modes == {"warn"}
    unenabled = load(org_with_library(tmp_path / "plain", []), today=TODAY)
    assert not any(v.rule.startswith("MPG-LIB-") for v in decide(unenabled, job).violations)

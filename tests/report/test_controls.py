"""The control catalogues agree with the rule catalogue, and each control is well formed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpigate.catalogue import all_rules
from mpigate.report import RECORD_KINDS, all_frameworks, framework, parse_frameworks

# The controls the catalogues must carry (issue 6).
REQUIRED = {
    "soc2": {"CC6.1", "CC6.3", "CC6.6", "CC6.8", "CC7.2", "CC8.1", "A1.1", "C1.1", "CC2.1"},
    "hipaa": {"164.308(a)(4)", "164.312(a)(1)", "164.312(a)(2)(iv)", "164.312(b)", "164.312(e)(1)"},
    "gdpr": {"Art5", "Art30", "Art32", "Art44"},
    "pci": {"1.3.1", "2.2.1", "6.3.2", "7.2.1", "7.2.2", "8.6.2", "10.2.1"},
}


def catalogued() -> dict[str, str]:
    return {c.full_id: f.name for f in all_frameworks().values() for c in f.controls}


def test_every_control_id_in_rules_yaml_is_catalogued() -> None:
    used = {control: rule.id for rule in all_rules().values() for control in rule.controls}
    missing = sorted(set(used) - set(catalogued()))
    assert missing == [], f"rules.yaml uses controls no catalogue defines: {missing}"


def test_every_catalogued_control_is_used_by_a_rule() -> None:
    used = {control for rule in all_rules().values() for control in rule.controls}
    unused = sorted(set(catalogued()) - used)
    assert unused == [], f"catalogued controls no rule evidences: {unused}"


def test_control_rules_come_from_the_rule_catalogue() -> None:
    for fw in all_frameworks().values():
        for control in fw.controls:
            expected = tuple(r.id for r in all_rules().values() if control.full_id in r.controls)
            assert control.rules == expected
            assert control.rules, control.full_id


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_required_controls_are_present_and_complete(name: str) -> None:
    fw = framework(name)
    ids = {c.id for c in fw.controls}
    assert REQUIRED[name] <= ids
    for control in fw.controls:
        assert control.full_id == fw.prefix + control.id
        assert control.title and len(control.description) > 40, control.full_id
        assert control.gaps, f"{control.full_id} must say what its evidence does not cover"
        assert control.records and set(control.records) <= set(RECORD_KINDS), control.full_id
        assert "validate" in control.records, control.full_id
        assert not re.search(r"\s{2,}", control.description)
    assert len(ids) == len(fw.controls), "duplicate control id"


def test_parse_frameworks_accepts_lists_aliases_and_all() -> None:
    assert parse_frameworks(["pci,soc2"]) == ("soc2", "pci")
    assert parse_frameworks(["PCI-DSS", "gdpr"]) == ("gdpr", "pci")
    assert parse_frameworks(["all"]) == ("soc2", "hipaa", "gdpr", "pci")
    assert framework("pci-dss").name == "pci"
    with pytest.raises(
        ValueError, match=r"unknown framework 'iso27001' \(known: soc2, hipaa, gdpr, pci, all\)"
    ):
        parse_frameworks(["soc2,iso27001"])


def test_docs_list_every_control_and_csv_column(repo: Path) -> None:
    from mpigate.report import CSV_COLUMNS

    text = (repo / "docs" / "compliance.md").read_text(encoding="utf-8")
    for fw in all_frameworks().values():
        for control in fw.controls:
            assert f"| {control.id} | {control.title} |" in text, control.full_id
    assert ", ".join(CSV_COLUMNS) in " ".join(text.split())
    for kind in RECORD_KINDS:
        assert f"| `{kind}` |" in text, kind


def test_status_of_a_control_from_counts() -> None:
    from mpigate.report import EvidenceFacts, assess_control

    control = framework("soc2").controls[[c.id for c in framework("soc2").controls].index("C1.1")]
    rules = all_rules()

    def facts(**changes: object) -> EvidenceFacts:
        base: dict[str, object] = {
            "validate_by_kind": {"TrainJob": 4, "TrainingRuntime": 9},
            "effects": {("MPG-RES-002", "denied"): 2},
            "advisory": frozenset({"MPG-Q004"}),
            "expired": {},
            "counts": {"evidence": 3},
            "broken": [],
            "unverified_signatures": [],
            "outside": 0,
            "unjudged": 0,
            "k8s_given": False,
        }
        base.update(changes)
        return EvidenceFacts(**base)  # type: ignore[arg-type]

    met = assess_control(control, facts(), rules)
    # the residency rules judge TrainJobs only: runtimes are no evidence for C1.1
    assert met["evidence"] == {"validate": 4, "evidence": 3}
    assert (met["status"], met["reasons"], met["violations"]["denied"]) == ("met", [], 2)
    outside = assess_control(control, facts(outside=2), rules)
    assert outside["reasons"] == ["2 pod placement(s) outside the team's region"]
    audited = assess_control(control, facts(effects={("MPG-RES-001", "audited"): 3}), rules)
    assert audited["reasons"] == [
        "violations admitted without enforcement (warn/audit mode): MPG-RES-001 (3)"
    ]
    empty = assess_control(control, facts(validate_by_kind={}, counts={}, broken=["c"]), rules)
    assert (empty["status"], empty["evidenceTotal"], empty["reasons"]) == ("no evidence", 0, [])

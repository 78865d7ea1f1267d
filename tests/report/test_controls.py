"""The control catalogues agree with the rule catalogue, and each control is well formed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpigate.catalogue import all_rules
from mpigate.report import RECORD_KINDS, all_frameworks, framework, parse_frameworks

# The controls the catalogues must carry (issue 6, reviewed in issue 19).
REQUIRED = {
    "soc2": {"CC6.1", "CC6.3", "CC6.6", "CC6.8", "CC7.2", "CC8.1", "A1.1", "C1.1", "CC2.1"},
    "hipaa": {
        "164.308(a)(1)(ii)(D)",
        "164.308(a)(4)",
        "164.308(a)(5)(ii)(D)",
        "164.312(a)(1)",
        "164.312(a)(2)(i)",
        "164.312(b)",
        "164.312(d)",
        "164.312(e)(1)",
        "164.316(b)(2)",
    },
    "gdpr": {"Art5(2)", "Art32", "Art44"},
    "pci": {
        "1.3.1",
        "2.2.1",
        "6.3.2",
        "7.2.1",
        "7.2.2",
        "7.2.5",
        "8.6.2",
        "10.2.1",
        "10.2.2",
        "10.3.2",
        "10.3.4",
        "10.7.2",
    },
}
# Mappings issue 19 found wrong: a control must not rest on these rules.
WRONG = {
    "HIPAA-164.312(a)(1)": {"MPG-RES-001", "MPG-RES-003"},
    "SOC2-CC6.1": {"MPG-Q001", "MPG-Q005", "MPG-Q006"},
    "SOC2-CC6.6": {"MPG-SEC-HOSTNAMESPACES", "MPG-SEC-HOSTPROBESANDHOSTLIFECYCLE"},
    "SOC2-CC8.1": {"MPG-LIFE-003", "MPG-IMG-001"},
    "PCI-DSS-7.2.2": {"MPG-SA-001"},
}
REMOVED = {"HIPAA-164.312(a)(2)(iv)", "GDPR-Art30", "GDPR-Art5"}


def catalogued() -> dict[str, str]:
    return {c.full_id: f.name for f in all_frameworks().values() for c in f.controls}


def test_every_control_id_in_rules_yaml_is_catalogued() -> None:
    used = {control: rule.id for rule in all_rules().values() for control in rule.controls}
    missing = sorted(set(used) - set(catalogued()))
    assert missing == [], f"rules.yaml uses controls no catalogue defines: {missing}"


def test_every_catalogued_control_has_evidence() -> None:
    """A control rests on rules (judged in validate records) or on record kinds of its own (the
    chain, config records, the API server's events); a control with validate records has rules."""
    used = {control for rule in all_rules().values() for control in rule.controls}
    for fw in all_frameworks().values():
        for control in fw.controls:
            if "validate" in control.records:
                assert control.full_id in used, f"{control.full_id} names validate records but no rule"
            else:
                assert set(control.records) - {"mutate"}, control.full_id


def test_control_rules_come_from_the_rule_catalogue() -> None:
    for fw in all_frameworks().values():
        for control in fw.controls:
            expected = tuple(r.id for r in all_rules().values() if control.full_id in r.controls)
            assert control.rules == expected


def test_the_mappings_issue_19_found_wrong_are_gone() -> None:
    controls = {c.full_id: c for fw in all_frameworks().values() for c in fw.controls}
    for control, rules in WRONG.items():
        assert not set(controls[control].rules) & rules, control
    assert not REMOVED & set(controls)
    assert controls["PCI-DSS-7.2.5"].rules == ("MPG-SA-001",)
    assert framework("pci").title == "PCI DSS v4.0.1"
    assert "third countr" in controls["GDPR-Art44"].description
    assert "config" in controls["SOC2-CC8.1"].records
    assert "images" in controls["PCI-DSS-6.3.2"].records


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
    policy = {
        "podSecurity": {"level": "restricted", "version": "latest"},
        "defaultMode": "enforce",
        "modes": {},
        "forbidPlaintextSecrets": True,
    }
    revision = {"revision": "r1", "policy": policy}

    def facts(**changes: object) -> EvidenceFacts:
        base: dict[str, object] = {
            "validate_by_kind": {"TrainJob": 4, "TrainingRuntime": 9},
            "effects": {("MPG-RES-002", "denied"): 2},
            "advisory": frozenset({"MPG-Q004"}),
            "expired": {},
            "counts": {"evidence": 3},
            "revisions": [revision],
        }
        base.update(changes)
        return EvidenceFacts(**base)  # type: ignore[arg-type]

    met = assess_control(control, facts(), rules)
    # the residency rules judge TrainJobs only: runtimes are no evidence for C1.1
    assert met["evidence"] == {"validate": 4, "evidence": 3}
    assert met["population"] == {
        "validate": {"count": 4, "unit": "requests"},
        "evidence": {"count": 3, "unit": "placements"},
    }
    assert (met["status"], met["reasons"], met["violations"]["denied"]) == ("met", [], 2)
    assert met["modes"][0] == {"rule": "MPG-RES-001", "byRevision": {"r1": "enforce"}}
    outside = assess_control(control, facts(findings={"evidence": ["2 pod placement(s) outside"]}), rules)
    assert (outside["status"], outside["reasons"]) == ("attention", ["2 pod placement(s) outside"])
    audited = assess_control(control, facts(effects={("MPG-RES-001", "audited"): 3}), rules)
    assert audited["reasons"] == ["findings admitted without enforcement (warn/audit mode): MPG-RES-001 (3)"]
    # a rule configured in warn mode is attention even when it found nothing
    warn = {**policy, "modes": {"MPG-RES-002": "warn"}}
    relaxed = assess_control(control, facts(revisions=[{"revision": "r2", "policy": warn}]), rules)
    assert relaxed["reasons"] == ["MPG-RES-002: warn under revision(s) r2"]
    # no source for placements: not evaluated; no record at all: no occasion
    missing = assess_control(control, facts(missing={"evidence": "no controller chain"}), rules)
    assert (missing["status"], missing["notEvaluated"]) == ("not evaluated", ["no controller chain"])
    unknown = assess_control(control, facts(revisions=[{"revision": "r3", "policy": None}]), rules)
    assert unknown["status"] == "not evaluated"
    assert "r3" in unknown["notEvaluated"][0]
    empty = assess_control(control, facts(validate_by_kind={}, counts={}), rules)
    assert (empty["status"], empty["evidenceTotal"]) == ("no occasion", 0)
    declared = assess_control(control, facts(not_applicable={"SOC2-C1.1": "no confidential data"}), rules)
    assert (declared["status"], declared["notApplicable"]) == ("not applicable", "no confidential data")


def test_the_pod_security_level_decides_whether_a_pss_rule_ran() -> None:
    from mpigate.report import EvidenceFacts, assess_control

    cc68 = next(c for c in framework("soc2").controls if c.id == "CC6.8")
    base = {
        "podSecurity": {"level": "privileged", "version": "latest"},
        "defaultMode": "enforce",
        "modes": {},
        "forbidPlaintextSecrets": True,
    }
    facts = EvidenceFacts(
        validate_by_kind={"TrainJob": 5},
        effects={},
        advisory=frozenset(),
        expired={},
        counts={"mutate": 5},
        revisions=[{"revision": "lax", "policy": base}],
    )
    result = assess_control(cc68, facts, all_rules())
    assert result["status"] == "attention"
    assert (
        "MPG-SEC-PRIVILEGED: not run (Pod Security level privileged) under revision(s) lax"
        in result["reasons"]
    )
    # mutate records are the same requests as the validate records: shown, not added
    assert result["evidenceTotal"] == 5

"""The rule catalogue: IDs are unique and stable, and the PSS rules mirror upstream's checks."""

from __future__ import annotations

from mpigate.catalogue import all_rules, expand_rule_pattern, rule, rule_ids

# Every check of pod-security-admission at v1.37 (../shared/design/PSS.md).
UPSTREAM_PSS_CHECKS = {
    "hostNamespaces": "baseline",
    "privileged": "baseline",
    "capabilities_baseline": "baseline",
    "hostPathVolumes": "baseline",
    "hostPorts": "baseline",
    "hostProbesAndHostLifecycle": "baseline",
    "appArmorProfile": "baseline",
    "seLinuxOptions": "baseline",
    "procMount": "baseline",
    "seccompProfile_baseline": "baseline",
    "sysctls": "baseline",
    "windowsHostProcess": "baseline",
    "restrictedVolumes": "restricted",
    "allowPrivilegeEscalation": "restricted",
    "runAsNonRoot": "restricted",
    "runAsUser": "restricted",
    "seccompProfile_restricted": "restricted",
    "capabilities_restricted": "restricted",
    "procMount_restricted": "restricted",
}


def test_one_rule_per_upstream_pss_check() -> None:
    pss = {r.pss_check: r.pss_level for r in all_rules().values() if r.pss_check}
    assert pss == UPSTREAM_PSS_CHECKS
    for info in all_rules().values():
        if info.pss_check:
            expected = "MPG-SEC-" + info.pss_check.upper().replace("_", "-")
            assert info.id == expected


def test_catalogue_covers_the_design_table() -> None:
    ids = set(all_rules())
    for rid in [
        "MPG-TEAM-001",
        *(f"MPG-Q00{i}" for i in range(1, 9)),
        "MPG-RES-001",
        "MPG-RES-002",
        "MPG-RES-003",
        "MPG-RT-001",
        "MPG-RT-002",
        "MPG-SEC-SECRETS",
        "MPG-SA-001",
        "MPG-IMG-001",
        "MPG-IMG-002",
        "MPG-NET-001",
        "MPG-NET-002",
        "MPG-LIFE-001",
        "MPG-LIFE-002",
        "MPG-LIFE-003",
        "MPG-LIFE-004",
    ]:
        assert rid in ids
    for info in all_rules().values():
        assert info.controls, info.id
        assert set(info.applies) <= {"TrainJob", "TrainingRuntime", "MPIJob"}
    assert {r.id for r in all_rules().values() if r.advisory} == {"MPG-Q004", "MPG-Q008"}


def test_patterns() -> None:
    assert expand_rule_pattern("MPG-Q001") == ("MPG-Q001",)
    assert expand_rule_pattern("MPG-Q00") == ()
    assert "MPG-SEC-RUNASNONROOT" in expand_rule_pattern("MPG-SEC")
    assert set(expand_rule_pattern("MPG-SEC-CAP*")) == {
        "MPG-SEC-CAPABILITIES-BASELINE",
        "MPG-SEC-CAPABILITIES-RESTRICTED",
    }
    assert len(expand_rule_pattern("MPG-Q*")) == 8
    assert rule("MPG-Q001").family == "quota"


def test_library_rules_are_valid_custom_rules_with_their_own_ids() -> None:
    """Each library file is a CustomRule named as its file, its ID MPG-LIB-… and unlike the
    catalogue's, its parameters a JSON Schema whose defaults satisfy it."""
    from jsonschema import Draft202012Validator

    from mpigate.catalogue import library_rule_ids, library_rules
    from mpigate.config.schema import defaults_from, kind_schema

    validator = Draft202012Validator(kind_schema("CustomRule"))
    assert len(set(library_rule_ids())) == len(library_rules()) >= 20
    for entry in library_rules().values():
        assert not list(validator.iter_errors(entry.document)), entry.name
        assert entry.id.startswith("MPG-LIB-") and entry.id not in rule_ids()
        schema = entry.document["spec"]["paramsSchema"]
        Draft202012Validator.check_schema(schema)
        assert not list(Draft202012Validator(schema).iter_errors(defaults_from(schema, None))), entry.name

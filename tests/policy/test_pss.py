"""Pod Security Standards: every check, level and outcome, the version history, the message."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpigate.catalogue import all_rules
from mpigate.policy import pss
from mpigate.policy.pss import PSSFinding, evaluate_pod, format_message, parse_version

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policy" / "pss"
BASE: Mapping[str, Any] = yaml.safe_load((FIXTURES / "_base.yaml").read_text(encoding="utf-8"))
SC = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
LEVEL_OF = {check.id: check.level for check in pss.all_checks()}


def merged(base: Any, overlay: Any) -> Any:
    """``overlay`` over ``base``: mappings merge, lists and scalars replace, ``None`` removes."""
    if not isinstance(base, Mapping) or not isinstance(overlay, Mapping):
        return copy.deepcopy(overlay)
    out = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def run(pod: Mapping[str, Any], level: str, version: str = "latest") -> tuple[PSSFinding, ...]:
    return evaluate_pod(pod.get("metadata", {}), pod.get("spec", {}), level, version)


def ids(findings: tuple[PSSFinding, ...]) -> list[str]:
    return [f.check for f in findings]


def fixture_cases() -> Iterator[Any]:
    for path in sorted(FIXTURES.glob("*.yaml")):
        if path.name.startswith("_"):
            continue
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for case in data["cases"]:
            case = {"check": data["check"], **case}
            yield pytest.param(case, id=f"{path.stem}: {case['name']}")


@pytest.mark.parametrize("case", list(fixture_cases()))
def test_fixture_case(case: Mapping[str, Any]) -> None:
    pod = merged(BASE, case.get("pod", {}))
    if "outcomes" in case:
        outcomes = case["outcomes"]
    else:
        outcomes = {version: case.get("fails", {}) for version in case.get("versions", ["latest"])}
    asserted_detail = False
    for version, expected in outcomes.items():
        for level in ("baseline", "restricted"):
            findings = run(pod, level, version)
            assert ids(findings) == list(expected.get(level, [])), (version, level)
            for finding in findings:
                assert finding.level == LEVEL_OF[finding.check]
                if finding.check != case["check"]:
                    continue
                asserted_detail = True
                if "reason" in case:
                    assert finding.reason == case["reason"]
                if "detail" in case:
                    assert finding.detail == case["detail"]
                if "paths" in case:
                    assert list(finding.paths) == case["paths"]
    if any(key in case for key in ("reason", "detail", "paths")):
        assert asserted_detail, f"{case['check']} never failed, so its reason/detail/paths went unchecked"


def test_fixtures_make_every_check_fail_at_its_level() -> None:
    failing: set[tuple[str, str]] = set()
    for param in fixture_cases():
        case = param.values[0]
        outcomes = case.get("outcomes") or {"latest": case.get("fails", {})}
        for expected in outcomes.values():
            for level, checks in expected.items():
                failing.update((check, level) for check in checks)
    missing = [c.id for c in pss.all_checks() if (c.id, c.level) not in failing]
    assert missing == []
    # ... and every check passes somewhere: the base pod passes all of them at every level.
    assert run(BASE, "restricted") == ()
    assert run(BASE, "baseline") == ()


# --- the registry ------------------------------------------------------------------------------


def test_every_check_has_its_catalogue_rule_and_back() -> None:
    catalogue = {r.pss_check: r for r in all_rules().values() if r.pss_check}
    assert {c.id for c in pss.all_checks()} == set(catalogue)
    for check in pss.all_checks():
        assert check.rule == catalogue[check.id].id
        assert check.level == catalogue[check.id].pss_level


@pytest.mark.parametrize(
    ("level", "version", "count"),
    [
        ("privileged", "latest", 0),
        ("baseline", "v1.0", 11),
        ("baseline", "v1.33", 11),
        ("baseline", "v1.34", 12),
        ("baseline", "latest", 12),
        ("restricted", "v1.0", 12),  # 11 baseline - hostPathVolumes + restrictedVolumes, runAsNonRoot
        ("restricted", "v1.8", 13),  # + allowPrivilegeEscalation
        ("restricted", "v1.19", 13),  # + seccompProfile_restricted - seccompProfile_baseline
        ("restricted", "v1.22", 13),  # + capabilities_restricted - capabilities_baseline
        ("restricted", "v1.23", 14),  # + runAsUser
        ("restricted", "v1.34", 15),  # + hostProbesAndHostLifecycle
        ("restricted", "v1.35", 15),  # + procMount_restricted - procMount
        ("restricted", "latest", 15),
        ("restricted", "v1.1000", 15),
    ],
)
def test_number_of_checks_per_level_and_version(level: str, version: str, count: int) -> None:
    assert len(pss.check_ids(level, version)) == count


def test_restricted_latest_runs_the_documented_fifteen_checks_in_order() -> None:
    assert pss.check_ids("restricted") == (
        "appArmorProfile",
        "hostNamespaces",
        "hostPorts",
        "hostProbesAndHostLifecycle",
        "privileged",
        "seLinuxOptions",
        "sysctls",
        "windowsHostProcess",
        "allowPrivilegeEscalation",
        "capabilities_restricted",
        "procMount_restricted",
        "restrictedVolumes",
        "runAsNonRoot",
        "runAsUser",
        "seccompProfile_restricted",
    )


# --- versions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"), [("latest", "latest"), ("v1.0", (1, 0)), ("v1.37", (1, 37)), ("v1.120", (1, 120))]
)
def test_parse_version(text: str, parsed: object) -> None:
    assert parse_version(text) == parsed


@pytest.mark.parametrize(
    "text", ["", "1.29", "v1", "v1.", "v1.01", "v2.0", "v1.2.3", "V1.2", " v1.2", "Latest", "v1.x"]
)
def test_parse_version_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid Pod Security version"):
        parse_version(text)


@pytest.mark.parametrize(
    ("version", "effective"), [("v1.0", (1, 0)), ("v1.36", (1, 36)), ("latest", (1, 37)), ("v1.38", (1, 37))]
)
def test_effective_version(version: str, effective: tuple[int, int]) -> None:
    assert pss.effective_version(version) == effective


def test_unknown_level_and_bad_version_are_value_errors() -> None:
    with pytest.raises(ValueError, match="invalid Pod Security level 'strict'"):
        evaluate_pod({}, {}, "strict")
    with pytest.raises(ValueError, match=r"invalid Pod Security version 'v1\.x'"):
        evaluate_pod({}, {}, "restricted", "v1.x")


# --- all checks reported, and the message ---------------------------------------------------------

WORST_POD: Mapping[str, Any] = {
    "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/node": "unconfined"}},
    "spec": {
        "hostNetwork": True,
        "securityContext": {
            "runAsUser": 0,
            "seLinuxOptions": {"type": "spc_t"},
            "seccompProfile": {"type": "Unconfined"},
            "sysctls": [{"name": "kernel.msgmax", "value": "1"}],
            "windowsOptions": {"hostProcess": True},
        },
        "containers": [
            {
                "name": "node",
                "image": "mpi:1",
                "ports": [{"containerPort": 22, "hostPort": 22}],
                "livenessProbe": {"tcpSocket": {"port": 22, "host": "10.0.0.1"}},
                "securityContext": {
                    "privileged": True,
                    "procMount": "Unmasked",
                    "capabilities": {"add": ["SYS_ADMIN"]},
                },
            }
        ],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
    },
}


def test_all_failing_checks_are_reported_not_just_the_first() -> None:
    assert ids(run(WORST_POD, "baseline")) == list(pss.check_ids("baseline"))
    assert ids(run(WORST_POD, "restricted")) == list(pss.check_ids("restricted"))
    assert len(run(WORST_POD, "restricted")) == 15
    assert run(WORST_POD, "privileged") == ()


def test_findings_carry_catalogue_rule_ids() -> None:
    rules = {f.check: f.rule for f in run(WORST_POD, "restricted")}
    assert rules["runAsNonRoot"] == "MPG-SEC-RUNASNONROOT"
    assert rules["capabilities_restricted"] == "MPG-SEC-CAPABILITIES-RESTRICTED"
    assert rules["hostNamespaces"] == "MPG-SEC-HOSTNAMESPACES"


def test_message_matches_the_admission_plugin() -> None:
    pod = {
        "spec": {
            "hostIPC": True,
            "containers": [{"name": "node", "securityContext": {"runAsUser": 0}}],
        }
    }
    findings = run(pod, "restricted")
    assert format_message("restricted", "latest", findings) == (
        'violates PodSecurity "restricted:latest": host namespaces (hostIPC=true), '
        'allowPrivilegeEscalation != false (container "node" must set '
        "securityContext.allowPrivilegeEscalation=false), "
        'unrestricted capabilities (container "node" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "node" must set securityContext.runAsNonRoot=true), '
        'runAsUser=0 (container "node" must not set runAsUser=0), '
        'seccompProfile (pod or container "node" must set securityContext.seccompProfile.type to '
        '"RuntimeDefault" or "Localhost")'
    )
    # Upstream's order, whatever order the findings come in.
    assert format_message("restricted", "latest", list(reversed(findings))) == format_message(
        "restricted", "latest", findings
    )


def test_message_with_a_pinned_version_and_an_empty_detail() -> None:
    finding = PSSFinding("sysctls", "MPG-SEC-SYSCTLS", "baseline", "forbidden sysctls", "", ())
    assert (
        format_message("baseline", "v1.29", [finding])
        == 'violates PodSecurity "baseline:v1.29": forbidden sysctls'
    )


def test_go_quoting_of_annotation_values() -> None:
    pod = {"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/x": 'a"b\\c\n\x01é'}}}
    (finding,) = run(pod, "baseline")
    assert finding.detail.endswith('x="a\\"b\\\\c\\n\\x01é""')


# --- untrusted input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("not a spec", []),
        ({"containers": "nope", "volumes": {"a": 1}}, []),
        ({"containers": [None, 3, "x"]}, []),
        ({"hostNetwork": "true", "hostPID": 1}, []),
        ({"containers": [{"name": 7, "securityContext": "privileged"}]}, []),
        ({"securityContext": {"sysctls": [None, {"name": 3}]}}, ["sysctls"]),
        ({"containers": [{"name": "a", "ports": [{"hostPort": "80"}, {"hostPort": True}]}]}, []),
    ],
)
def test_malformed_fields_read_as_absent_at_baseline(spec: Any, expected: list[str]) -> None:
    assert ids(evaluate_pod({}, spec, "baseline")) == expected


def test_malformed_required_values_still_fail_restricted() -> None:
    spec = {
        "securityContext": {"runAsNonRoot": "true", "seccompProfile": "RuntimeDefault"},
        "containers": [{"name": "a", "securityContext": {"allowPrivilegeEscalation": "false"}}],
    }
    assert ids(evaluate_pod({}, spec, "restricted")) == [
        "allowPrivilegeEscalation",
        "capabilities_restricted",
        "runAsNonRoot",
        "seccompProfile_restricted",
    ]


def test_a_sysctl_without_a_name_is_the_empty_name() -> None:
    (finding,) = evaluate_pod({}, {"securityContext": {"sysctls": [{"value": "1"}]}}, "baseline")
    assert (finding.detail, finding.paths) == ("", ("spec.securityContext.sysctls[0].name",))


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from(["", "ALL", "Unconfined", "windows", "x"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "containers",
                    "initContainers",
                    "ephemeralContainers",
                    "securityContext",
                    "name",
                    "ports",
                    "hostPort",
                    "capabilities",
                    "add",
                    "drop",
                    "volumes",
                    "hostPath",
                    "emptyDir",
                    "sysctls",
                    "seccompProfile",
                    "type",
                    "appArmorProfile",
                    "seLinuxOptions",
                    "user",
                    "role",
                    "procMount",
                    "runAsUser",
                    "runAsNonRoot",
                    "allowPrivilegeEscalation",
                    "privileged",
                    "hostUsers",
                    "os",
                    "windowsOptions",
                    "hostProcess",
                    "livenessProbe",
                    "lifecycle",
                    "preStop",
                    "httpGet",
                    "host",
                    "hostNetwork",
                    "annotations",
                    "container.apparmor.security.beta.kubernetes.io/a",
                    "seccomp.security.alpha.kubernetes.io/pod",
                ]
            )
            | st.text(max_size=4),
            children,
            max_size=4,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    metadata=JSON,
    spec=JSON,
    level=st.sampled_from(pss.LEVELS),
    version=st.sampled_from(["v1.0", "v1.24", "latest"]),
)
def test_evaluate_pod_never_raises_on_arbitrary_json(
    metadata: Any, spec: Any, level: str, version: str
) -> None:
    findings = evaluate_pod(metadata, spec, level, version)
    message = format_message(level, version, findings)
    assert all(f.reason in message and f.rule.startswith("MPG-SEC-") for f in findings)


# --- properties over well-formed pods ------------------------------------------------------------

VOLUME_SOURCES = ["emptyDir", "configMap", "secret", "hostPath", "nfs", "persistentVolumeClaim", "image"]


def container_st(name: str) -> st.SearchStrategy[dict[str, Any]]:
    sc = st.fixed_dictionaries(
        {},
        optional={
            "privileged": st.booleans(),
            "allowPrivilegeEscalation": st.booleans(),
            "runAsNonRoot": st.booleans(),
            "runAsUser": st.sampled_from([0, 1000]),
            "procMount": st.sampled_from(["Default", "Unmasked"]),
            "capabilities": st.fixed_dictionaries(
                {},
                optional={
                    "add": st.lists(st.sampled_from(["CHOWN", "NET_BIND_SERVICE", "NET_RAW", "SYS_ADMIN"])),
                    "drop": st.sampled_from([["ALL"], ["NET_RAW"], []]),
                },
            ),
            "seccompProfile": st.fixed_dictionaries(
                {"type": st.sampled_from(["RuntimeDefault", "Localhost", "Unconfined"])}
            ),
            "seLinuxOptions": st.fixed_dictionaries({"type": st.sampled_from(["container_t", "spc_t"])}),
            "appArmorProfile": st.fixed_dictionaries(
                {"type": st.sampled_from(["RuntimeDefault", "Unconfined"])}
            ),
        },
    )
    return st.fixed_dictionaries(
        {"name": st.just(name)},
        optional={
            "securityContext": sc,
            "ports": st.lists(st.fixed_dictionaries({"hostPort": st.sampled_from([0, 22])})),
        },
    )


POD = st.fixed_dictionaries(
    {
        "containers": st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True).flatmap(
            lambda names: st.tuples(*[container_st(n) for n in names]).map(list)
        ),
    },
    optional={
        "hostNetwork": st.booleans(),
        "hostUsers": st.booleans(),
        "initContainers": st.tuples(container_st("init")).map(list),
        "securityContext": st.fixed_dictionaries(
            {},
            optional={
                "runAsNonRoot": st.booleans(),
                "runAsUser": st.sampled_from([0, 1000]),
                "seccompProfile": st.fixed_dictionaries(
                    {"type": st.sampled_from(["RuntimeDefault", "Localhost", "Unconfined"])}
                ),
                "sysctls": st.lists(
                    st.fixed_dictionaries({"name": st.sampled_from(["net.ipv4.tcp_rmem", "kernel.msgmax"])})
                ),
            },
        ),
        # One source per volume: the API server rejects volumes with several.
        "volumes": st.lists(st.sampled_from(VOLUME_SOURCES).map(lambda s: {"name": s, s: {}}), max_size=3),
    },
)
VERSIONS = st.sampled_from(
    ["v1.0", "v1.8", "v1.18", "v1.19", "v1.22", "v1.23", "v1.25", "v1.34", "v1.35", "latest"]
)


@settings(max_examples=300)
@given(spec=POD, version=VERSIONS)
def test_restricted_reports_every_baseline_finding_it_does_not_override(
    spec: dict[str, Any], version: str
) -> None:
    baseline = evaluate_pod({}, spec, "baseline", version)
    restricted = evaluate_pod({}, spec, "restricted", version)
    still_run = set(pss.check_ids("restricted", version))
    assert [f for f in baseline if f.check in still_run] == [f for f in restricted if f.level == "baseline"]


@settings(max_examples=300)
@given(spec=POD, version=VERSIONS)
def test_a_pod_passing_restricted_passes_baseline(spec: dict[str, Any], version: str) -> None:
    # Windows pods are left out: upstream exempts them from capabilities/seccomp at restricted
    # (1.25+) while the overridden baseline checks would still flag them (API validation, not
    # PodSecurity, forbids those fields on Windows pods).
    if evaluate_pod({}, spec, "restricted", version) == ():
        assert evaluate_pod({}, spec, "baseline", version) == ()


# --- the gates: skipping a check whose fields the pod does not set never changes a finding ------


def ungated(
    metadata: Any, spec: Any, level: str, version: str
) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """Every active check run on the pod, none skipped (what evaluate_pod did before the gates)."""
    pod = pss._pod_view(metadata, spec)
    return [
        (check.id, failed.reason, failed.detail, failed.paths)
        for check, impl in pss._active(level, pss.effective_version(version))
        if (failed := impl.fn(pod)) is not None
    ]


def gated(metadata: Any, spec: Any, level: str, version: str) -> list[tuple[str, str, str, tuple[str, ...]]]:
    return [(f.check, f.reason, f.detail, f.paths) for f in evaluate_pod(metadata, spec, level, version)]


ANNOTATIONS = st.fixed_dictionaries(
    {},
    optional={
        "annotations": st.dictionaries(
            st.sampled_from(
                [
                    "seccomp.security.alpha.kubernetes.io/pod",
                    "container.seccomp.security.alpha.kubernetes.io/a",
                    "container.apparmor.security.beta.kubernetes.io/b",
                    "team",
                ]
            ),
            st.sampled_from(["unconfined", "runtime/default", "localhost/x", ""]),
        )
    },
)


@settings(max_examples=400)
@given(metadata=ANNOTATIONS, spec=POD, level=st.sampled_from(pss.LEVELS), version=VERSIONS)
def test_gated_evaluation_equals_running_every_check(
    metadata: dict[str, Any], spec: dict[str, Any], level: str, version: str
) -> None:
    assert gated(metadata, spec, level, version) == ungated(metadata, spec, level, version)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(metadata=JSON, spec=JSON, level=st.sampled_from(pss.LEVELS), version=VERSIONS)
def test_gated_evaluation_equals_running_every_check_on_arbitrary_json(
    metadata: Any, spec: Any, level: str, version: str
) -> None:
    assert gated(metadata, spec, level, version) == ungated(metadata, spec, level, version)


def near_compliant_container(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """A container that passes ``restricted`` or misses it by a field or two (absent: None)."""
    sc = st.fixed_dictionaries(
        {
            "allowPrivilegeEscalation": st.sampled_from([False, False, True, None]),
            "runAsNonRoot": st.sampled_from([True, True, False, None]),
            "seccompProfile": st.sampled_from([{"type": "RuntimeDefault"}, {"type": "Unconfined"}, {}, None]),
            "capabilities": st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {
                        "drop": st.sampled_from([["ALL"], ["ALL"], ["NET_RAW"], [1]]),
                        "add": st.lists(st.sampled_from(["NET_BIND_SERVICE", "SYS_ADMIN", 7]), max_size=2),
                    }
                ),
            ),
        }
    ).map(lambda d: {k: v for k, v in d.items() if v is not None})
    return st.fixed_dictionaries({"name": st.just(name)}, optional={"securityContext": sc})


NEAR_COMPLIANT_POD = st.fixed_dictionaries(
    {
        "containers": st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2, unique=True).flatmap(
            lambda names: st.tuples(*[near_compliant_container(n) for n in names]).map(list)
        ),
    },
    optional={
        "securityContext": st.fixed_dictionaries(
            {},
            optional={
                "runAsNonRoot": st.booleans(),
                "seccompProfile": st.sampled_from([{"type": "RuntimeDefault"}, {"type": "Unconfined"}, {}]),
            },
        ),
        "hostUsers": st.booleans(),
        "os": st.just({"name": "windows"}),
    },
)


@settings(max_examples=400)
@given(spec=NEAR_COMPLIANT_POD, version=VERSIONS)
def test_gated_evaluation_equals_running_every_check_near_restricted(
    spec: dict[str, Any], version: str
) -> None:
    assert gated({}, spec, "restricted", version) == ungated({}, spec, "restricted", version)

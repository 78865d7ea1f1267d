"""Judging observed sockets against pinned ranges (pure; fixtures in tests/fixtures/preflight)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mpigate.config.model import NetworkProfile
from mpigate.preflight import ObservedSocket, PortRanges, analyse, parse_port_list


def _cases(fixtures_dir: Path) -> tuple[PortRanges, list[dict[str, Any]]]:
    data = yaml.safe_load((fixtures_dir / "observed_sockets.yaml").read_text())
    r = data["ranges"]
    ranges = PortRanges(
        btl=tuple(map(tuple, r["btl"])), oob=tuple(map(tuple, r["oob"])), ssh=tuple(map(tuple, r["ssh"]))
    )
    return ranges, data["cases"]


def _socket(row: list[Any]) -> ObservedSocket:
    pid, process, family, la, lp, ra, rp, state = row
    return ObservedSocket(pid, process, family, la, lp, ra, rp, state)


def test_every_fixture_case_is_judged_as_expected(fixtures_dir: Path) -> None:
    ranges, cases = _cases(fixtures_dir)
    report = analyse([_socket(c["socket"]) for c in cases], ranges)
    by_socket = {v.socket: v for v in report.verdicts}
    for case in cases:
        verdict = by_socket.get(_socket(case["socket"]))
        got = (
            None
            if verdict is None
            else [verdict.kind, verdict.scope, verdict.port, verdict.range, verdict.ok]
        )
        assert got == case["expected"], case["name"]
    assert not report.ok
    assert len(report.violations) == sum(1 for c in cases if c["expected"] and not c["expected"][4])
    assert report.ports("oob") == (40200,)
    assert report.ports("btl") == (40000,)


def test_a_clean_run_is_ok_and_serialisable(fixtures_dir: Path) -> None:
    ranges, cases = _cases(fixtures_dir)
    clean = [_socket(c["socket"]) for c in cases if c["expected"] and c["expected"][4]]
    report = analyse(clean, ranges)
    assert report.ok
    data = report.to_dict()
    assert data["ok"] is True and data["violations"] == []
    assert data["usedPorts"] == {"btl": [40000], "oob": [40200], "ssh": []}
    assert len(data["sockets"]) == len(clean)


def test_ranges_from_the_profile_env_match_the_profile() -> None:
    profile = NetworkProfile("p", "pinned-ports", 2222, 41000, 50, 41100, 41104)
    from_env = PortRanges.from_env(dict(profile.openmpi_env))
    assert from_env == PortRanges(btl=((41000, 41049),), oob=((41100, 41104),))
    from_profile = PortRanges.from_profile(profile)
    assert from_profile.ssh == ((2222, 2222),)
    assert [from_profile.range_of(p) for p in (40999, 41000, 41049, 41050, 41100, 41104, 41105, 2222)] == [
        None, "btl", "btl", None, "oob", "oob", None, "ssh"
    ]  # fmt: skip
    assert from_profile.describe() == "BTL 41000-41049, OOB 41100-41104, SSH 2222"


def test_unpinned_env_has_no_ranges() -> None:
    assert PortRanges.from_env({"OMPI_MCA_btl": "self,tcp", "PATH": "/bin"}) is None


@pytest.mark.parametrize("bad", ["0-5", "70000", "10-5", "a-b", "1-2-3"])
def test_port_lists_openmpi_would_reject_are_errors(bad: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - several messages, all from int() or our check
        parse_port_list(bad)


@given(st.lists(st.tuples(st.integers(1, 65535), st.integers(0, 100)), min_size=1, max_size=6))
def test_port_lists_round_trip(spans: list[tuple[int, int]]) -> None:
    ranges = [(low, min(low + extra, 65535)) for low, extra in spans]
    text = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)
    assert parse_port_list(text) == tuple(ranges)

"""The preflight report: verdict rules, JSON round trip, the human table."""

from __future__ import annotations

from mpigate.preflight import CheckResult, PingPong, PreflightReport, RankReport, format_bytes, render_text
from mpigate.preflight.portwatch import ObservedSocket


def _rank(rank: int, *, ring: str = "pass", ports: str = "pass", detail: str = "") -> RankReport:
    return RankReport(
        rank=rank,
        host=f"node-{rank // 2}",
        pid=1000 + rank,
        checks=(
            CheckResult("allreduce", "pass", "exact"),
            CheckResult("ring", ring, detail),  # type: ignore[arg-type]
            CheckResult("pingpong", "pass", ""),
            CheckResult("ports", ports, "ports not pinned" if ports == "skip" else ""),  # type: ignore[arg-type]
        ),
        pingpong=(PingPong(rank, 8, 20, 12.5, 0.64), PingPong(rank, 1 << 20, 20, 250.0, 4194.304))
        if rank
        else (),
        listen_ports=(40000 + rank,),
        sockets=(
            ObservedSocket(1000 + rank, "python", "ipv4", "0.0.0.0", 40000 + rank, "0.0.0.0", 0, "LISTEN"),
            ObservedSocket(1000 + rank, "python", "ipv6", "::", 40000 + rank, "::", 0, "LISTEN"),
            ObservedSocket(
                1000 + rank, "python", "ipv4", "10.0.0.2", 51234, "10.0.0.3", 40001, "ESTABLISHED"
            ),
            ObservedSocket(1000 + rank, "python", "ipv6", "fd00::2", 51235, "fd00::3", 40001, "ESTABLISHED"),
        ),
    )


def _report(*ranks: RankReport, size: int | None = None) -> PreflightReport:
    return PreflightReport(
        size=size if size is not None else len(ranks),
        library="Open MPI v4.1.4",
        mpi4py="4.1.2",
        ranks=ranks,
        settings={"hold": 0.5},
        pinned_env={"OMPI_MCA_btl_tcp_port_min_v4": "40000"},
    )


def test_all_passed_is_pass() -> None:
    report = _report(_rank(0), _rank(1))
    assert report.ok and report.verdict == "PASS" and report.failures == ()


def test_one_failed_check_fails_the_run() -> None:
    report = _report(_rank(0), _rank(1, ring="fail", detail="1 MiB from rank 0 differs at byte 7"))
    assert report.verdict == "FAIL"
    [(rank, check)] = report.failures
    assert (rank, check.name, check.detail) == (1, "ring", "1 MiB from rank 0 differs at byte 7")


def test_a_missing_rank_fails_the_run() -> None:
    assert _report(_rank(0), _rank(1), size=3).verdict == "FAIL"


def test_skips_do_not_fail() -> None:
    assert _report(_rank(0, ports="skip"), _rank(1, ports="skip")).ok


def test_json_round_trip_is_lossless() -> None:
    report = _report(_rank(0), _rank(1, ring="fail", detail="token came back as [0]"), _rank(2))
    assert PreflightReport.from_dict(report.to_dict()) == report
    assert report.to_dict()["verdict"] == "FAIL"
    assert report.to_dict()["ranks"][1]["pingpong"][1] == {
        "peer": 1,
        "size": 1048576,
        "iterations": 20,
        "latencyUs": 250.0,
        "bandwidthMBs": 4194.304,
    }
    # a rank's own sockets travel as the sampler prints them, and come back the same
    assert report.to_dict()["ranks"][2]["sockets"][3] == {
        "pid": 1002,
        "process": "python",
        "family": "ipv6",
        "state": "ESTABLISHED",
        "local": "[fd00::2]:51235",
        "remote": "[fd00::3]:40001",
    }


def test_text_table() -> None:
    text = render_text(_report(_rank(0), _rank(1, ring="fail", detail="bad token"), _rank(2, ports="skip")))
    lines = text.splitlines()
    assert lines[0] == "mpigate preflight: 3 rank(s), Open MPI v4.1.4, mpi4py 4.1.2"
    assert lines[1] == "pinned ports: OMPI_MCA_btl_tcp_port_min_v4=40000"
    header = next(line for line in lines if line.startswith("rank"))
    assert header.split() == ["rank", "host", "pid", "allreduce", "ring", "pingpong", "ports", "listening"]
    assert "1     node-0  1001  pass       fail  pass      pass   40001" in lines
    assert "2     node-1  1002  pass       pass  pass      skip   40002" in lines
    assert "1     1 MiB  20          250.0 us  4194.3 MB/s" in lines
    assert "  rank 1 ring: bad token" in lines
    assert "  ports: ports not pinned" in lines
    assert lines[-1] == "verdict: FAIL"


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (8, 1024, 65536, 1 << 20, 1500, 3 << 20)] == [
        "8 B", "1 KiB", "64 KiB", "1 MiB", "1500 B", "3 MiB"
    ]  # fmt: skip

"""The pinned-ports MCA environment, exactly as verified with real OpenMPI (tests/preflight)."""

from __future__ import annotations

from mpigate.config.model import NetworkProfile


def test_pinned_profile_env_pins_both_families() -> None:
    profile = NetworkProfile("pinned", "pinned-ports", 2222, 40000, 100, 40200, 40210)
    assert profile.openmpi_env == (
        ("OMPI_MCA_btl_tcp_port_min_v4", "40000"),
        ("OMPI_MCA_btl_tcp_port_range_v4", "100"),
        ("OMPI_MCA_btl_tcp_port_min_v6", "40000"),
        ("OMPI_MCA_btl_tcp_port_range_v6", "100"),
        ("OMPI_MCA_btl_tcp_disable_family", "6"),
        ("OMPI_MCA_oob_tcp_static_ipv4_ports", "40200-40210"),
        ("OMPI_MCA_oob_tcp_static_ipv6_ports", "40200-40210"),
        ("OMPI_MCA_oob_tcp_disable_ipv6_family", "1"),
        ("PRTE_MCA_oob_tcp_static_ipv4_ports", "40200-40210"),
        ("PRTE_MCA_oob_tcp_static_ipv6_ports", "40200-40210"),
        ("PRTE_MCA_oob_tcp_disable_ipv6_family", "1"),
    )
    assert profile.port_ranges() == ((2222, 2222), (40000, 40099), (40200, 40210))


def test_isolated_profile_injects_nothing() -> None:
    assert NetworkProfile("iso", "isolated", 2222, 40000, 100, 40200, 40210).openmpi_env == ()

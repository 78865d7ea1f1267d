"""Which ports each MPI implementation uses, and the environment that pins them.

The ``pinned-ports`` profile opens two ranges among a job's pods besides sshd: a data range (the
"BTL" range: every rank's listener) and a daemon range (the "OOB" range: the launcher's and the
per-node daemons' listeners). Each implementation is pinned into them by its own variables, set in
the launcher's environment (every launcher here forwards its environment to the daemons it starts
over ssh and to the ranks). Every pair below was observed in a real multi-process run under
``mpigate preflight`` (tests/preflight/test_mpi_ports.py, test_mpi5_ports.py, test_hydra_ports.py;
docs/networking.md has the figures).

* **Open MPI** 4.1 (ORTE) reads ``OMPI_MCA_*``; Open MPI 5's PRRTE daemons read their OOB
  parameters only as ``PRTE_MCA_*`` (``NetworkProfile.openmpi_env`` explains each pair).
* **MPICH** (Hydra). Hydra's ``mpiexec`` listens for its proxies' control connections on the
  first variable set of a list that starts with ``MPIR_CVAR_CH3_PORT_RANGE`` and ends with
  ``MPIEXEC_PORT_RANGE`` (mpich src/pm/hydra/mpiexec/get_parameters.c, the same list in
  src/pm/hydra/ui/mpich/mpiexec.c since 3.3); the ranks' data listeners are the netmod's:
  ``MPIR_CVAR_CH3_PORT_RANGE`` for ch3:nemesis:tcp and ch3:sock
  (src/mpid/ch3/channels/nemesis/netmod/tcp/tcp_init.c MPID_nem_tcp_listen), UCX's
  ``UCX_TCP_PORT_RANGE`` for ch4:ucx (ucx src/uct/tcp/tcp_iface.c, ``PORT_RANGE``), libfabric's
  ``FI_TCP_PORT_LOW_RANGE``/``FI_TCP_PORT_HIGH_RANGE`` for ch4:ofi on its tcp provider
  (libfabric prov/tcp/src/xnet_init.c, ``port_low_range``/``port_high_range``). Because Hydra
  reads the CH3 name first, its control port lands in the data range too; ``MPIEXEC_PORT_RANGE``
  would never be read and is not set.
* **Intel MPI** (its own Hydra, libfabric bundled). ``I_MPI_PORT_RANGE`` pins Hydra's listeners
  (``hydra_pmi_proxy``'s PMI port on every node) into the daemon range; its data travels over
  libfabric, pinned by the tcp provider's ``FI_TCP_PORT_*`` into the data range.

Pure functions; the webhook injects ``pinned_env`` for the runtime's implementation.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DEFAULT_IMPLEMENTATION",
    "IMPLEMENTATIONS",
    "LABELS",
    "PINNED_ENV_NAMES",
    "Evidence",
    "Implementation",
    "as_implementation",
    "implementation_evidence",
    "parse_pinned_ranges",
    "pinned_env",
]

Implementation = Literal["OpenMPI", "Intel", "MPICH"]
#: The names Trainer's and the MPI Operator's ``mpiImplementation`` use (Trainer: pkg/apis/trainer/
#: v1alpha1/trainingruntime_types.go MPIImplementation; its CRD accepts only OpenMPI today).
IMPLEMENTATIONS: Final[tuple[Implementation, ...]] = ("OpenMPI", "Intel", "MPICH")
DEFAULT_IMPLEMENTATION: Final[Implementation] = "OpenMPI"
LABELS: Final[Mapping[Implementation, str]] = {"OpenMPI": "Open MPI", "Intel": "Intel MPI", "MPICH": "MPICH"}

Range = tuple[int, int]


def as_implementation(value: object) -> Implementation | None:
    """``value`` when it names an implementation (as ``mpiImplementation`` spells it), else None."""
    for implementation in IMPLEMENTATIONS:
        if value == implementation:
            return implementation
    return None


def _openmpi(btl: Range, oob: Range) -> tuple[tuple[str, str], ...]:
    btl_min, btl_range = str(btl[0]), str(btl[1] - btl[0] + 1)
    oob_ports = f"{oob[0]}-{oob[1]}"
    return (
        ("OMPI_MCA_btl_tcp_port_min_v4", btl_min),
        ("OMPI_MCA_btl_tcp_port_range_v4", btl_range),
        ("OMPI_MCA_btl_tcp_port_min_v6", btl_min),
        ("OMPI_MCA_btl_tcp_port_range_v6", btl_range),
        ("OMPI_MCA_btl_tcp_disable_family", "6"),
        ("OMPI_MCA_oob_tcp_static_ipv4_ports", oob_ports),
        ("OMPI_MCA_oob_tcp_static_ipv6_ports", oob_ports),
        ("OMPI_MCA_oob_tcp_disable_ipv6_family", "1"),
        # PRRTE: src/mca/oob/tcp/oob_tcp_component.c tcp_component_register (the names as
        # the wheel's `prte_info --all` lists them).
        ("PRTE_MCA_oob_tcp_static_ipv4_ports", oob_ports),
        ("PRTE_MCA_oob_tcp_static_ipv6_ports", oob_ports),
        ("PRTE_MCA_oob_tcp_disable_ipv6_family", "1"),
    )


def _libfabric_tcp(btl: Range) -> tuple[tuple[str, str], ...]:
    # libfabric prov/tcp/src/xnet_init.c xnet_init_env: fi_param "port_low_range"/"port_high_range"
    # of the provider named tcp, i.e. FI_TCP_PORT_LOW_RANGE / FI_TCP_PORT_HIGH_RANGE (inclusive).
    return (("FI_TCP_PORT_LOW_RANGE", str(btl[0])), ("FI_TCP_PORT_HIGH_RANGE", str(btl[1])))


def _mpich(btl: Range, _oob: Range) -> tuple[tuple[str, str], ...]:
    return (
        # ch3 tcp listeners, and Hydra's control port (the first name Hydra reads): "low:high".
        ("MPIR_CVAR_CH3_PORT_RANGE", f"{btl[0]}:{btl[1]}"),
        # ch4:ucx: UCX's TCP transport listener, a UCS range spec "low-high".
        ("UCX_TCP_PORT_RANGE", f"{btl[0]}-{btl[1]}"),
        *_libfabric_tcp(btl),
    )


def _intel(btl: Range, oob: Range) -> tuple[tuple[str, str], ...]:
    return (("I_MPI_PORT_RANGE", f"{oob[0]}:{oob[1]}"), *_libfabric_tcp(btl))


def pinned_env(implementation: Implementation, btl: Range, oob: Range) -> tuple[tuple[str, str], ...]:
    """The (name, value) pairs that keep ``implementation`` inside the data range ``btl`` and the
    daemon range ``oob`` (inclusive), in the order the webhook injects them."""
    if implementation == "MPICH":
        return _mpich(btl, oob)
    if implementation == "Intel":
        return _intel(btl, oob)
    return _openmpi(btl, oob)


#: Every variable any implementation's pinned environment sets (a rank's own ports check, the
#: preflight's report and the controller recognise the pinning by these names).
PINNED_ENV_NAMES: Final[frozenset[str]] = frozenset(
    name for impl in IMPLEMENTATIONS for name, _ in pinned_env(impl, (1, 1), (2, 2))
)


def _colon_or_dash(text: str) -> Range:
    low, sep, high = text.strip().replace(":", "-").partition("-")
    first, last = int(low), int(high if sep else low)
    if not 0 < first <= last <= 65535:
        raise ValueError(f"invalid port range {text!r}")
    return first, last


def parse_pinned_ranges(env: Mapping[str, str]) -> tuple[tuple[Range, ...], tuple[Range, ...]]:
    """(data ranges, daemon ranges) that the MPICH and Intel MPI variables in ``env`` pin
    (Open MPI's are read by ``preflight.confinement.PortRanges.from_env``). Raises ValueError for a
    value the implementation would not accept either."""
    data: list[Range] = []
    daemon: list[Range] = []
    for name in ("MPIR_CVAR_CH3_PORT_RANGE", "UCX_TCP_PORT_RANGE"):
        if env.get(name):
            data.append(_colon_or_dash(env[name]))
    low, high = env.get("FI_TCP_PORT_LOW_RANGE"), env.get("FI_TCP_PORT_HIGH_RANGE")
    if low or high:
        data.append(_colon_or_dash(f"{low or 1}-{high or 65535}"))
    if env.get("I_MPI_PORT_RANGE"):
        daemon.append(_colon_or_dash(env["I_MPI_PORT_RANGE"]))
    return tuple(dict.fromkeys(data)), tuple(dict.fromkeys(daemon))


@dataclass(frozen=True, slots=True)
class Evidence:
    """Something in a launcher's command or environment that only some implementations have."""

    implementations: frozenset[Implementation]
    what: str  # "the launcher mpirun.openmpi", "environment variable I_MPI_FABRICS"

    def excludes(self, implementation: Implementation) -> bool:
        return implementation not in self.implementations


_HYDRA: Final[frozenset[Implementation]] = frozenset({"MPICH", "Intel"})
# Launcher binaries whose name says which implementation runs them (Debian's alternatives name
# them after the implementation; PRRTE's and ORTE's own names; Hydra's).
_LAUNCHERS: Final[Mapping[str, frozenset[Implementation]]] = {
    "mpirun.openmpi": frozenset({"OpenMPI"}),
    "mpiexec.openmpi": frozenset({"OpenMPI"}),
    "orterun": frozenset({"OpenMPI"}),
    "prterun": frozenset({"OpenMPI"}),
    "prun": frozenset({"OpenMPI"}),
    "mpirun.mpich": frozenset({"MPICH"}),
    "mpiexec.mpich": frozenset({"MPICH"}),
    "mpiexec.hydra": _HYDRA,
}
# Variables only some implementations read. OMPI_/PRTE_MCA_: Open MPI's; I_MPI_: Intel MPI's;
# MPIR_CVAR_ and HYDRA_: MPICH's control variables and Hydra's, which Intel MPI (MPICH-derived, with
# its own Hydra) may read as well.
_ENV_PREFIXES: Final[tuple[tuple[str, frozenset[Implementation]], ...]] = (
    ("OMPI_", frozenset({"OpenMPI"})),
    ("PRTE_MCA_", frozenset({"OpenMPI"})),
    ("I_MPI_", frozenset({"Intel"})),
    ("MPIR_CVAR_", _HYDRA),
    ("HYDRA_", _HYDRA),
)
# Options only Open MPI's mpirun takes. Hydra's are single-dash words (-n, -f, -launcher, -genv) and
# include -bind-to and -map-by, which Open MPI spells --bind-to and --map-by.
_OPENMPI_OPTIONS: Final = re.compile(r"^(--?(mca|oversubscribe|allow-run-as-root|x)|--(map-by|bind-to))$")


def _words(command: Iterable[str]) -> list[str]:
    """The words of a container command, shell strings (``sh -c "mpirun ..."``) split too."""
    words: list[str] = []
    for part in command:
        try:
            words.extend(shlex.split(part) if " " in part else [part])
        except ValueError:  # an unbalanced quote: judge the words as written
            words.extend(part.split())
    return words


def implementation_evidence(command: Iterable[str], env_names: Iterable[str]) -> tuple[Evidence, ...]:
    """What a launcher container's command and environment say about the MPI implementation,
    one item per telling word or variable (nothing: it cannot be seen)."""
    found: dict[str, Evidence] = {}
    words = _words(command)
    for word in words:
        base = word.rsplit("/", 1)[-1]
        if base in _LAUNCHERS:
            found.setdefault(base, Evidence(_LAUNCHERS[base], f"the launcher {base}"))
        elif "/intel/" in word or "/oneapi/" in word:
            found.setdefault("intel-path", Evidence(frozenset({"Intel"}), f"the Intel MPI path {word}"))
    launcher = next((w for w in words if w.rsplit("/", 1)[-1] in ("mpirun", "mpiexec")), None)
    if launcher is not None:
        for word in words[words.index(launcher) + 1 :]:
            if _OPENMPI_OPTIONS.match(word):
                found.setdefault(
                    "ompi-option", Evidence(frozenset({"OpenMPI"}), f"the Open MPI mpirun option {word}")
                )
                break
    for name in env_names:
        for prefix, impls in _ENV_PREFIXES:
            if name.startswith(prefix):
                found.setdefault(prefix, Evidence(impls, f"the environment variable {name}"))
    return tuple(found.values())

"""Building a report from its inputs: mpigate audit chains and Kubernetes API-server audit logs.

Chains are read with :func:`mpigate.audit.read_chains` — merged by time and verified while read —
so a report always carries the integrity verdict of the records it counts. Records before
``--from`` are read too (verification needs the whole chain, and GPU accounting needs the
consumption a running job had already reached when the period began), but only counted when in
the period. API-server logs are read after the chains, so that namespaces the records tied to a
team are known when the events are attributed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mpigate.audit.layout import chain_dirs
from mpigate.audit.reader import read_chains
from mpigate.audit.signing import KeyRing
from mpigate.config import Config

from .aggregate import ReportBuilder, ReportOptions
from .k8saudit import K8sAuditReader

__all__ = ["build_report", "config_context"]

log = logging.getLogger(__name__)


def config_context(config: Config) -> dict[str, Any]:
    """What a report takes from the config: namespace → team, and the regions each team's pods
    may run in (its region plus those of the data classifications it may use)."""
    namespace_teams: dict[str, str] = {}
    team_regions: dict[str, tuple[str, ...]] = {}
    classifications = config.org.data_classifications
    for name, team in config.teams.items():
        for namespace in team.namespaces:
            namespace_teams[namespace] = name
        regions = {team.region}
        for classification in team.data_classifications or ():
            known = classifications.get(classification)
            if known is not None and known.regions:
                regions.update(known.regions)
        team_regions[name] = tuple(sorted(regions))
    return {
        "namespace_teams": namespace_teams,
        "team_regions": team_regions,
        "config_revision": config.revision,
    }


def build_report(
    audit_paths: Iterable[str | Path],
    k8s_audit_files: Iterable[str | Path] = (),
    *,
    keys: KeyRing | None = None,
    options: ReportOptions | None = None,
) -> dict[str, Any]:
    """Read every chain under ``audit_paths`` and every API-server audit log, and return the
    report document. Streams: memory does not grow with the number of records."""
    paths = [Path(p) for p in audit_paths]
    builder = ReportBuilder(options)
    reading = read_chains(paths, keys)
    log.info("report: %d chain(s) under %s", len(reading.readers), ", ".join(map(str, paths)))
    add = builder.add_entry
    for entry in reading:
        add(entry)
    readers = [K8sAuditReader(f) for f in k8s_audit_files]
    for reader in readers:
        add_event = builder.add_api_event
        for event in reader:
            add_event(event)
        log.info(
            "report: %s: %d line(s), %d malformed", reader.path, reader.stats.lines, reader.stats.malformed
        )
    return builder.finish(reading.reports, [r.stats for r in readers])


def has_chains(paths: Iterable[str | Path]) -> bool:
    """Whether any chain lies under ``paths``."""
    return bool(chain_dirs(paths))

"""Building a report from its inputs: mpigate audit chains and Kubernetes API-server audit logs.

Each input is aggregated on its own — a chain with :class:`mpigate.audit.ChainReader`, which
verifies it while reading (hashes, links, sequence, segments, signatures), an API-server log with
:class:`~mpigate.report.k8saudit.K8sAuditReader` — into a :class:`ReportBuilder`, and the builders
are merged (chains in time order). Inputs are independent, so with ``jobs`` > 1 they are
aggregated in worker processes: verification is CPU-bound and a cluster has several chains (one per
webhook replica, one per controller) and rotated API-server logs.

Records before ``--from`` are read too (verification needs the whole chain, the config in force
when the period began is in a record before it, and GPU accounting the consumption a running job
had reached when the period began) but only counted in the period.

The API-server logs are read after the chains: judging the pods they show needs the Pod Security
level in force at each moment (the chains' config records) and the team namespaces (the config,
else the records). The same chain or log given twice is refused (:class:`ReportInputError`):
it would count everything twice.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from mpigate.audit.layout import chain_dirs, list_segments
from mpigate.audit.reader import ChainReader, ChainReport
from mpigate.audit.records import policy_summary
from mpigate.audit.signing import KeyRing
from mpigate.audit.witness import Witness, apply_witness
from mpigate.config import Config

from .aggregate import ReportBuilder, ReportOptions
from .k8saudit import K8sAuditReader, K8sAuditStats
from .manifest import file_sha256

__all__ = ["AUTO_PARALLEL_BYTES", "ReportInputError", "build_report", "config_context", "has_chains"]

log = logging.getLogger(__name__)

# Below this much input, worker processes cost more than they save.
AUTO_PARALLEL_BYTES = 32 * 2**20


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
        "config_policy": policy_summary(config),
    }


class ReportInputError(ValueError):
    """The inputs cannot make one report (the same chain or log given twice)."""


def has_chains(paths: Iterable[str | Path]) -> bool:
    """Whether any chain lies under ``paths``."""
    return bool(chain_dirs(paths))


@dataclass(frozen=True, slots=True)
class _Keys:
    """A KeyRing in a form that crosses process boundaries (Ed25519 key objects do not pickle)."""

    hmac: tuple[tuple[str, bytes], ...]
    ed25519: tuple[tuple[str, bytes], ...]

    @staticmethod
    def of(keys: KeyRing | None) -> _Keys | None:
        if keys is None:
            return None
        raw = Encoding.Raw, PublicFormat.Raw
        return _Keys(
            tuple(keys.hmac_keys.items()),
            tuple((kid, public.public_bytes(*raw)) for kid, public in keys.public_keys.items()),
        )

    def ring(self) -> KeyRing:
        return KeyRing(
            dict(self.hmac), {kid: Ed25519PublicKey.from_public_bytes(raw) for kid, raw in self.ed25519}
        )


@dataclass(frozen=True, slots=True)
class _Task:
    kind: str  # "chain" | "k8s"
    path: Path
    options: ReportOptions
    keys: _Keys | None
    size: int


Result = tuple[ReportBuilder, ChainReport | K8sAuditStats, list[dict[str, Any]]]


def _aggregate(task: _Task) -> Result:
    """Aggregate one input (runs in a worker process when the report is parallel); a chain's
    segment files are hashed after reading (the report lists the digests of its inputs)."""
    builder = ReportBuilder(task.options)
    if task.kind == "chain":
        reader = ChainReader(task.path, task.keys.ring() if task.keys is not None else None)
        add = builder.add_entry
        for entry in reader:
            add(entry)
        digests = []
        for segment in list_segments(task.path):
            try:
                digest, size = file_sha256(segment)
            except OSError:
                continue  # unreadable: the chain's report names it
            digests.append({"path": str(segment), "sha256": digest, "bytes": size})
        return builder, reader.report, digests
    k8s = K8sAuditReader(task.path, heartbeat=task.options.heartbeat)
    add_event = builder.add_api_event
    for event in k8s:
        add_event(event)
    return builder, k8s.stats, []


def _size(path: Path, kind: str) -> int:
    try:
        if kind == "chain":
            return sum(p.stat().st_size for p in list_segments(path))
        return path.stat().st_size
    except OSError:
        return 0


def _run(tasks: Sequence[_Task], jobs: int) -> list[Result]:
    # Workers are forked: they start at once and need no importable __main__ (spawn and
    # forkserver re-run the caller's script). Forking a process that runs other threads can
    # deadlock the child, so a threaded caller gets the report computed in-process instead.
    if jobs > 1 and len(tasks) > 1 and threading.active_count() > 1:
        log.info("report: the process runs %d threads; aggregating in-process", threading.active_count())
        jobs = 1
    if jobs <= 1 or len(tasks) <= 1:
        log.info("report: aggregated %d input(s) in-process", len(tasks))
        return [_aggregate(task) for task in tasks]
    from concurrent.futures import ProcessPoolExecutor

    # Largest first, so that a big chain does not start last; results come back in task order.
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].size)
    workers = min(jobs, len(tasks))
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        done = list(pool.map(_aggregate, [tasks[i] for i in order]))
    log.info("report: aggregated %d input(s) in %d worker process(es)", len(tasks), workers)
    results: list[Any] = [None] * len(tasks)
    for i, result in zip(order, done, strict=True):
        results[i] = result
    return results


def _workers(jobs: int | None, tasks: Sequence[_Task]) -> int:
    if jobs is not None and jobs > 0:
        return jobs
    if sum(t.size for t in tasks) < AUTO_PARALLEL_BYTES:
        return 1
    return min(os.cpu_count() or 1, len(tasks))


def _refuse_duplicates(audit_paths: Sequence[str | Path], logs: Sequence[Path]) -> list[Path]:
    """The chain directories under ``audit_paths``; ReportInputError when a chain is given twice
    (the same directory under two arguments, or one chain id in two places) or a log is."""
    seen: dict[str, Path] = {}
    chains = [directory for path in audit_paths for directory in chain_dirs([path])]
    for directory in chains:
        known = seen.get(directory.name)
        if known is not None:
            same = known.resolve() == directory.resolve()
            raise ReportInputError(
                f"chain {directory.name} is given twice ({known}"
                + ("" if same else f" and {directory}")
                + "): every record would be counted twice; give each chain once"
            )
        seen[directory.name] = directory
    files: dict[tuple[int, int] | Path, Path] = {}
    for log in logs:
        try:
            stat = log.stat()
            key: tuple[int, int] | Path = (stat.st_dev, stat.st_ino)
        except OSError:
            key = log.resolve()
        if key in files:
            raise ReportInputError(
                f"API-server log {log} is given twice (also as {files[key]}): give each log once"
            )
        files[key] = log
    return sorted(set(chains))


def build_report(
    audit_paths: Iterable[str | Path],
    k8s_audit_files: Iterable[str | Path] = (),
    *,
    keys: KeyRing | None = None,
    options: ReportOptions | None = None,
    jobs: int | None = None,
) -> dict[str, Any]:
    """Read and verify every chain under ``audit_paths``, read every API-server audit log, and
    return the report document. Streams: memory does not grow with the number of records.

    ``jobs``: worker processes (None or 0: one per CPU when the input is large, else none).
    :class:`ReportInputError` when a chain or log is given twice."""
    options = options or ReportOptions()
    portable = _Keys.of(keys if keys is not None and not keys.empty else None)
    logs = [Path(f) for f in k8s_audit_files]
    directories = _refuse_duplicates(list(audit_paths), logs)
    if logs:
        options = replace(options, reconcile=True)
    chains = [_Task("chain", d, options, portable, _size(d, "chain")) for d in directories]
    workers = _workers(jobs, chains)
    log.info("report: %d chain(s), %d API-server log(s), %d worker(s)", len(chains), len(logs), workers)
    results = _run(chains, workers)
    chain_results = [(b, r, d) for b, r, d in results if isinstance(r, ChainReport)]
    # Merge in a fixed order (chains by time, then name) so that equal-time samples are stable.
    chain_results.sort(key=lambda item: (item[1].first_time or "", item[1].chain))
    merged = ReportBuilder(options)
    for builder, _, _ in chain_results:
        merged.merge(builder)
    k8s_results: list[tuple[ReportBuilder, K8sAuditStats]] = []
    if logs:
        # What the chains say the API-server events are judged by: team namespaces and the Pod
        # Security level in force over time.
        # Without --from the period starts with the chains' first record: older events are outside
        # it (a log from another year is no evidence for this one). Without --to it runs to the
        # newest input: API-server events after the last record are exactly what a truncated
        # chain would leave without its record.
        context = replace(
            options,
            since=options.since or merged.first_time,
            namespace_teams=options.namespace_teams or dict(merged.ns_teams),
            pss_timeline=tuple(merged.revisions.timeline()),
        )
        tasks = [_Task("k8s", f, context, None, _size(f, "k8s")) for f in logs]
        k8s_results = [
            (b, r) for b, r, _ in _run(tasks, _workers(jobs, tasks)) if isinstance(r, K8sAuditStats)
        ]
        digests: dict[str, str] = {}
        for _, stats in k8s_results:
            if stats.sha256 and stats.sha256 in digests:
                raise ReportInputError(
                    f"API-server logs {digests[stats.sha256]} and {stats.file} are the same file "
                    "(same SHA-256): give each log once"
                )
            digests[stats.sha256] = stats.file
    for builder, _ in k8s_results:
        merged.merge(builder)
    reports: list[ChainReport] = sorted((r for _, r, _ in chain_results), key=lambda r: r.chain)
    if logs:
        # The API-server logs witness the chains: removed newest records and deleted chains show.
        witness = Witness()
        for _, stats in k8s_results:
            witness.merge(stats.witness)
        reports = apply_witness(reports, witness)
    segments = {r.chain: d for _, r, d in chain_results}
    return merged.finish(reports, [s for _, s in k8s_results], segments)

"""The config revisions in force during the period, and what each one enforced.

Every decision record names the config revision it was made under; the webhook also writes a
``config`` evidence record whenever it starts serving a revision (:func:`mpigate.audit.records.
config_record`): its Pod Security level and version and the mode of every rule. The report lists
every revision in force during the period — those of the period's decisions, those loaded during
it, and per chain the one loaded last before it began — with what each enforced. The config at
report time (``--config``) is used only for the revision it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._util import text

__all__ = ["Revisions", "policy_of"]


def policy_of(details: Any) -> dict[str, Any] | None:
    """The policy a config record's details state, or None when they state none."""
    if not isinstance(details, Mapping):
        return None
    pss = details.get("podSecurity")
    enforcement = details.get("enforcement")
    if not isinstance(pss, Mapping) or not isinstance(enforcement, Mapping):
        return None
    modes = enforcement.get("modes")
    return {
        "podSecurity": {"level": text(pss.get("level")), "version": text(pss.get("version")) or "latest"},
        "defaultMode": text(enforcement.get("default")),
        "modes": {text(k): text(v) for k, v in modes.items()} if isinstance(modes, Mapping) else {},
        "forbidPlaintextSecrets": details.get("forbidPlaintextSecrets") is not False,
    }


class Revisions:
    """Decisions per revision, the config records of each, and each chain's last config load
    before the period (bounded: at most ``max_keys`` revisions and loads)."""

    def __init__(self, since: str | None, max_keys: int) -> None:
        self.since = since
        self.max_keys = max_keys
        self.decisions: dict[str, list[Any]] = {}  # revision -> [count, first, last]
        self.policies: dict[str, dict[str, Any]] = {}  # revision -> policy
        self.loads: list[tuple[str, str, str]] = []  # (time, chain, revision), config records in period
        self.before: dict[str, tuple[str, str]] = {}  # chain -> (time, revision) last load before since

    def add_decision(self, revision: Any, time: str) -> None:
        name = revision if type(revision) is str and revision else "(none recorded)"
        row = self.decisions.get(name)
        if row is None:
            if len(self.decisions) >= self.max_keys:
                return
            row = self.decisions[name] = [0, time, time]
        row[0] += 1
        if time < row[1]:
            row[1] = time
        if time > row[2]:
            row[2] = time

    def add_config(self, record: Mapping[str, Any], time: str, chain: str, in_period: bool) -> None:
        """A config record (read whether or not it is in the period)."""
        evidence = record.get("evidence")
        details = evidence.get("details") if isinstance(evidence, Mapping) else None
        revision = text(record.get("revision"))
        policy = policy_of(details)
        if not revision:
            return
        if policy is not None and revision not in self.policies and len(self.policies) < self.max_keys:
            self.policies[revision] = policy
        if in_period:
            if len(self.loads) < self.max_keys:
                self.loads.append((time, chain, revision))
        elif self.since is not None and time < self.since:
            known = self.before.get(chain)
            if known is None or time >= known[0]:
                self.before[chain] = (time, revision)

    def merge(self, other: Revisions) -> None:
        for name, (count, first, last) in other.decisions.items():
            row = self.decisions.get(name)
            if row is None:
                if len(self.decisions) < self.max_keys:
                    self.decisions[name] = [count, first, last]
                continue
            row[0] += count
            row[1] = min(row[1], first)
            row[2] = max(row[2], last)
        for name, policy in other.policies.items():
            if name not in self.policies and len(self.policies) < self.max_keys:
                self.policies[name] = policy
        self.loads.extend(other.loads[: max(0, self.max_keys - len(self.loads))])
        for chain, load in other.before.items():
            known = self.before.get(chain)
            if known is None or load[0] >= known[0]:
                self.before[chain] = load

    def timeline(self) -> list[tuple[str, str, str, str]]:
        """(time, level, version, revision) of every known config load, for judging pods."""
        out = []
        for time, _chain, revision in [*((t, c, r) for c, (t, r) in self.before.items()), *self.loads]:
            policy = self.policies.get(revision)
            if policy is not None:
                pss = policy["podSecurity"]
                out.append((time, pss["level"], pss["version"], revision))
        return sorted(out)

    def in_force(self, fallback: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """Every revision in force during the period, oldest first, with its policy (from its
        config record, else from ``fallback`` — the ``--config`` tree, when it is that revision)."""
        names: dict[str, dict[str, Any]] = {}
        for chain, (time, revision) in self.before.items():
            row = names.setdefault(revision, {"loaded": [], "decisions": 0, "first": None, "last": None})
            row["loaded"].append({"time": time, "chain": chain, "beforePeriod": True})
        for time, chain, revision in sorted(self.loads):
            row = names.setdefault(revision, {"loaded": [], "decisions": 0, "first": None, "last": None})
            row["loaded"].append({"time": time, "chain": chain, "beforePeriod": False})
        for revision, (count, first, last) in self.decisions.items():
            row = names.setdefault(revision, {"loaded": [], "decisions": 0, "first": None, "last": None})
            row.update(decisions=count, first=first, last=last)
        out = []
        for revision, row in names.items():
            policy = self.policies.get(revision)
            source = "config record"
            if policy is None and revision in fallback:
                policy, source = fallback[revision], "--config"
            out.append(
                {
                    "revision": revision,
                    "decisions": row["decisions"],
                    "firstDecision": row["first"],
                    "lastDecision": row["last"],
                    "loaded": sorted(row["loaded"], key=lambda x: (x["time"], x["chain"]))[:20],
                    "policy": policy,
                    "policySource": source if policy is not None else None,
                }
            )
        out.sort(key=lambda r: (_start(r), r["revision"]))
        return out


def _start(row: Mapping[str, Any]) -> str:
    times = [x["time"] for x in row["loaded"]] + ([row["firstDecision"]] if row["firstDecision"] else [])
    return min(times) if times else ""

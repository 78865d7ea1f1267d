"""Who created, changed and deleted which jobs: identities and requests from both sources
(mpigate's validate records and the API server's log), bounded whatever the number of users."""

from __future__ import annotations

from collections import deque
from typing import Any

from ._bounded import OTHERS, LimitedCounter
from ._util import merge_recent, most_recent
from .k8saudit import actor_kind

__all__ = ["Activity"]


class Activity:
    """Requests per (source, actor, actor kind, via, verb, kind, result), objects, and the most
    recent requests."""

    def __init__(self, max_keys: int, max_events: int) -> None:
        self.max_keys = max_keys
        self.max_events = max_events
        # (source, actor, actor kind, via, verb, kind, result) -> count
        self.actors: LimitedCounter[tuple[str, ...]] = LimitedCounter(
            max_keys, ("", OTHERS, "", "", "", "", "")
        )
        self.events: deque[tuple[Any, ...]] = deque(maxlen=max_events)  # time at index 1
        self.objects: LimitedCounter[tuple[str, str, str]] = LimitedCounter(max_keys, ("", "", OTHERS))
        self._kinds: dict[str, str] = {}  # username -> actor kind (a cache)

    def actor_kind(self, user: str) -> str:
        kind = self._kinds.get(user)
        if kind is None:
            kind = actor_kind(user)
            if len(self._kinds) < self.max_keys:
                self._kinds[user] = kind
        return kind

    def add(
        self,
        source: str,
        time: str,
        actor: str,
        kind: str,
        via: str,
        verb: str,
        obj_kind: str,
        namespace: str,
        name: str,
        result: str,
        decision: str,
        code: int | None,
        ref: Any = None,
        uid: Any = None,
    ) -> None:
        """One request; ``ref`` is where it is recorded (chain, seq, hash of an mpigate record, or
        the API-server log's file:line), ``uid`` the request's UID (admission) or audit ID."""
        self.actors.add((source, actor, kind, via, verb, obj_kind, result))
        self.objects.add((namespace, obj_kind, name))
        self.events.append(
            (
                source,
                time,
                actor,
                kind,
                via,
                verb,
                obj_kind,
                namespace,
                name,
                result,
                decision,
                code,
                ref,
                uid,
            )
        )

    def merge(self, other: Activity) -> None:
        self.actors.merge(other.actors)
        self.objects.merge(other.objects)
        self.events = merge_recent(self.events, other.events, 1)

    def section(self, api_server: dict[str, Any]) -> dict[str, Any]:
        """The report's ``activity`` section (``api_server``: its ``apiServer`` part)."""
        per_actor: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for (source, actor, kind, via, verb, obj_kind, result), count in self.actors.items():
            row = per_actor.setdefault(
                (source, actor, kind, via),
                {
                    "source": source,
                    "actor": actor,
                    "actorKind": kind,
                    "via": via or None,
                    "create": 0,
                    "update": 0,
                    "delete": 0,
                    "other": 0,
                    "refused": 0,
                    "total": 0,
                    "kinds": set(),
                },
            )
            bucket = (
                verb if verb in ("create", "update", "delete") else ("update" if verb == "patch" else "other")
            )
            row[bucket] += count
            row["total"] += count
            if result != "admitted":
                row["refused"] += count
            if obj_kind:
                row["kinds"].add(obj_kind)
        actors = []
        for row in per_actor.values():
            row["kinds"] = sorted(row["kinds"])
            actors.append(row)
        actors.sort(key=lambda r: (-r["total"], r["source"], r["actor"]))
        events = [
            {
                "source": e[0],
                "time": e[1],
                "actor": e[2],
                "actorKind": e[3],
                "via": e[4] or None,
                "verb": e[5],
                "kind": e[6],
                "namespace": e[7] or None,
                "name": e[8] or None,
                "result": e[9],
                "mpigateDecision": e[10] or None,
                "code": e[11],
                "ref": _ref(e[12]),
                "requestUID": e[13] or None,
            }
            for e in most_recent(list(self.events), self.max_events)
        ]
        return {
            "actors": actors,
            "objects": len(self.objects) - (1 if self.objects.overflowed else 0),
            "objectsOverflowed": self.objects.overflowed > 0,
            "recentEvents": events,
            "apiServer": api_server,
        }


def _ref(ref: Any) -> str | None:
    if isinstance(ref, tuple):
        return f"{ref[0]}:{ref[1]}:{ref[2]}"
    return str(ref) if ref else None

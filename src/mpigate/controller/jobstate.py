"""What the controller must remember of a job to close its run segments exactly, in the forms it
is kept durably (pure).

- On the job itself, in annotations the controller writes after each record (the record first):
  ``mpigate.io/lifecycle`` (transitions recorded), ``mpigate.io/pods`` (:class:`PodFacts` of the
  open segment's pods and when they were last confirmed) and ``mpigate.io/evidence`` (pods whose
  placement was recorded). A tenant who may patch the job may also edit these, so with a key they
  are sealed (``mpigate.io/state-seal``: the audit key's deterministic signature over the job's uid
  and the three values); state whose seal does not match is not used.
- In the ledger (:mod:`.ledger`), for every job with an open segment, the same three values and
  the job's identity, so that a job deleted while the controller was down can still be closed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from .usage import PodFacts, format_time, parse_time

__all__ = [
    "EVIDENCE_ANNOTATION",
    "PODS_ANNOTATION",
    "SEAL_ANNOTATION",
    "STATE_ANNOTATIONS",
    "Sealer",
    "decode_evidence",
    "decode_pods",
    "encode_evidence",
    "encode_pods",
    "seal_payload",
]

PODS_ANNOTATION: Final = "mpigate.io/pods"
EVIDENCE_ANNOTATION: Final = "mpigate.io/evidence"
SEAL_ANNOTATION: Final = "mpigate.io/state-seal"
LIFECYCLE_ANNOTATION: Final = "mpigate.io/lifecycle"
#: The annotations the seal covers, in this order.
STATE_ANNOTATIONS: Final = (LIFECYCLE_ANNOTATION, PODS_ANNOTATION, EVIDENCE_ANNOTATION)
_ENDED: Final = frozenset({"finished", "deleted", "node-lost", "segment-closed", "last-seen"})

#: Signs bytes deterministically (the audit key: HMAC-SHA256 or Ed25519, both deterministic).
Sealer = Callable[[bytes], str]


def _time(value: dt.datetime | None) -> str | None:
    return format_time(value) if value is not None else None


def _range(value: tuple[dt.datetime, dt.datetime] | None) -> list[str] | None:
    return [format_time(value[0]), format_time(value[1])] if value is not None else None


def encode_pods(pods: Iterable[PodFacts], seen: dt.datetime | None) -> str:
    """``{"seen": <time>, "pods": {<uid>: {...}}}`` with short keys (it lives in an annotation)."""
    out: dict[str, Any] = {}
    for p in sorted(pods, key=lambda p: p.uid):
        item: dict[str, Any] = {"n": p.name, "g": p.gpus}
        optional: dict[str, Any] = {
            "r": p.role,
            "node": p.node,
            "sg": p.spec_gpus,
            "s": _time(p.start),
            "sr": _range(p.start_range),
            "e": _time(p.end),
            "er": _range(p.end_range),
            "h": p.ended,
            "x": 1 if p.gone else None,
            "nr": _time(p.not_ready_at),
        }
        item.update({k: v for k, v in optional.items() if v is not None})
        out[p.uid] = item
    return json.dumps({"seen": _time(seen), "pods": out}, separators=(",", ":"), sort_keys=True)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _read_range(value: Any) -> tuple[dt.datetime, dt.datetime] | None:
    if not isinstance(value, list) or len(value) != 2:
        return None
    lo, hi = parse_time(value[0]), parse_time(value[1])
    return (lo, hi) if lo is not None and hi is not None and lo <= hi else None


def decode_pods(text: Any) -> tuple[dict[str, PodFacts], dt.datetime | None]:
    """The pods and the time they were last confirmed; what cannot be read is left out."""
    if not isinstance(text, str) or not text:
        return {}, None
    try:
        doc = json.loads(text)
    except ValueError:
        return {}, None
    if not isinstance(doc, dict):
        return {}, None
    pods: dict[str, PodFacts] = {}
    raw = doc.get("pods")
    for uid, item in (raw if isinstance(raw, dict) else {}).items():
        if not isinstance(uid, str) or not uid or not isinstance(item, dict):
            continue
        gpus, name = _int(item.get("g")), _text(item.get("n"))
        if gpus is None or name is None:
            continue
        ended = item.get("h")
        pods[uid] = PodFacts(
            uid=uid,
            name=name,
            role=_text(item.get("r")),
            node=_text(item.get("node")),
            gpus=gpus,
            spec_gpus=_int(item.get("sg")),
            start=parse_time(item.get("s")),
            start_range=_read_range(item.get("sr")),
            end=parse_time(item.get("e")),
            end_range=_read_range(item.get("er")),
            ended=ended if ended in _ENDED else None,
            gone=item.get("x") == 1,
            not_ready_at=parse_time(item.get("nr")),
        )
    return pods, parse_time(doc.get("seen"))


def encode_evidence(pods: Iterable[str]) -> str:
    return ",".join(sorted(set(pods)))


def decode_evidence(text: Any) -> frozenset[str]:
    return frozenset(filter(None, text.split(","))) if isinstance(text, str) else frozenset()


def seal_payload(uid: str, annotations: Mapping[str, Any]) -> bytes:
    """What the seal signs: a domain tag, the job's uid and the state annotations' values."""
    values = [annotations.get(k) if isinstance(annotations.get(k), str) else None for k in STATE_ANNOTATIONS]
    return b"mpigate-controller-state\x00" + json.dumps([uid, *values], separators=(",", ":")).encode()

"""Builders of audit *entries* (the payload a caller appends; the writer adds the envelope).

An entry is a plain JSON dict with ``source``, ``stage`` and the stage's payload, as described in
docs/audit.md. Secrets never reach the log: env values, token-like strings and anything that looks
like a credential are replaced by ``[REDACTED]`` (names are kept so that the record still says
*which* variable or annotation was involved).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from mpigate.policy.decision import AdmissionInput, Decision

__all__ = [
    "CALLER_STAGES",
    "REDACTED",
    "STAGES",
    "evidence_record",
    "lifecycle_record",
    "record_from_decision",
    "redact",
    "secret_values",
]

REDACTED = "[REDACTED]"
# Stages a caller may append; the writer itself writes genesis, checkpoint and recovered records.
CALLER_STAGES = frozenset({"mutate", "validate", "lifecycle", "evidence"})
STAGES = CALLER_STAGES | {"genesis", "checkpoint", "recovered"}

AdmissionStage = Literal["mutate", "validate"]

_DEFAULT_API_VERSION = {
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    "TrainingRuntime": "trainer.kubeflow.org/v1alpha1",
    "ClusterTrainingRuntime": "trainer.kubeflow.org/v1alpha1",
}
# Keys whose values are credentials wherever they appear (annotations, labels, free-form maps).
_SECRET_KEY = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|credential|api[-_.]?key|private[-_.]?key|auth|bearer|"
    r"access[-_.]?key|session[-_.]?key|cookie|signature|dsn|conn(ection)?[-_.]?string)",
    re.IGNORECASE,
)
# Values that look like credentials whatever key carries them.
_SECRET_VALUE = re.compile(
    r"(eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # JWT
    r"|\b(?:Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}"  # HTTP auth
    r"|\bAKIA[0-9A-Z]{16}\b"  # AWS access key id
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}\b"  # GitHub tokens
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack tokens
    r"|\bhf_[A-Za-z0-9]{20,}\b"  # Hugging Face tokens
    r"|\bsk-[A-Za-z0-9_-]{20,}"  # API keys in the sk-... style
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)"
    r"|\b[a-z][a-z0-9+.-]*://[^\s:/@]+:[^\s@/]+@)",  # credentials in URLs
)
# Literal secrets shorter than this are not scrubbed from free text (too many false hits).
_MIN_SCRUB_LEN = 4


def _walk(value: Any, key: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Yield (key, container, value) for every nested value."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield str(k), value, v
            yield from _walk(v, str(k))
    elif isinstance(value, list | tuple):
        for item in value:
            yield key, value, item
            yield from _walk(item, key)


# ``password=...``, ``token: ...`` inside a larger value (connection strings, command lines).
_INNER_SECRET = re.compile(
    r"(?i)(?:pass(?:word|wd)?|secret|token|api[-_]?key|key)\s*[=:]\s*([^\s;&,'\"]{4,})"
)


def _with_parts(value: str) -> set[str]:
    """A secret value and the secret parts a message might quote on their own (the password of a
    URL, ``password=...`` of a connection string)."""
    parts = {value}
    try:
        password = urllib.parse.urlsplit(value).password
    except ValueError:
        password = None
    if password and len(password) >= _MIN_SCRUB_LEN:
        parts.add(password)
        parts.add(urllib.parse.unquote(password))
    parts.update(m.group(1) for m in _INNER_SECRET.finditer(value))
    return {p for p in parts if len(p) >= _MIN_SCRUB_LEN}


def secret_values(*objects: Mapping[str, Any] | None) -> frozenset[str]:
    """Literal strings of ``objects`` that must never be logged: every env ``value``, every value
    under a credential-like key, every token-looking string (and their secret parts)."""
    found: set[str] = set()
    for obj in objects:
        if obj is None:
            continue
        for key, container, value in _walk(obj):
            if key == "env" and isinstance(value, Mapping):
                literal = value.get("value")
                if isinstance(literal, str) and len(literal) >= _MIN_SCRUB_LEN:
                    found.update(_with_parts(literal))
            elif isinstance(value, str) and len(value) >= _MIN_SCRUB_LEN:
                secret_key = isinstance(container, Mapping) and bool(_SECRET_KEY.search(key))
                if secret_key or _SECRET_VALUE.search(value):
                    found.update(_with_parts(value))
    return frozenset(found)


def _scrub_text(text: str, literals: Iterable[str]) -> str:
    # Longest first, so that a whole value goes before the parts it contains.
    for literal in sorted(literals, key=len, reverse=True):
        if literal in text:
            text = text.replace(literal, REDACTED)
    return _SECRET_VALUE.sub(REDACTED, text)


def _redact_env_var(item: Any) -> Any:
    if isinstance(item, Mapping):
        out = {k: redact(v) for k, v in item.items() if k != "value"}
        if "value" in item:
            out["value"] = REDACTED
        return out
    return REDACTED


def redact(value: Any, literals: frozenset[str] = frozenset(), *, key: str = "") -> Any:
    """A copy of ``value`` without secrets.

    * ``env`` lists keep each variable's ``name`` and ``valueFrom`` reference; ``value`` becomes
      ``[REDACTED]``;
    * strings under credential-like keys (``token``, ``password``, ``apiKey``, ...) are redacted;
    * every string has the ``literals`` (see :func:`secret_values`) and token-like substrings
      replaced.
    """
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            name = str(k)
            if name == "env" and isinstance(v, list | tuple):
                out[name] = [_redact_env_var(item) for item in v]
            elif isinstance(v, str) and _SECRET_KEY.search(name) and name not in _SAFE_KEYS:
                out[name] = REDACTED
            else:
                out[name] = redact(v, literals, key=name)
        return out
    if isinstance(value, list | tuple):
        return [redact(item, literals, key=key) for item in value]
    if isinstance(value, str):
        return _scrub_text(value, literals) if value else value
    return value


# Keys of our own record format that match the credential pattern but carry no secret.
_SAFE_KEYS = frozenset({"op", "path", "from", "authority"})

_ENV_POINTER = re.compile(r"/env(/|$)")


def _redact_patch(patch: Iterable[Mapping[str, Any]], literals: frozenset[str]) -> list[dict[str, Any]]:
    """JSONPatch operations with values that set env redacted (the operation and path stay)."""
    out: list[dict[str, Any]] = []
    for op in patch:
        item = {k: v for k, v in op.items() if k != "value"}
        item = redact(item, literals)
        if "value" in op:
            path = str(op.get("path", ""))
            value = op["value"]
            if _ENV_POINTER.search(path):
                # /…/env (a list), /…/env/3 or /…/env/- (one EnvVar), /…/env/3/value (a literal)
                if path.endswith("/value"):
                    item["value"] = REDACTED
                elif isinstance(value, list | tuple):
                    item["value"] = [_redact_env_var(v) for v in value]
                else:
                    item["value"] = _redact_env_var(value)
            else:
                item["value"] = redact(value, literals, key=path.rsplit("/", 1)[-1])
        out.append(item)
    return out


def _api_version(request: AdmissionInput) -> str:
    for obj in (request.obj, request.old_obj):
        if obj is not None and isinstance(obj.get("apiVersion"), str):
            return str(obj["apiVersion"])
    return _DEFAULT_API_VERSION.get(request.kind, "")


def record_from_decision(
    decision: Decision, request: AdmissionInput, stage: AdmissionStage = "validate", source: str = "webhook"
) -> dict[str, Any]:
    """The audit entry of one admission decision (``stage`` ``mutate`` or ``validate``).

    Append it *before* answering the API server; answer only when the append returned.
    """
    if stage not in ("mutate", "validate"):
        raise ValueError(f"an admission record has stage mutate or validate, not {stage!r}")
    literals = secret_values(request.obj, request.old_obj)
    entry: dict[str, Any] = {
        "source": source,
        "stage": stage,
        "request": {
            "uid": request.uid,
            "operation": request.operation,
            "dryRun": request.dry_run,
            "user": request.user.to_dict(),
        },
        "object": {
            "apiVersion": _api_version(request),
            "kind": request.kind,
            "namespace": request.namespace,
            "name": request.name,
        },
        "team": decision.team,
        "decision": decision.outcome,
        "violations": [v.to_dict() for v in decision.violations],
        "warnings": list(decision.warnings),
        "message": decision.message,
        "exceptions": [e.to_dict() for e in decision.exceptions],
        "patch": _redact_patch(decision.patch, literals),
        "revision": decision.revision,
        "demand": decision.demand.to_dict() if decision.demand else None,
    }
    patch = entry.pop("patch")
    safe: dict[str, Any] = redact(entry, literals)
    safe["patch"] = patch
    # Identities from the API server are kept exactly: a literal that happens to equal a name
    # must not blank out who did what to which object.
    for key in ("request", "object", "team", "revision"):
        safe[key] = entry[key]
    return safe


def lifecycle_record(
    event: str,
    *,
    namespace: str,
    name: str,
    team: str | None,
    uid: str | None = None,
    kind: str = "TrainJob",
    gpus: int | None = None,
    gpu_seconds: float | None = None,
    started: str | None = None,
    finished: str | None = None,
    reason: str | None = None,
    revision: str | None = None,
    source: str = "controller",
    at: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ``lifecycle`` entry: a job ``started``, ``finished``, ``failed``, ``suspended``,
    ``deleted`` ... with its GPU count and consumed GPU-seconds (chargeback).

    ``at`` is when the transition happened (the record's own ``time`` is when it was written,
    which may be later: the controller may see a transition late); omitted when not given.
    ``gpu_seconds`` is what the run segment this record closes consumed (``suspended``,
    ``succeeded``, ``failed``, ``deleted``; see docs/controller.md), so a report adds them up.
    ``labels`` are the job's labels a report groups by — pass the few that matter, such as
    ``mpigate.io/cost-center`` (chargeback by cost center); they land in ``object.labels``."""
    obj: dict[str, Any] = {
        "apiVersion": _DEFAULT_API_VERSION.get(kind, ""),
        "kind": kind,
        "namespace": namespace,
        "name": name,
    }
    if labels:
        obj["labels"] = {str(k): str(v) for k, v in labels.items()}
    entry: dict[str, Any] = {
        "source": source,
        "stage": "lifecycle",
        "object": obj,
        "team": team,
        "lifecycle": {
            "event": event,
            "uid": uid,
            "gpus": gpus,
            "gpuSeconds": gpu_seconds,
            "started": started,
            "finished": finished,
            "reason": reason,
        },
        "revision": revision,
    }
    if at is not None:
        entry["lifecycle"]["at"] = at
    result: dict[str, Any] = redact(entry)
    return result


def evidence_record(
    kind: str,
    *,
    namespace: str,
    name: str,
    team: str | None,
    pod: str | None = None,
    node: str | None = None,
    region: str | None = None,
    zone: str | None = None,
    flavor: str | None = None,
    details: Mapping[str, Any] | None = None,
    source: str = "controller",
) -> dict[str, Any]:
    """An ``evidence`` entry, e.g. ``kind="placement"``: pod X of job Y ran on node Z in region R
    (data residency evidence)."""
    entry: dict[str, Any] = {
        "source": source,
        "stage": "evidence",
        "object": {
            "apiVersion": _DEFAULT_API_VERSION["TrainJob"],
            "kind": "TrainJob",
            "namespace": namespace,
            "name": name,
        },
        "team": team,
        "evidence": {
            "kind": kind,
            "pod": pod,
            "node": node,
            "region": region,
            "zone": zone,
            "flavor": flavor,
            "details": dict(details) if details else {},
        },
    }
    result: dict[str, Any] = redact(entry)
    return result

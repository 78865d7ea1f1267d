"""Builders of audit *entries* (the payload a caller appends; the writer adds the envelope).

An entry is a plain JSON dict with ``source``, ``stage`` and the stage's payload, as described in
docs/audit.md. Secrets never reach the log: env values, token-like strings and anything that looks
like a credential are replaced by ``[REDACTED]`` (names are kept so that the record still says
*which* variable or annotation was involved).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Literal

from mpigate.catalogue import all_rules
from mpigate.config.model import Config
from mpigate.policy.decision import AdmissionInput, Decision
from mpigate.trainjob.jsontypes import is_mapping

__all__ = [
    "CALLER_STAGES",
    "REDACTED",
    "STAGES",
    "config_record",
    "evidence_record",
    "lifecycle_record",
    "policy_summary",
    "record_from_decision",
    "redact",
    "secret_values",
]

REDACTED = "[REDACTED]"
# Stages a caller may append; the writer itself writes genesis, checkpoint and recovered records.
CALLER_STAGES = frozenset({"mutate", "validate", "lifecycle", "evidence", "retention"})
STAGES = CALLER_STAGES | {"genesis", "checkpoint", "recovered"}

AdmissionStage = Literal["mutate", "validate"]

_DEFAULT_API_VERSION = {
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    "TrainingRuntime": "trainer.kubeflow.org/v1alpha1",
    "ClusterTrainingRuntime": "trainer.kubeflow.org/v1alpha1",
    "MPIJob": "kubeflow.org/v2beta1",
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
# Pattern checks are memoized for keys and for strings that turned out to hold no token, up to
# this length: a record walks the whole object, whose keys and most values (images, commands,
# names) repeat from request to request. A string that matches a pattern, an env value and
# anything longer are checked every time and never held in memory: the memos keep only what the
# audit record itself would write out.
_MEMO_MAX_LEN = 256
_MEMO_SIZE = 4096
_PLAIN: set[str] = set()  # strings known to hold nothing _SECRET_VALUE matches


@lru_cache(maxsize=_MEMO_SIZE)
def _secret_key_memo(key: str) -> bool:
    return _SECRET_KEY.search(key) is not None


def _secret_key(key: str) -> bool:
    """Whether a key names a credential (``token``, ``password``, ``apiKey``, ...)."""
    return _secret_key_memo(key) if len(key) <= _MEMO_MAX_LEN else _SECRET_KEY.search(key) is not None


def _remember_plain(text: str) -> None:
    if len(text) <= _MEMO_MAX_LEN:
        if len(_PLAIN) >= _MEMO_SIZE:
            _PLAIN.clear()
        _PLAIN.add(text)


def _secret_value(value: str) -> bool:
    """Whether a string looks like a credential whatever key carries it."""
    if value in _PLAIN:
        return False
    if _SECRET_VALUE.search(value) is not None:
        return True
    _remember_plain(value)
    return False


def _scrub_tokens(text: str) -> str:
    """``text`` with every token-like substring replaced."""
    if text in _PLAIN:
        return text
    scrubbed = _SECRET_VALUE.sub(REDACTED, text)
    if scrubbed == text:
        _remember_plain(text)
    return scrubbed


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
        if obj is not None:
            _collect_secrets(obj, "", found)
    return frozenset(found)


def _collect_secrets(
    container: Mapping[str, Any] | list[Any] | tuple[Any, ...], key: str, found: set[str]
) -> None:
    """Add the secrets nested in ``container`` (found under ``key``) to ``found``: each string
    under a credential-like key of a mapping, each token-looking string, the ``value`` of each
    mapping under an ``env`` key. One frame per level of nesting."""
    env_var = False
    if is_mapping(container):
        pairs: Iterable[tuple[str, Any, bool]] = ((str(k), v, True) for k, v in container.items())
        env_var = key == "env"
    else:
        pairs = ((key, item, False) for item in container)
    for name, value, in_mapping in pairs:
        if isinstance(value, str):
            if env_var and name == "value":
                continue  # the env var's literal: collected with its parts by the caller
            if len(value) >= _MIN_SCRUB_LEN and ((in_mapping and _secret_key(name)) or _secret_value(value)):
                found.update(_with_parts(value))
        elif is_mapping(value):
            if name == "env":
                literal = value.get("value")
                if isinstance(literal, str) and len(literal) >= _MIN_SCRUB_LEN:
                    found.update(_with_parts(literal))
            _collect_secrets(value, name, found)
        elif isinstance(value, list | tuple):
            _collect_secrets(value, name, found)


def _longest_first(literals: Iterable[str]) -> tuple[str, ...]:
    # Longest first, so that a whole value goes before the parts it contains.
    return tuple(sorted(literals, key=len, reverse=True))


def _scrub_text(text: str, ordered: tuple[str, ...]) -> str:
    for literal in ordered:
        if literal in text:
            text = text.replace(literal, REDACTED)
    return _scrub_tokens(text)


def _redact_env_var(item: Any) -> Any:
    if is_mapping(item):
        out = {k: _redact(v, (), "") for k, v in item.items() if k != "value"}
        if "value" in item:
            out["value"] = REDACTED
        return out
    return REDACTED


def redact(value: Any, literals: Iterable[str] = frozenset(), *, key: str = "") -> Any:
    """A copy of ``value`` without secrets.

    * ``env`` lists keep each variable's ``name`` and ``valueFrom`` reference; ``value`` becomes
      ``[REDACTED]``;
    * strings under credential-like keys (``token``, ``password``, ``apiKey``, ...) are redacted;
    * every string has the ``literals`` (see :func:`secret_values`) and token-like substrings
      replaced.
    """
    return _redact(value, _longest_first(literals), key)


def _redact(value: Any, ordered: tuple[str, ...], key: str) -> Any:
    """:func:`redact` with the literals longest first (sorted once per record)."""
    if isinstance(value, str):
        return _scrub_text(value, ordered) if value else value
    if is_mapping(value):
        out: dict[str, Any] = {}
        for k, v in value.items():
            name = str(k)
            if name == "env" and isinstance(v, list | tuple):
                out[name] = [_redact_env_var(item) for item in v]
            elif isinstance(v, str) and name not in _SAFE_KEYS and _secret_key(name):
                out[name] = REDACTED
            else:
                out[name] = _redact(v, ordered, name)
        return out
    if isinstance(value, list | tuple):
        return [_redact(item, ordered, key) for item in value]
    return value


# Keys of our own record format that match the credential pattern but carry no secret.
_SAFE_KEYS = frozenset({"op", "path", "from", "authority"})

_ENV_POINTER = re.compile(r"/env(/|$)")


def _redact_patch(patch: Iterable[Mapping[str, Any]], ordered: tuple[str, ...]) -> list[dict[str, Any]]:
    """JSONPatch operations with values that set env redacted (the operation and path stay)."""
    out: list[dict[str, Any]] = []
    for op in patch:
        item = {k: v for k, v in op.items() if k != "value"}
        item = _redact(item, ordered, "")
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
                item["value"] = _redact(value, ordered, path.rsplit("/", 1)[-1])
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
    literals = _longest_first(secret_values(request.obj, request.old_obj))
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
    if decision.audit_annotations:
        # the ValidatingAdmissionPolicies' auditAnnotations (<policy>/<key>), as the API server adds
        # them to its audit event for a request it judges itself
        entry["auditAnnotations"] = dict(decision.audit_annotations)
    patch = entry.pop("patch")
    safe: dict[str, Any] = _redact(entry, literals, "")
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
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``lifecycle`` entry: a job ``started``, ``finished``, ``failed``, ``suspended``,
    ``deleted`` ... with its GPU count and consumed GPU-seconds (chargeback).

    ``at`` is when the transition happened (the record's own ``time`` is when it was written,
    which may be later: the controller may see a transition late); omitted when not given.
    ``gpu_seconds`` is what the run segment this record closes consumed (``suspended``,
    ``succeeded``, ``failed``, ``deleted``; see docs/controller.md), so a report adds them up.
    ``labels`` are the job's labels a report groups by — pass the few that matter, such as
    ``mpigate.io/cost-center`` (chargeback by cost center); they land in ``object.labels``.
    ``details`` adds further ``lifecycle`` fields (the segment, its usage over time and per day, how
    its figure is known: docs/controller.md, "Lifecycle records")."""
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
    if details:
        entry["lifecycle"].update({k: v for k, v in details.items() if k not in entry["lifecycle"]})
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
    job_kind: str = "TrainJob",
) -> dict[str, Any]:
    """An ``evidence`` entry, e.g. ``kind="placement"``: pod X of job Y (a ``job_kind``) ran on node
    Z in region R (data residency evidence)."""
    entry: dict[str, Any] = {
        "source": source,
        "stage": "evidence",
        "object": {
            "apiVersion": _DEFAULT_API_VERSION.get(job_kind, ""),
            "kind": job_kind,
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


def policy_summary(config: Config) -> dict[str, Any]:
    """What a config revision enforces, as a compliance report needs it: the Pod Security level
    and version, whether literal credentials are refused, and the mode of every rule of the
    catalogue (the most specific override resolved; advisory rules never deny)."""
    org = config.org
    enforcement = org.enforcement
    return {
        "podSecurity": {"level": org.security.level, "version": org.security.version},
        "forbidPlaintextSecrets": org.security.forbid_plaintext_secrets,
        "enforcement": {
            "default": enforcement.default,
            "modes": {rule_id: enforcement.mode_for(rule_id) for rule_id in sorted(all_rules())},
        },
    }


def config_record(config: Config, source: str = "webhook") -> dict[str, Any]:
    """An ``evidence`` entry of kind ``config``: the writer started serving ``config.revision``,
    which enforces :func:`policy_summary`. The webhook appends one at start and at every reload,
    so that a report knows the rule modes and Pod Security level of every revision in force
    (the config at report time is not the config in force)."""
    return {
        "source": source,
        "stage": "evidence",
        "team": None,
        "revision": config.revision,
        "evidence": {"kind": "config", "details": policy_summary(config)},
    }

"""AdmissionReview ``admission.k8s.io/v1``: decoding requests and encoding responses.

Pure functions over plain JSON values, no transport. Everything the API server sends is
checked field by field, and every problem becomes a :class:`BadReview` value that says where
it is; the server turns it into an HTTP 400 (uid unknown) or a denying AdmissionReview (uid
known). Responses follow ``k8s.io/api/admission/v1`` exactly: ``uid`` echoed, ``allowed``,
``status`` (a ``metav1.Status``), ``warnings``, ``patchType``/``patch`` (mutation only, only
when non-empty) and ``auditAnnotations``.

Two API-server limits shape the output:

- each warning should stay within 120 characters (longer ones are cut by clients and the
  server), and all warnings of a request within 4 KiB — :func:`fit_warnings` splits long texts
  into continuation lines instead of losing their end;
- ``auditAnnotations`` keys are prefixed by the API server with ``<webhook name>/``, so a key
  must be a plain qualified name without a prefix (``decision``, not ``mpigate.io/decision``):
  the audit event then carries e.g. ``validate.team.mpigate.io/decision``.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import orjson

from mpigate.policy.decision import AdmissionInput, Decision, Operation, UserInfo

from .routes import RESOURCES

__all__ = [
    "ADMISSION_API_VERSION",
    "ANNOTATION_DECISION",
    "ANNOTATION_DRY_RUN",
    "ANNOTATION_EXCEPTIONS",
    "ANNOTATION_PATCH",
    "ANNOTATION_RECORD",
    "ANNOTATION_REVISION",
    "ANNOTATION_RULES",
    "MAX_WARNING_CHARS",
    "REVIEW_KIND",
    "BadReview",
    "ResourceSpec",
    "ReviewRequest",
    "Stage",
    "audit_annotations",
    "decision_response",
    "decode_review",
    "encode_json",
    "error_response",
    "fit_warnings",
    "parse_json",
    "resource_for",
    "response_review",
]

ADMISSION_API_VERSION: Final = "admission.k8s.io/v1"
REVIEW_KIND: Final = "AdmissionReview"
Stage = Literal["mutate", "validate"]

MAX_WARNING_CHARS: Final = 120
MAX_WARNINGS_TOTAL_CHARS: Final = 4096
# Audit annotation values: the API server stores them in every audit event of the request.
MAX_ANNOTATION_VALUE_CHARS: Final = 1024
# A denial message is shown by kubectl; past this it is cut (the audit record keeps it whole).
MAX_STATUS_MESSAGE_CHARS: Final = 16 * 1024
# A uid is a UUID; anything far longer is not one and is not echoed back.
MAX_UID_CHARS: Final = 256

ANNOTATION_DECISION: Final = "decision"
ANNOTATION_RULES: Final = "rules"
ANNOTATION_REVISION: Final = "revision"
ANNOTATION_EXCEPTIONS: Final = "exceptions"
ANNOTATION_DRY_RUN: Final = "dry-run"
ANNOTATION_PATCH: Final = "patch"
# The decision's durable audit record, ``<chain>:<seq>:<hash>`` (admission.recorder.RecordPosition).
ANNOTATION_RECORD: Final = "record"

OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT")
REASONS: Final = {
    400: "BadRequest",
    403: "Forbidden",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """One resource the webhooks judge (a row of :data:`routes.RESOURCES`)."""

    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


_RESOURCES: Final = tuple(ResourceSpec(*row) for row in RESOURCES)


def resource_for(group: str, version: str, resource: str) -> ResourceSpec | None:
    """The judged resource with this group/version/resource, if any."""
    for spec in _RESOURCES:
        if (spec.group, spec.version, spec.resource) == (group, version, resource):
            return spec
    return None


@dataclass(frozen=True, slots=True)
class BadReview:
    """A request the server cannot judge. ``uid`` is set when it could be read (then the answer
    is a denying AdmissionReview with code 400), else the answer is HTTP 400. ``path`` says
    where the problem is (``request.object.kind``)."""

    message: str
    path: str = ""
    uid: str | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@dataclass(frozen=True, slots=True)
class ReviewRequest:
    """A decoded, checked admission request."""

    uid: str
    resource: ResourceSpec
    input: AdmissionInput

    @property
    def operation(self) -> Operation:
        return self.input.operation


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON of a JSON value: orjson (several times faster), else the standard
    library for what orjson refuses — integers beyond 64 bits and lone surrogates, both of which
    :func:`parse_json` accepts — escaped to ASCII, so that any decoded value encodes again."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, separators=(",", ":")).encode()


def parse_json(body: bytes) -> Any | BadReview:
    """Decode a request body as strict JSON (UTF-8; no NaN/Infinity)."""
    try:
        # orjson is several times faster and accepts exactly the strict JSON that the standard
        # library path below accepts, except integers beyond 64 bits and lone surrogate escapes:
        # anything orjson refuses goes through that path, which decides (and words the errors).
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadReview(f"body is not UTF-8: {exc.reason} at byte {exc.start}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        return BadReview("body is not valid JSON: nested too deeply")
    except json.JSONDecodeError as exc:
        return BadReview(f"body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")
    except ValueError as exc:  # parse_constant, or an integer longer than Python's digit limit
        return BadReview(f"body is not valid JSON: {_short(str(exc), 120)}")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _short(text: str, limit: int = 80) -> str:
    text = _CONTROL.sub(" ", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(value: Any) -> str:
    """A user-supplied value, quoted and cut, for messages."""
    if isinstance(value, str):
        return json.dumps(_short(value, 60))
    return _type_name(value)


class _Bad(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def _get(
    obj: Mapping[str, Any], key: str, path: str, kind: type | tuple[type, ...], *, required: bool
) -> Any:
    value = obj.get(key)
    if value is None:
        if required:
            raise _Bad(f"{path}.{key}", "is required")
        return None
    if type(value) is kind:  # the common case, decoded JSON of the expected type
        return value
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        expected = (
            "object" if kind is dict else "string" if kind is str else "boolean" if kind is bool else "array"
        )
        raise _Bad(f"{path}.{key}", f"must be {expected}, got {_type_name(value)}")
    return value


def _str(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str:
    value = _get(obj, key, path, str, required=required)
    return cast(str, value) if value is not None else ""


def decode_review(data: Any) -> ReviewRequest | BadReview:
    """Check an AdmissionReview v1 and turn its request into an :class:`AdmissionInput`."""
    if not isinstance(data, dict):
        return BadReview(f"expected an AdmissionReview object, got {_type_name(data)}")
    api_version = data.get("apiVersion")
    kind = data.get("kind")
    if api_version != ADMISSION_API_VERSION or kind != REVIEW_KIND:
        return BadReview(
            f"expected apiVersion {ADMISSION_API_VERSION} and kind {REVIEW_KIND}, got "
            f"{_show(api_version)} and {_show(kind)} (set admissionReviewVersions: [v1] in the "
            "webhook configuration)"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        return BadReview(f"must be an object, got {_type_name(request)}", "request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid.strip():
        return BadReview(f"must be a non-empty string, got {_show(uid)}", "request.uid")
    if len(uid) > MAX_UID_CHARS or _CONTROL.search(uid):
        return BadReview(f"is not a UID ({len(uid)} characters)", "request.uid")
    try:
        return _decode_request(uid, request)
    except _Bad as bad:
        return BadReview(bad.message, bad.path, uid)


def _decode_request(uid: str, request: dict[str, Any]) -> ReviewRequest:
    path = "request"
    kind = _get(request, "kind", path, dict, required=True)
    resource = _get(request, "resource", path, dict, required=True)
    group = _str(resource, "group", f"{path}.resource")
    version = _str(resource, "version", f"{path}.resource", required=True)
    plural = _str(resource, "resource", f"{path}.resource", required=True)
    sub = _str(request, "subResource", path)
    if sub:
        shown = f"{group}/{version}" if group else version
        raise _Bad(
            f"{path}.resource",
            f"mpigate does not judge subresources ({shown}, resource {plural}/{sub}); it judges "
            + ", ".join(f"{r.resource}.{r.group}/{r.version}" for r in _RESOURCES)
            + " (check the rules of the webhook configuration)",
        )
    kind_name = _str(kind, "kind", f"{path}.kind", required=True)
    spec = resource_for(group, version, plural)
    if spec is None:
        # Not an object the engine understands (a version or kind the webhook configuration sends
        # but mpigate does not judge): decoded as sent, so that the engine answers it with
        # MPG-API-001 (denied unless the org configures otherwise), as explain and review do.
        spec = ResourceSpec(group, version, plural, kind_name, bool(request.get("namespace")))
    elif kind_name != spec.kind:
        raise _Bad(f"{path}.kind.kind", f"expected {spec.kind} for resource {plural}, got {_show(kind_name)}")
    operation = _str(request, "operation", path, required=True)
    if operation not in OPERATIONS:
        raise _Bad(f"{path}.operation", f"must be one of {', '.join(OPERATIONS)}, got {_show(operation)}")
    namespace = _str(request, "namespace", path)
    name = _str(request, "name", path)
    dry_run = _get(request, "dryRun", path, bool, required=False)
    user = _decode_user(request.get("userInfo"), f"{path}.userInfo")
    obj = _decode_object(request, "object", spec, required=operation in ("CREATE", "UPDATE"))
    old = _decode_object(request, "oldObject", spec, required=operation == "UPDATE")
    if spec.namespaced and not namespace:
        raise _Bad(f"{path}.namespace", f"is required for the namespaced kind {spec.kind}")
    if not name:
        meta = (obj or old or {}).get("metadata") or {}
        name = meta.get("name") or meta.get("generateName") or ""
    return ReviewRequest(
        uid=uid,
        resource=spec,
        input=AdmissionInput(
            operation=cast(Operation, operation),
            kind=spec.kind,
            namespace=namespace if spec.namespaced else None,
            name=name,
            obj=obj,
            old_obj=old,
            user=user,
            uid=uid,
            dry_run=bool(dry_run),
        ),
    )


def _decode_user(value: Any, path: str) -> UserInfo:
    if value is None:
        return UserInfo()
    if not isinstance(value, dict):
        raise _Bad(path, f"must be an object, got {_type_name(value)}")
    groups = _get(value, "groups", path, list, required=False) or []
    for i, group in enumerate(groups):
        if not isinstance(group, str):
            raise _Bad(f"{path}.groups[{i}]", f"must be a string, got {_type_name(group)}")
    return UserInfo(
        username=_str(value, "username", path), groups=tuple(groups), uid=_str(value, "uid", path)
    )


def _decode_object(
    request: dict[str, Any], key: str, spec: ResourceSpec, *, required: bool
) -> dict[str, Any] | None:
    path = f"request.{key}"
    obj = _get(request, key, "request", dict, required=required)
    if obj is None:
        return None
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if api_version != spec.api_version or kind != spec.kind:
        raise _Bad(
            path,
            f"expected a {spec.kind} ({spec.api_version}), "
            f"got kind {_show(kind)} apiVersion {_show(api_version)}",
        )
    meta = _get(obj, "metadata", path, dict, required=True)
    meta_path = f"{path}.metadata"
    for field in ("name", "namespace", "generateName"):
        _str(meta, field, meta_path)
    for field in ("labels", "annotations"):
        mapping = _get(meta, field, meta_path, dict, required=False) or {}
        for k, v in mapping.items():
            if not isinstance(v, str):
                raise _Bad(f"{meta_path}.{field}[{_show(k)}]", f"must be a string, got {_type_name(v)}")
    _get(obj, "spec", path, dict, required=False)
    return cast(dict[str, Any], obj)


# --------------------------------------------------------------------------------------- responses


def _status(code: int, message: str) -> dict[str, Any]:
    return {
        "metadata": {},
        "status": "Success" if code < 300 else "Failure",
        "code": code,
        "reason": REASONS.get(code, "Unknown") if code >= 300 else "",
        "message": _short_block(message, MAX_STATUS_MESSAGE_CHARS),
    }


def _short_block(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def response_review(
    uid: str,
    *,
    allowed: bool,
    code: int | None = None,
    message: str = "",
    warnings: Sequence[str] = (),
    patch: Sequence[Mapping[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An AdmissionReview v1 response. ``patch`` (JSONPatch operations) is encoded only when
    non-empty, with ``patchType: JSONPatch``; ``code`` defaults to 200 (allowed) or 403."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed or code is not None or message:
        response["status"] = _status(code if code is not None else (200 if allowed else 403), message)
    if warnings:
        response["warnings"] = fit_warnings(warnings)
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(encode_json([dict(op) for op in patch])).decode("ascii")
    if annotations:
        response["auditAnnotations"] = _check_annotations(annotations)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": REVIEW_KIND, "response": response}


def error_response(uid: str, code: int, message: str) -> dict[str, Any]:
    """A denying response for a request mpigate could not judge (malformed: 400)."""
    return response_review(uid, allowed=False, code=code, message=message)


def _check_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in annotations.items():
        if not _QUALIFIED_NAME.match(key):  # a programming error, not user input
            raise ValueError(f"audit annotation key {key!r} is not a qualified name without prefix")
        out[key] = _short(value, MAX_ANNOTATION_VALUE_CHARS)
    return out


def audit_annotations(
    decision: Decision, stage: Stage, *, dry_run: bool = False, record: str | None = None
) -> dict[str, str]:
    """``auditAnnotations`` of a decision: outcome, rules hit, config revision (plus the
    exceptions used, the patch size on mutation, a dry-run mark, and ``record``: the chain
    position of the decision's audit record, when it has one)."""
    out: dict[str, str] = {}
    if stage == "validate":
        out[ANNOTATION_DECISION] = decision.outcome
        out[ANNOTATION_RULES] = _join_capped(decision.rule_ids, MAX_ANNOTATION_VALUE_CHARS)
        if decision.exceptions:
            out[ANNOTATION_EXCEPTIONS] = _join_capped([e.name for e in decision.exceptions], 512)
    else:
        out[ANNOTATION_PATCH] = f"{len(decision.patch)} operations"
    out[ANNOTATION_REVISION] = _short(decision.revision, 128)
    if dry_run:
        out[ANNOTATION_DRY_RUN] = "true"
    if record is not None:
        out[ANNOTATION_RECORD] = record
    return out


def _join_capped(items: Sequence[str], limit: int) -> str:
    """Comma-joined, with ``+N more`` instead of cutting an item in half."""
    out: list[str] = []
    used = 0
    for i, item in enumerate(items):
        rest = len(items) - i
        tail = f",+{rest} more"
        if used + len(item) + 1 + (len(tail) if rest > 1 else 0) > limit:
            out.append(f"+{rest} more")
            break
        out.append(item)
        used += len(item) + 1
    return ",".join(out)


def decision_response(
    uid: str,
    decision: Decision,
    stage: Stage,
    *,
    dry_run: bool = False,
    extra_warnings: Iterable[str] = (),
    record: str | None = None,
) -> dict[str, Any]:
    """The answer for a decision.

    ``validate`` answers the verdict: denials carry code 403 ``Forbidden`` and the engine's
    message; warnings go to ``response.warnings``. ``mutate`` always allows (the validating
    webhook, which sees the patched object, gives the verdict, so a user reads each denial and
    warning once) and returns the patch.
    """
    annotations = audit_annotations(decision, stage, dry_run=dry_run, record=record)
    if stage == "mutate":
        return response_review(uid, allowed=True, patch=decision.patch, annotations=annotations)
    warnings = [*decision.warnings, *extra_warnings]
    if decision.allowed:
        return response_review(uid, allowed=True, warnings=warnings, annotations=annotations)
    message = decision.message or "denied by mpigate policy: " + ", ".join(decision.rule_ids)
    return response_review(
        uid, allowed=False, code=403, message=message, warnings=warnings, annotations=annotations
    )


def fit_warnings(texts: Iterable[str]) -> list[str]:
    """Warnings as the API server passes them on: printable, each ≤ 120 characters, 4 KiB in all.

    A long warning is split at word boundaries into continuation lines (``… rest``) rather than
    cut, so that kubectl shows all of it; past the total budget one final line says how many
    were left out.
    """
    out: list[str] = []
    total = 0
    items = [t for t in (_CONTROL.sub(" ", str(t)).strip() for t in texts) if t]
    for index, text in enumerate(items):
        lines = _split_line(text, MAX_WARNING_CHARS)
        size = sum(len(line) for line in lines)
        if total + size > MAX_WARNINGS_TOTAL_CHARS - 80:
            left = len(items) - index
            out.append(f"… {left} more warning{'s' if left != 1 else ''} not shown (see the audit record)")
            break
        out.extend(lines)
        total += size
    return out


def _split_line(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    lines: list[str] = []
    prefix = ""
    rest = text
    while rest:
        room = width - len(prefix)
        if len(rest) <= room:
            lines.append(prefix + rest)
            break
        cut = rest.rfind(" ", max(1, math.floor(room * 0.6)), room + 1)
        if cut <= 0:
            cut = room
        lines.append(prefix + rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
        prefix = "… "
    return lines

"""A small AdmissionReview client: replay objects through a running webhook as the API server
would (``/mutate`` on CREATE, apply the returned JSONPatch, then ``/validate``), and print the
outcome the way ``kubectl`` shows it. Used by ``mpigate review``, the demo and the tests.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpigate.policy import JsonPatchError, apply_patch
from mpigate.policy.decision import UserInfo

from .review import ADMISSION_API_VERSION, REVIEW_KIND, ResourceSpec
from .routes import MUTATE_PATH, ROUTED, VALIDATE_PATH

__all__ = [
    "ReplayResult",
    "ReviewClient",
    "ReviewClientError",
    "apply_review_patch",
    "format_outcome",
    "make_review",
    "replay",
    "resource_of",
    "summarize",
]


class ReviewClientError(Exception):
    """The server could not be reached or answered something that is not an AdmissionReview."""


def resource_of(obj: Mapping[str, Any]) -> ResourceSpec | None:
    """The resource an object is sent to the webhooks as, when the install base routes its group and
    kind (:data:`routes.ROUTED`, every version: the webhook answers a version it does not
    understand with MPG-API-001, so it is sent like any other)."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    group, _, version = api_version.rpartition("/")
    for routed_group, resource, routed_kind, namespaced in ROUTED:
        if (group, kind) == (routed_group, routed_kind) and version:
            return ResourceSpec(group, version, resource, kind, namespaced)
    return None


def make_review(
    obj: Mapping[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    user: UserInfo | None = None,
    dry_run: bool = False,
    uid: str | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """An AdmissionReview v1 request for ``obj`` as the API server builds it."""
    subject = obj if obj is not None else old
    if subject is None:
        raise ValueError("an object or an old object is needed")
    spec = resource_of(subject)
    if spec is None:
        raise ValueError(
            f"the webhooks are not sent {subject.get('kind')} {subject.get('apiVersion')} (routes.ROUTED)"
        )
    meta = subject.get("metadata") or {}
    ns = (namespace or meta.get("namespace") or "default") if spec.namespaced else ""
    user = user or UserInfo(username="kubernetes-admin", groups=("system:masters", "system:authenticated"))
    gvk = {"group": spec.group, "version": spec.version, "kind": spec.kind}
    gvr = {"group": spec.group, "version": spec.version, "resource": spec.resource}

    def with_ns(o: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if o is None:
            return None
        out = json.loads(json.dumps(o))
        if spec.namespaced:
            out.setdefault("metadata", {})["namespace"] = ns
        return out  # type: ignore[no-any-return]

    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": meta.get("name", ""),
        "operation": operation,
        "userInfo": user.to_dict(),
        "object": with_ns(obj),
        "oldObject": with_ns(old),
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
    }
    if spec.namespaced:
        request["namespace"] = ns
    return {"apiVersion": ADMISSION_API_VERSION, "kind": REVIEW_KIND, "request": request}


def apply_review_patch(obj: Mapping[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with the response's JSONPatch applied (a copy; ``obj`` itself is untouched)."""
    copy: dict[str, Any] = json.loads(json.dumps(obj))
    patch = response.get("patch")
    if not patch:
        return copy
    if response.get("patchType") != "JSONPatch":
        raise ReviewClientError(f"unsupported patchType {response.get('patchType')!r}")
    ops = json.loads(base64.b64decode(patch))
    patched: dict[str, Any] = apply_patch(copy, ops)
    return patched


def _certificate_hint(exc: ssl.SSLCertVerificationError, host: str) -> str:
    """Why the webhook's certificate was refused, and what to do about it."""
    reason = exc.verify_message or str(exc)
    if "mismatch" in reason:
        fix = (
            f"the serving certificate does not name {host}: issue it with "
            f"`mpigate certs ... --extra-name {host}`, or use a name it holds "
            "(`openssl x509 -noout -ext subjectAltName -in tls.crt` lists them)"
        )
    elif "issuer" in reason or "self-signed" in reason or "self signed" in reason:
        fix = "the certificate's CA is not trusted: pass --ca with the CA that issued it (certs/ca.crt)"
    elif "expired" in reason:
        fix = "the serving certificate has expired: rotate it with `mpigate certs --out DIR` (the CA is kept)"
    else:
        fix = "check --ca and the serving certificate"
    return f"TLS verification of the webhook failed ({reason}); {fix}"


class ReviewClient:
    """POSTs AdmissionReviews to a webhook over HTTPS (keep-alive), as the API server does."""

    def __init__(
        self, server: str, *, ca_file: str | None = None, timeout: float = 10.0, insecure: bool = False
    ) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ReviewClientError(f"server must be an https:// URL, got {server!r}")
        self.base = url.path.rstrip("/")
        self._host = url.hostname
        if url.scheme == "https":
            ctx = ssl.create_default_context(cafile=ca_file)
            if insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                url.hostname, url.port or 443, context=ctx, timeout=timeout
            )
        else:
            self._conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)

    def close(self) -> None:
        self._conn.close()

    def post(self, path: str, review: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        body = json.dumps(review).encode()
        try:
            self._conn.request(
                "POST", self.base + path, body=body, headers={"Content-Type": "application/json"}
            )
            resp = self._conn.getresponse()
            raw = resp.read()
        except ssl.SSLCertVerificationError as exc:
            self._conn.close()
            raise ReviewClientError(_certificate_hint(exc, self._host)) from exc
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            raise ReviewClientError(f"cannot reach the webhook: {exc}") from exc
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ReviewClientError(f"HTTP {resp.status}: the answer is not JSON") from exc
        if not isinstance(data, dict):
            raise ReviewClientError(f"HTTP {resp.status}: the answer is not a JSON object")
        return resp.status, data


@dataclass
class ReplayResult:
    """What the API server would have done with one object."""

    name: str
    kind: str
    namespace: str | None
    operation: str
    allowed: bool
    patched: dict[str, Any] | None
    mutate: dict[str, Any] | None = None
    validate: dict[str, Any] | None = None
    patch_ops: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "namespace": self.namespace,
            "operation": self.operation,
            "allowed": self.allowed,
            "patch": self.patch_ops,
            "warnings": self.warnings,
            "message": self.message,
            "error": self.error,
            "auditAnnotations": (self.validate or {}).get("auditAnnotations", {}),
        }


def _response(status: int, data: dict[str, Any], stage: str) -> dict[str, Any]:
    if status != 200:
        message = data.get("message") or f"HTTP {status}"
        raise ReviewClientError(f"{stage}: HTTP {status}: {message}")
    response = data.get("response")
    if data.get("kind") != REVIEW_KIND or not isinstance(response, dict):
        raise ReviewClientError(f"{stage}: the answer is not an AdmissionReview")
    return response


def replay(
    client: ReviewClient,
    obj: Mapping[str, Any],
    *,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    user: UserInfo | None = None,
    dry_run: bool = False,
    namespace: str | None = None,
) -> ReplayResult:
    """Send ``obj`` through /mutate (CREATE) and /validate as the API server would."""
    meta = obj.get("metadata") or {}
    spec = resource_of(obj)
    result = ReplayResult(
        name=str(meta.get("name", "")),
        kind=str(obj.get("kind", "")),
        namespace=(namespace or meta.get("namespace") or "default") if spec and spec.namespaced else None,
        operation=operation,
        allowed=False,
        patched=None,
    )
    current: dict[str, Any] = json.loads(json.dumps(obj))
    try:
        if operation == "CREATE":
            review = make_review(
                current, operation=operation, old=old, user=user, dry_run=dry_run, namespace=namespace
            )
            mutate = _response(*client.post(MUTATE_PATH, review), "mutate")
            result.mutate = mutate
            if not mutate.get("allowed"):
                result.message = (mutate.get("status") or {}).get("message", "")
                result.warnings = list(mutate.get("warnings") or [])
                return result
            if mutate.get("patch"):
                result.patch_ops = json.loads(base64.b64decode(mutate["patch"]))
            current = apply_review_patch(current, mutate)
        review = make_review(
            None if operation == "DELETE" else current,
            operation=operation,
            old=old,
            user=user,
            dry_run=dry_run,
            namespace=namespace,
        )
        validate = _response(*client.post(VALIDATE_PATH, review), "validate")
    except (ReviewClientError, ValueError, JsonPatchError) as exc:
        result.error = str(exc)
        return result
    result.validate = validate
    result.allowed = bool(validate.get("allowed"))
    result.warnings = [*list((result.mutate or {}).get("warnings") or []), *(validate.get("warnings") or [])]
    result.message = (validate.get("status") or {}).get("message", "") if not result.allowed else ""
    result.patched = current
    return result


_VERBS = {
    "CREATE": ("created", "creating"),
    "UPDATE": ("configured", "updating"),
    "DELETE": ("deleted", "deleting"),
}


def format_outcome(result: ReplayResult, source: str, *, webhook: str = "validate.team.mpigate.io") -> str:
    """The outcome as ``kubectl apply`` would print it (plus the mutations mpigate made)."""
    group = next((row[0] for row in ROUTED if row[2] == result.kind), "")
    resource = f"{result.kind.lower()}.{group}" if group else result.kind.lower()
    done, doing = _VERBS.get(result.operation, ("admitted", "admitting"))
    lines = [f"Warning: {w}" for w in result.warnings]
    if result.error:
        lines.append(f'error: {doing} "{source}": {result.error}')
    elif result.allowed:
        ops = len(result.patch_ops)
        tail = f" (mpigate: {ops} mutation{'s' if ops != 1 else ''})" if ops else ""
        lines.append(f"{resource}/{result.name} {done}{tail}")
        lines.extend(f"  {op['op']} {op['path']}" for op in result.patch_ops)
    else:
        lines.append(
            f'Error from server (Forbidden): error when {doing} "{source}": admission webhook '
            f'"{webhook}" denied the request: {result.message}'
        )
    return "\n".join(lines)


def summarize(results: Sequence[ReplayResult]) -> str:
    allowed = sum(1 for r in results if r.allowed)
    errors = sum(1 for r in results if r.error)
    denied = len(results) - allowed - errors
    return f"{len(results)} objects: {allowed} admitted, {denied} denied" + (
        f", {errors} errors" if errors else ""
    )

"""The API server's webhook admission (k8s.io/apiserver pkg/admission/plugin/webhook/...), driven by
MutatingWebhookConfigurations and ValidatingWebhookConfigurations as objects: which webhooks a
request reaches, the AdmissionReview it sends, what it does with the answer, and the Status errors
a client gets back.

Simplifications (say so where it matters):

- one version per resource is served, so ``matchPolicy: Equivalent`` never has another equivalent
  resource to try (generic/webhook.go ShouldCallHook's second loop finds none); ``Exact`` and
  ``Equivalent`` therefore behave alike here and the rules are matched against the request's own
  group/version/resource;
- the admission chain has no in-tree plugins, so a reinvocation round is only ever caused by a
  later webhook's change (mutating/reinvocationcontext.go);
- the ``authorizer`` variable of matchConditions is not provided (the install base's conditions do
  not use it);
- audit annotations are collected per request (``Outcome.annotations``) instead of an audit log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import ssl
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jsonpatch
from yarl import URL

from mpigate.cel import CompileError, Environment, EvalError, Program

__all__ = [
    "Attributes",
    "Outcome",
    "StatusError",
    "UserInfo",
    "Webhook",
    "WebhookAdmission",
    "label_selector_matches",
    "status",
]

_MATCH_ENV = Environment(["object", "oldObject", "request", "params", "namespaceObject", "authorizer"])
_PROGRAMS: dict[str, Program] = {}


def status(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """apimachinery: pkg/apis/meta/v1/types.go Status, as the API server writes it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = dict(details)
    return body


class StatusError(Exception):
    """apimachinery: pkg/api/errors/errors.go StatusError — the Status the client receives."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.body = body

    @property
    def code(self) -> int:
        return int(self.body.get("code", 500))


def internal_error(err: str) -> StatusError:
    """apimachinery: pkg/api/errors/errors.go NewInternalError."""
    return StatusError(
        status(500, "InternalError", f"Internal error occurred: {err}", {"causes": [{"message": err}]})
    )


def to_status_err(webhook: str, result: Mapping[str, Any] | None) -> StatusError:
    """apiserver: pkg/admission/plugin/webhook/errors/statuserror.go ToStatusErr."""
    body = dict(result or {})
    body.setdefault("kind", "Status")
    body.setdefault("apiVersion", "v1")
    body.setdefault("metadata", {})
    denied_by = f"admission webhook {json.dumps(webhook)} denied the request"
    if int(body.get("code") or 0) < 400:
        body["code"] = 400
    if body.get("status") in (None, "", "Success"):
        body["status"] = "Failure"
    if body.get("message"):
        body["message"] = f"{denied_by}: {body['message']}"
    elif body.get("reason"):
        body["message"] = f"{denied_by}: {body['reason']}"
    else:
        body["message"] = f"{denied_by} without explanation"
    return StatusError(body)


@dataclass(frozen=True)
class UserInfo:
    username: str
    groups: tuple[str, ...] = ("system:authenticated",)
    uid: str = ""
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def as_review(self) -> dict[str, Any]:
        return {
            "username": self.username,
            "uid": self.uid,
            "groups": list(self.groups),
            "extra": {k: list(v) for k, v in self.extra.items()},
        }


@dataclass
class Attributes:
    """apiserver: pkg/admission/attributes.go attributesRecord — one request as admission sees it."""

    group: str
    version: str
    resource: str
    kind: str
    namespace: str
    name: str
    operation: str  # CREATE, UPDATE, DELETE
    user: UserInfo
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    options: dict[str, Any]
    dry_run: bool
    namespace_labels: Mapping[str, str] | None  # None: the namespace does not exist
    subresource: str = ""


@dataclass
class Outcome:
    """What the request collected on its way: warnings (the ``Warning`` headers) and audit
    annotations (``<webhook>/<key>``), and the webhooks called, in order."""

    warnings: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    called: list[tuple[str, int]] = field(default_factory=list)  # (webhook, round)
    # fields the CRD's schema dropped from the mutating webhooks' output (pruned silently)
    pruned: list[str] = field(default_factory=list)


@dataclass
class Webhook:
    """One entry of a Mutating/ValidatingWebhookConfiguration (admissionregistration.k8s.io/v1)."""

    configuration: str
    spec: dict[str, Any]
    mutating: bool

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def uid(self) -> str:
        # generic/webhook accessor: one per configuration and index
        return f"{self.configuration}/{self.name}"

    @property
    def failure_policy(self) -> str:
        return str(self.spec.get("failurePolicy", "Fail"))  # v1 default

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 10))  # v1 default


def _selector_requirement(labels: Mapping[str, str], req: Mapping[str, Any]) -> bool:
    key, op, values = req["key"], req["operator"], req.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise ValueError(f"unknown label selector operator {op!r}")


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """apimachinery: pkg/apis/meta/v1/helpers.go LabelSelectorAsSelector, then Matches (an empty
    selector matches everything)."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_selector_requirement(labels, r) for r in selector.get("matchExpressions") or [])


def _labels(obj: Mapping[str, Any] | None) -> dict[str, str] | None:
    if obj is None:
        return None
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _program(source: str) -> Program:
    program = _PROGRAMS.get(source)
    if program is None:
        program = _PROGRAMS[source] = _MATCH_ENV.compile(source)
    return program


class WebhookAdmission:
    """The mutating and validating webhook plugins over a set of webhook configurations.

    ``resolve`` maps a clientConfig ``service`` (namespace, name, port) to the loopback address
    where that Service's endpoint listens (the API server's service resolver); the TLS server name
    is still ``<name>.<namespace>.svc``, as the API server sends it
    (apiserver: pkg/util/webhook/client.go (*ClientManager).HookClient)."""

    def __init__(
        self,
        configurations: Sequence[Mapping[str, Any]],
        resolve: Mapping[tuple[str, str, int], tuple[str, int]],
    ) -> None:
        self.resolve = dict(resolve)
        self.mutating: list[Webhook] = []
        self.validating: list[Webhook] = []
        # generic/webhook source: configurations sorted by name, webhooks in their order
        for config in sorted(configurations, key=lambda c: c["metadata"]["name"]):
            kind = config.get("kind")
            if kind not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                continue
            if config.get("apiVersion") != "admissionregistration.k8s.io/v1":
                raise ValueError(f"{kind} {config['metadata']['name']}: unsupported apiVersion")
            target = self.mutating if kind == "MutatingWebhookConfiguration" else self.validating
            for spec in config.get("webhooks") or []:
                target.append(Webhook(config["metadata"]["name"], dict(spec), target is self.mutating))
        self._sessions: dict[str, tuple[ssl.SSLContext, aiohttp.ClientSession]] = {}

    async def close(self) -> None:
        for _, session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    # --- generic/webhook.go (*Webhook).ShouldCallHook
    def should_call(self, hook: Webhook, attr: Attributes) -> bool:
        # predicates/namespace/matcher.go (*Matcher).MatchNamespaceSelector
        if attr.namespace and attr.resource != "namespaces":
            selector = hook.spec.get("namespaceSelector")
            if selector and (selector.get("matchLabels") or selector.get("matchExpressions")):
                if attr.namespace_labels is None:
                    raise StatusError(
                        status(
                            404,
                            "NotFound",
                            f'namespaces "{attr.namespace}" not found',
                            {"name": attr.namespace, "kind": "namespaces"},
                        )
                    )
                if not label_selector_matches(selector, attr.namespace_labels):
                    return False
        # predicates/object/matcher.go (*Matcher).MatchObjectSelector: the object's or the old
        # object's labels
        selector = hook.spec.get("objectSelector")
        if selector and (selector.get("matchLabels") or selector.get("matchExpressions")):
            new, old = _labels(attr.object), _labels(attr.old_object)
            if not (
                (new is not None and label_selector_matches(selector, new))
                or (old is not None and label_selector_matches(selector, old))
            ):
                return False
        # predicates/rules/rules.go (*Matcher).Matches for each rule; matchPolicy Equivalent has no
        # other served version to try here (see the module docstring)
        if not any(self._rule_matches(rule, attr) for rule in hook.spec.get("rules") or []):
            return False
        conditions = hook.spec.get("matchConditions") or []
        if conditions:
            return self._match_conditions(hook, conditions, attr)
        return True

    @staticmethod
    def _rule_matches(rule: Mapping[str, Any], attr: Attributes) -> bool:
        """rules.go (*Matcher).Matches: scope, operation, group, version, resource."""

        def exact_or_wildcard(items: Sequence[str], requested: str) -> bool:
            return any(item in ("*", requested) for item in items)

        scope = rule.get("scope", "*")
        namespaces_resource = attr.group == "" and attr.resource == "namespaces"
        if scope == "Namespaced" and (namespaces_resource or not attr.namespace):
            return False
        if scope == "Cluster" and not (namespaces_resource or not attr.namespace):
            return False
        operations = rule.get("operations") or []
        if not ("*" in operations or attr.operation in operations):
            return False
        if not exact_or_wildcard(rule.get("apiGroups") or [], attr.group):
            return False
        if not exact_or_wildcard(rule.get("apiVersions") or [], attr.version):
            return False
        for resource in rule.get("resources") or []:
            res, _, sub = resource.partition("/")
            if (res in ("*", attr.resource)) and (sub in ("*", attr.subresource)):
                return True
        return False

    def _request(self, attr: Attributes, uid: str) -> dict[str, Any]:
        """request/admissionreview.go CreateV1AdmissionReview."""
        gvk = {"group": attr.group, "version": attr.version, "kind": attr.kind}
        gvr = {"group": attr.group, "version": attr.version, "resource": attr.resource}
        request: dict[str, Any] = {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": attr.name,
            "namespace": attr.namespace,
            "operation": attr.operation,
            "userInfo": attr.user.as_review(),
            "object": attr.object,
            "oldObject": attr.old_object,
            "dryRun": attr.dry_run,
            "options": attr.options,
        }
        if attr.subresource:
            request["subResource"] = request["requestSubResource"] = attr.subresource
        # runtime.RawExtension of a nil object and an empty string are left out of the JSON
        return {k: v for k, v in request.items() if v is not None and v != ""}

    def _match_conditions(
        self, hook: Webhook, conditions: Sequence[Mapping[str, Any]], attr: Attributes
    ) -> bool:
        """apiserver: pkg/admission/plugin/webhook/matchconditions/matcher.go (*matcher).Match —
        every condition must be true; a false one skips the webhook, an error with failurePolicy
        Fail is returned as Forbidden (generic/webhook.go ShouldCallHook), with Ignore skips it."""
        request = self._request(attr, "")
        request.pop("object", None)
        request.pop("oldObject", None)
        values = {"object": attr.object, "oldObject": attr.old_object, "request": request}
        errors = []
        for condition in conditions:
            try:
                result = _program(condition["expression"]).evaluate(_MATCH_ENV.inputs(values))
            except (CompileError, EvalError) as exc:
                errors.append(f"expression '{condition['name']}' resulted in error: {exc}")
                continue
            if result is False:
                return False
            if result is not True:
                errors.append(f"expression '{condition['name']}' resulted in error: no such overload")
        if errors:
            if hook.failure_policy == "Ignore":
                return False
            message = f"{attr.resource}.{attr.group} {json.dumps(attr.name)} is forbidden: " + "; ".join(
                errors
            )
            raise StatusError(
                status(
                    403, "Forbidden", message, {"name": attr.name, "group": attr.group, "kind": attr.resource}
                )
            )
        return True

    def _client(self, hook: Webhook) -> tuple[str, str, aiohttp.ClientSession]:
        """The URL, TLS server name and client of a webhook (util/webhook/client.go HookClient):
        the server is trusted only through the clientConfig's caBundle."""
        config = hook.spec["clientConfig"]
        bundle = config.get("caBundle", "")
        if "url" in config:
            url = config["url"]
            server_name = URL(url).host or ""
        else:
            svc = config["service"]
            port = int(svc.get("port", 443))
            host, real_port = self.resolve.get((svc["namespace"], svc["name"], port), ("", 0))
            if not host:
                raise LookupError(f'service "{svc["name"]}" not found')
            server_name = f"{svc['name']}.{svc['namespace']}.svc"
            url = f"https://{host}:{real_port}{svc.get('path', '')}"
        key = bundle
        if key not in self._sessions:
            ctx = ssl.create_default_context(cadata=base64.b64decode(bundle).decode() if bundle else None)
            if not bundle:
                ctx.load_default_certs()
            self._sessions[key] = (ctx, aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)))
        return url, server_name, self._sessions[key][1]

    async def _call(self, hook: Webhook, attr: Attributes, outcome: Outcome, round_: int) -> dict[str, Any]:
        """mutating/dispatcher.go callAttrMutatingHook and validating/dispatcher.go callHook, up
        to VerifyAdmissionResponse. Raises _CallingError (ErrCallingWebhook) or StatusError
        (ErrWebhookRejection)."""
        if attr.dry_run and hook.spec.get("sideEffects") not in ("None", "NoneOnDryRun"):
            # errors/statuserror.go NewDryRunUnsupportedErr
            raise StatusError(
                status(
                    400, "BadRequest", f"admission webhook {json.dumps(hook.name)} does not support dry run"
                )
            )
        if "v1" not in (hook.spec.get("admissionReviewVersions") or []):
            raise _CallingError(
                hook.name,
                "could not create admission objects: webhook does not accept known "
                "AdmissionReview versions (v1, v1beta1)",
            )
        uid = str(uuid.uuid4())
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": self._request(attr, uid),
        }
        outcome.called.append((hook.name, round_))
        try:
            url, server_name, session = self._client(hook)
        except LookupError as exc:
            raise _CallingError(hook.name, f"failed to call webhook: {exc}") from None
        # the ?timeout= parameter: the time left, rounded up to whole seconds
        timeout = hook.timeout
        target = f"{url}?timeout={math.ceil(timeout)}s"
        shown = target.replace(url.split("/")[2], _shown_host(hook))
        try:
            async with asyncio.timeout(timeout):
                async with session.post(target, json=review, server_hostname=server_name) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        # rest client: a non-2xx answer that is not a Status becomes an error
                        raise _CallingError(
                            hook.name,
                            f"failed to call webhook: an error on the server "
                            f'("{text.strip()[:200]}") has prevented the request from succeeding',
                        )
                    answer = json.loads(text)
        except TimeoutError:
            raise _CallingError(
                hook.name, f'failed to call webhook: Post "{shown}": context deadline exceeded'
            ) from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise _CallingError(
                hook.name,
                f'failed to call webhook: Post "{shown}": tls: failed to verify '
                f"certificate: {exc.certificate_error}",
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise _CallingError(
                hook.name,
                f'failed to call webhook: Post "{shown}": dial tcp '
                f"{exc.host}:{exc.port}: connect: connection refused",
            ) from None
        except (aiohttp.ClientError, ValueError) as exc:
            raise _CallingError(hook.name, f'failed to call webhook: Post "{shown}": {exc}') from None
        response = _verify(answer, uid, hook)
        for key, value in (response.get("auditAnnotations") or {}).items():
            outcome.annotations[f"{hook.name}/{key}"] = value
        outcome.warnings.extend(response.get("warnings") or [])
        if not response.get("allowed"):
            raise to_status_err(hook.name, response.get("status"))
        return response

    # --- mutating/dispatcher.go (*mutatingDispatcher).Dispatch, with the reinvocation round of
    # mutating/reinvocationcontext.go and the chain's reinvocation (admission/reinvocation.go)
    async def admit(self, attr: Attributes, outcome: Outcome) -> None:
        """Mutate ``attr.object`` in place through the matching mutating webhooks."""
        previously_invoked: set[str] = set()
        reinvoke: set[str] = set()
        should_reinvoke = False
        for round_ in (0, 1):
            if round_ == 1 and not should_reinvoke:
                break
            for hook in self.mutating:
                if not self.should_call(hook, attr):
                    continue
                if round_ == 1 and hook.uid not in reinvoke:
                    continue  # Dispatch: in a reinvocation only the webhooks asked to run again
                changed = False
                try:
                    response = await self._call(hook, attr, outcome, round_)
                    changed = self._apply(hook, attr, response)
                except _CallingError as exc:
                    if hook.failure_policy != "Ignore":
                        raise internal_error(str(exc)) from None
                    # failing open: recorded as an audit annotation (webhookAnnotator.addFailedOpenAnnotation)
                    outcome.annotations[
                        f"failed-open.mutation.webhook.admission.k8s.io/round_{round_}_index_"
                        f"{self.mutating.index(hook)}"
                    ] = hook.name
                if changed:
                    # RequireReinvokingPreviouslyInvokedPlugins + SetShouldReinvoke
                    reinvoke |= previously_invoked
                    previously_invoked = set()
                    should_reinvoke = True
                if hook.spec.get("reinvocationPolicy") == "IfNeeded":
                    previously_invoked.add(hook.uid)

    def _apply(self, hook: Webhook, attr: Attributes, response: Mapping[str, Any]) -> bool:
        patch_b64 = response.get("patch")
        if not patch_b64:
            return False
        try:
            patch = jsonpatch.JsonPatch(json.loads(base64.b64decode(patch_b64)))
        except (ValueError, jsonpatch.InvalidJsonPatch) as exc:
            raise _CallingError(hook.name, f"received undecodable patch in webhook response: {exc}") from None
        if not patch.patch:
            return False
        if attr.object is None:
            raise internal_error(
                f"admission webhook {json.dumps(hook.name)} attempted to modify the object, "
                "which is not supported for this operation"
            )
        try:
            patched = patch.apply(attr.object)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise internal_error(str(exc)) from None
        changed = patched != attr.object
        attr.object = patched
        return changed

    # --- validating/dispatcher.go (*validatingDispatcher).Dispatch: all matching webhooks in
    # parallel; the first error (in webhook order) is returned
    async def validate(self, attr: Attributes, outcome: Outcome) -> None:
        hooks = [hook for hook in self.validating if self.should_call(hook, attr)]

        async def one(index: int, hook: Webhook) -> StatusError | None:
            try:
                await self._call(hook, attr, outcome, 0)
            except _CallingError as exc:
                if hook.failure_policy == "Ignore":
                    outcome.annotations[
                        f"failed-open.validating.webhook.admission.k8s.io/round_0_index_{index}"
                    ] = hook.name
                    return None
                return internal_error(str(exc))
            except StatusError as exc:
                return exc
            return None

        results = await asyncio.gather(*(one(i, h) for i, h in enumerate(hooks)))
        for error in results:
            if error is not None:
                raise error


class _CallingError(Exception):
    """apiserver: pkg/util/webhook/error.go ErrCallingWebhook — ``failed calling webhook "X": ...``."""

    def __init__(self, webhook: str, reason: str) -> None:
        super().__init__(f"failed calling webhook {json.dumps(webhook)}: {reason}")


def _shown_host(hook: Webhook) -> str:
    config = hook.spec["clientConfig"]
    if "url" in config:
        return str(URL(config["url"]).authority)
    svc = config["service"]
    return f"{svc['name']}.{svc['namespace']}.svc:{int(svc.get('port', 443))}"


def _verify(answer: Any, uid: str, hook: Webhook) -> dict[str, Any]:
    """request/admissionreview.go VerifyAdmissionResponse (v1)."""

    def bad(why: str) -> _CallingError:
        return _CallingError(hook.name, f"received invalid webhook response: {why}")

    if not isinstance(answer, dict) or not isinstance(answer.get("response"), dict):
        raise bad("webhook response was absent")
    response = answer["response"]
    if response.get("uid") != uid:
        raise bad(f"expected response.uid={json.dumps(uid)}, got {json.dumps(response.get('uid', ''))}")
    if answer.get("apiVersion") != "admission.k8s.io/v1" or answer.get("kind") != "AdmissionReview":
        raise bad(
            f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got "
            f"{answer.get('apiVersion')}, Kind={answer.get('kind')}"
        )
    if hook.mutating:
        if response.get("patch") and not response.get("patchType"):
            raise bad("webhook returned response.patch but not response.patchType")
        if not response.get("patch") and response.get("patchType"):
            raise bad("webhook returned response.patchType but not response.patch")
        if response.get("patchType") not in (None, "JSONPatch"):
            raise _CallingError(hook.name, f'unsupported patch type "{response["patchType"]}"')
    elif response.get("patch") or response.get("patchType"):
        raise bad("validating webhook may not return response.patch")
    return dict(response)

"""An API server for tests: real HTTPS on loopback, discovery and OpenAPI for the CRDs it serves,
namespaces, and create/get/list/update/patch/delete of custom resources with in-memory storage —
and between request and storage what kube-apiserver does: namespace lifecycle, pruning and
defaulting, mutating webhooks, CRD schema and CEL validation, validating webhooks, dryRun,
resourceVersion checks, and the API server's own Status errors and ``Warning`` headers.

Simplifications (test support, not kube-apiserver):

- authentication is a bearer token looked up in a table (``users``), plus impersonation headers
  (``kubectl --as``); there is no authorization, no rate limiting, no watch;
- one version per resource; no conversion; no status subresource writes (status is kept from the
  stored object on update, as the status subresource's strategy does);
- server-side apply (``application/apply-patch+yaml``) merges the applied configuration like a
  JSON merge patch and keeps no managedFields: enough for one applier, not for field ownership;
- strategic merge patch is refused for custom resources (415), as the API server does;
- lists do not page or filter by field selectors; label selectors of ``=``, ``!=`` and existence.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from .admission import Attributes, Outcome, StatusError, UserInfo, WebhookAdmission, status
from .crd import CRD, FieldError

__all__ = ["ApiServer", "warning_header", "warning_headers"]

SERVER_VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-mpigate-emulator",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-11-22T00:00:00Z",
    "goVersion": "go1.24",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_MERGE_TYPES = ("application/merge-patch+json", "application/json-patch+json", "application/apply-patch+yaml")


def warning_header(text: str) -> str:
    """apimachinery: pkg/util/net/http.go NewWarningHeader(299, "-", text) — the text quoted, with
    ``"`` and ``\\`` escaped."""
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def warning_headers(texts: Iterable[str]) -> list[str]:
    """The ``Warning`` headers of a response, as apiserver pkg/endpoints/filters/warning.go
    (*recorder).AddWarning writes them: empty texts dropped, duplicates once; the first warning
    past 4096 runes in all turns truncation on (every warning so far written again cut to 256
    runes), after which a warning is cut to 256 runes and dropped once 4096 runes are written."""
    total, item = 4 * 1024, 256
    recorded: list[str] = []
    headers: list[str] = []
    written, truncating = 0, False
    for text in texts:
        if not text or (written >= total and truncating) or text in recorded:
            continue
        recorded.append(text)
        if truncating:
            text = text[:item]
        if written + len(text) <= total or truncating:
            written += len(text)
            headers.append(warning_header(text))
            continue
        truncating, written, headers = True, 0, []
        for earlier in recorded:
            cut = earlier[:item]
            written += len(cut)
            headers.append(warning_header(cut))
    return headers


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (apimachinery's jsonpatch.MergePatch)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@dataclass
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    crd: CRD | None = None

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


@dataclass
class ApiServer:
    """Start with :meth:`start` (in a thread of its own; returns the URL) and :meth:`stop`."""

    crds: list[CRD]
    admission: WebhookAdmission
    tls_cert: Path
    tls_key: Path
    users: dict[str, UserInfo] = field(default_factory=dict)
    storage: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._rv = 1000
        self._lock = threading.Lock()
        self.resources: dict[tuple[str, str, str], Resource] = {}
        for crd in self.crds:
            for version in crd.versions:
                self.resources[(crd.group, version, crd.plural)] = Resource(
                    crd.group, version, crd.plural, crd.kind, crd.namespaced, crd
                )
        self.resources[("", "v1", "namespaces")] = Resource("", "v1", "namespaces", "Namespace", False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> str:
        import ssl

        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def up() -> None:
            app = web.Application(client_max_size=16 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._dispatch)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(str(self.tls_cert), str(self.tls_key))
            site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"https://127.0.0.1:{port}"

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(up())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="apiserver", daemon=True)
        self._thread.start()
        if not ready.wait(60):
            raise RuntimeError("the API server emulator did not start within 60 s")
        return self.url

    def stop(self) -> None:
        if self._loop is None:
            return
        loop = self._loop

        async def down() -> None:
            await self.admission.close()
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
        self._loop = None

    def call(self, coro: Any) -> Any:
        """Run a coroutine on the server's loop (for tests that swap its admission)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    # --- storage helpers ------------------------------------------------------------------
    def _next_rv(self) -> str:
        with self._lock:
            self._rv += 1
            return str(self._rv)

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``obj`` directly (what a GitOps controller applied before the test): metadata
        filled in, no admission."""
        group, _, version = obj["apiVersion"].rpartition("/")
        resource = next(
            r
            for r in self.resources.values()
            if r.group == group and r.version == version and r.kind == obj["kind"]
        )
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        if resource.plural == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        self._fill_new(stored)
        key = (group, resource.plural, meta.get("namespace", "") if resource.namespaced else "", meta["name"])
        self.storage[key] = stored
        return stored

    def get(self, group: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.storage.get((group, plural, namespace, name))

    def _fill_new(self, obj: dict[str, Any]) -> None:
        meta = obj.setdefault("metadata", {})
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["resourceVersion"] = self._next_rv()
        meta["generation"] = 1

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        ns = self.storage.get(("", "namespaces", "", namespace))
        return None if ns is None else dict(ns["metadata"].get("labels") or {})

    # --- HTTP ------------------------------------------------------------------------------
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        try:
            user = self._authenticate(request)
            return await self._route(request, user)
        except StatusError as exc:
            response = web.json_response(exc.body, status=exc.code)
            # warnings recorded before the failure still reach the client (the warning recorder
            # writes headers whatever the status: apiserver pkg/endpoints/filters/warning.go)
            for header in warning_headers(getattr(exc, "warnings", [])):
                response.headers.add("Warning", header)
            return response

    def _authenticate(self, request: web.Request) -> UserInfo:
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        user = self.users.get(token)
        if user is None:
            raise StatusError(status(401, "Unauthorized", "Unauthorized"))
        # impersonation (kubectl --as / --as-group): apiserver pkg/endpoints/filters/impersonation.go
        as_user = request.headers.get("Impersonate-User")
        if as_user:
            groups = list(request.headers.getall("Impersonate-Group", []))
            if not groups and as_user.startswith("system:serviceaccount:"):
                # serviceaccount.MakeGroupNames for a service account without groups given
                groups = ["system:serviceaccounts", "system:serviceaccounts:" + as_user.split(":")[2]]
            if "system:authenticated" not in groups:
                groups.append("system:authenticated")
            user = UserInfo(as_user, tuple(groups))
        return user

    async def _route(self, request: web.Request, user: UserInfo) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if request.method == "GET":
            if path == "/version":
                return web.json_response(SERVER_VERSION)
            if path == "/api":
                return web.json_response(
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}
                        ],
                    }
                )
            if path == "/apis":
                return web.json_response(self._group_list())
            if path == "/api/v1":
                return web.json_response(self._resource_list("", "v1"))
            m = re.fullmatch(r"/apis/([^/]+)/([^/]+)", path)
            if m and any(r.group == m[1] and r.version == m[2] for r in self.resources.values()):
                return web.json_response(self._resource_list(m[1], m[2]))
            if m and any(r.group == m[1] for r in self.resources.values()):
                raise _not_found_path()
            if path == "/openapi/v2":
                # an empty gnostic openapi_v2.Document (protobuf; zero bytes is a valid empty
                # message): kubectl fetches it before it asks openapi/v3 whether the server
                # validates fields itself (it does: fieldValidation in every write operation)
                return web.Response(
                    body=b"", content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
                )
            if path == "/openapi/v3":
                return web.json_response(self._openapi_index())
            m = re.fullmatch(r"/openapi/v3/(apis/[^/]+/[^/]+|api/v1)", path)
            if m:
                return web.json_response(self._openapi_v3(m[1]))
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/(pods|events|configmaps|secrets)(?:/([^/]+))?", path)
        if m and request.method == "GET":
            # core objects the SDK reads around a job (its pods, events, the Trainer version
            # ConfigMap): none exist here, as in a cluster without the Trainer controller
            if m[3]:
                raise StatusError(
                    status(404, "NotFound", f'{m[2]} "{m[3]}" not found', {"name": m[3], "kind": m[2]})
                )
            kind = {
                "pods": "PodList",
                "events": "EventList",
                "configmaps": "ConfigMapList",
                "secrets": "SecretList",
            }[m[2]]
            return web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": kind,
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": [],
                }
            )
        route = self._resource_route(path)
        if route is None:
            raise _not_found_path()
        resource, namespace, name = route
        if namespace and resource.namespaced is False:
            raise _not_found_path()
        handler = {
            ("GET", False): self._list,
            ("GET", True): self._get,
            ("POST", False): self._create,
            ("PUT", True): self._update,
            ("PATCH", True): self._patch,
            ("DELETE", True): self._delete,
        }.get((request.method, bool(name)))
        if handler is None:
            raise StatusError(
                status(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            )
        return await handler(request, user, resource, namespace, name)

    def _resource_route(self, path: str) -> tuple[Resource, str, str] | None:
        m = re.fullmatch(
            r"/(?:api/(v1)|apis/([^/]+)/([^/]+))(?:/namespaces/([^/]+))?/([^/]+)(?:/([^/]+))?", path
        )
        if m is None:
            return None
        group, version = ("", "v1") if m[1] else (m[2], m[3])
        resource = self.resources.get((group, version, m[5]))
        return None if resource is None else (resource, m[4] or "", m[6] or "")

    def _group_list(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {}
        for r in self.resources.values():
            if r.group:
                groups.setdefault(r.group, [])
                if r.version not in groups[r.group]:
                    groups[r.group].append(r.version)
        out = []
        for group, versions in sorted(groups.items()):
            gv = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
            out.append({"name": group, "versions": gv, "preferredVersion": gv[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        """apiserver: pkg/endpoints/discovery — the APIResourceList of a group version."""
        items = []
        for r in self.resources.values():
            if r.group != group or r.version != version:
                continue
            entry: dict[str, Any] = {
                "name": r.plural,
                "singularName": r.crd.singular if r.crd else r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"],
                "storageVersionHash": hashlib.sha256(f"{group}/{version}/{r.plural}".encode()).hexdigest()[
                    :12
                ],
            }
            if r.crd is not None:
                if r.crd.short_names:
                    entry["shortNames"] = r.crd.short_names
                if r.crd.categories:
                    entry["categories"] = r.crd.categories
            items.append(entry)
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": items}

    def _openapi_index(self) -> dict[str, Any]:
        paths = {}
        for gv in {
            ("api/v1" if not r.group else f"apis/{r.group}/{r.version}") for r in self.resources.values()
        }:
            digest = (
                hashlib.sha256(json.dumps(self._openapi_v3(gv), sort_keys=True).encode())
                .hexdigest()[:32]
                .upper()
            )
            paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest}"}
        return {"paths": paths}

    def _openapi_v3(self, gv: str) -> dict[str, Any]:
        """apiextensions-apiserver: pkg/controller/openapi/builder — the group version's schemas
        (x-kubernetes-group-version-kind) and its paths with the query parameters kubectl's
        QueryParamVerifier looks for (fieldValidation, dryRun) and the patch types a custom
        resource accepts."""
        group, version = ("", "v1") if gv == "api/v1" else tuple(gv.split("/")[1:3])
        schemas: dict[str, Any] = {}
        paths: dict[str, Any] = {}
        params = [
            {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for n in ("dryRun", "fieldManager", "fieldValidation", "pretty")
        ]
        for r in self.resources.values():
            if r.group != group or r.version != version:
                continue
            reversed_group = ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"
            name = f"{reversed_group}.{version}.{r.kind}"
            ref = {"$ref": f"#/components/schemas/{name}"}
            schema = copy.deepcopy(r.crd.schema(version)) if r.crd else {"type": "object"}
            schema["x-kubernetes-group-version-kind"] = [{"group": group, "version": version, "kind": r.kind}]
            schemas[name] = schema
            prefix = f"/apis/{group}/{version}" if group else "/api/v1"
            base = f"{prefix}/namespaces/{{namespace}}/{r.plural}" if r.namespaced else f"{prefix}/{r.plural}"
            body = {"content": {"*/*": {"schema": ref}}}
            patch_body = {"content": {t: {"schema": {"type": "object"}} for t in _MERGE_TYPES}}
            gvk = {"group": group, "version": version, "kind": r.kind}

            def op(action: str, gvk: dict[str, str] = gvk, **props: Any) -> dict[str, Any]:
                # each operation names its kind and action (kubectl's QueryParamVerifierV3 finds the
                # PATCH operation of a kind by x-kubernetes-group-version-kind)
                return {"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk, **props}

            paths[base] = {
                "post": op("post", parameters=params, requestBody=body, responses={"201": body}),
                "get": op(
                    "list",
                    responses={"200": {"content": {"application/json": {"schema": {"type": "object"}}}}},
                ),
            }
            paths[f"{base}/{{name}}"] = {
                "get": op("get", responses={"200": body}),
                "put": op("put", parameters=params, requestBody=body, responses={"200": body}),
                "patch": op(
                    "patch",
                    parameters=[*params, {"name": "force", "in": "query", "schema": {"type": "boolean"}}],
                    requestBody=patch_body,
                    responses={"200": body},
                ),
                "delete": op("delete", parameters=params[:1], responses={"200": body}),
            }
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": paths,
            "components": {"schemas": schemas},
        }

    # --- reads -----------------------------------------------------------------------------
    def _not_found(self, resource: Resource, name: str) -> StatusError:
        return StatusError(
            status(
                404,
                "NotFound",
                f'{resource.group_resource} "{name}" not found',
                {"name": name, "group": resource.group, "kind": resource.plural},
            )
        )

    async def _get(
        self, request: web.Request, user: UserInfo, resource: Resource, namespace: str, name: str
    ) -> web.StreamResponse:
        obj = self.get(resource.group, resource.plural, namespace, name)
        if obj is None:
            raise self._not_found(resource, name)
        return web.json_response(obj)

    async def _list(
        self, request: web.Request, user: UserInfo, resource: Resource, namespace: str, name: str
    ) -> web.StreamResponse:
        selector = request.query.get("labelSelector", "")
        fields = _field_terms(request.query.get("fieldSelector", ""), resource)
        items = [
            obj
            for (g, p, ns, _), obj in sorted(self.storage.items())
            if g == resource.group
            and p == resource.plural
            and (not namespace or ns == namespace)
            and _selects(selector, obj)
            and all((str((obj.get("metadata") or {}).get(f) or "") == v) == eq for f, v, eq in fields)
        ]
        api_version = f"{resource.group}/{resource.version}" if resource.group else "v1"
        return web.json_response(
            {
                "apiVersion": api_version,
                "kind": f"{resource.kind}List",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )

    # --- writes ----------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            if "yaml" in request.content_type:
                return _integral(yaml.safe_load(raw))
            return _integral(json.loads(raw))
        except (ValueError, yaml.YAMLError) as exc:
            raise StatusError(
                status(400, "BadRequest", f"the object provided is unrecognized: {exc}")
            ) from None

    @staticmethod
    def _options(request: web.Request, kind: str) -> tuple[dict[str, Any], bool, str]:
        """metav1 CreateOptions/UpdateOptions/DeleteOptions/PatchOptions from the query; dryRun
        must be All (apiserver: pkg/endpoints/handlers/rest.go dryRun validation)."""
        dry = request.query.getall("dryRun", [])
        if any(d != "All" for d in dry):
            raise StatusError(status(400, "BadRequest", f'Invalid dryRun: "{dry}": supported values: "All"'))
        validation = request.query.get("fieldValidation", "Warn") or "Warn"
        if validation not in ("Ignore", "Warn", "Strict"):
            raise StatusError(
                status(
                    400, "BadRequest", f"fieldValidation must be one of Ignore, Warn, Strict: {validation}"
                )
            )
        options: dict[str, Any] = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
        if dry:
            options["dryRun"] = ["All"]
        if kind != "DeleteOptions":
            if request.query.get("fieldManager"):
                options["fieldManager"] = request.query["fieldManager"]
            options["fieldValidation"] = validation
        return options, bool(dry), validation

    def _check_new(self, resource: Resource, namespace: str, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise StatusError(status(400, "BadRequest", "the object provided is unrecognized"))
        expected = f"{resource.group}/{resource.version}" if resource.group else resource.version
        if obj.get("apiVersion") != expected or obj.get("kind") != resource.kind:
            # apiserver: pkg/endpoints/handlers/create.go — the decoder's GVK check
            raise StatusError(
                status(
                    400,
                    "BadRequest",
                    f"the API version in the data ({obj.get('apiVersion')}) does not match the "
                    f"expected API version ({expected})",
                )
            )
        meta = obj.setdefault("metadata", {})
        if resource.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise StatusError(
                    status(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match "
                        "the namespace sent on the request",
                    )
                )
            meta["namespace"] = namespace
        return obj

    def _prune_default(
        self, resource: Resource, obj: dict[str, Any], validation: str, outcome: Outcome
    ) -> None:
        """apiextensions-apiserver: the unstructured decoder prunes (pruning/algorithm.go) and
        reports unknown fields per fieldValidation (pkg/apiserver/customresource_handler.go
        unstructuredSchemaCoercer.apply); then defaulting (defaulting/algorithm.go Default)."""
        if resource.crd is None:
            return
        pruned = resource.crd.prune(resource.version, obj)
        if pruned and validation == "Strict":
            # apiserver: pkg/endpoints/handlers/rest.go transformDecodeError
            text = ", ".join(f'unknown field "{p}"' for p in pruned)
            kind, version = resource.kind, resource.version
            message = (
                f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {text}'
            )
            raise StatusError(status(400, "BadRequest", message))
        if validation == "Warn":
            outcome.warnings.extend(f'unknown field "{p}"' for p in pruned)
        resource.crd.default(resource.version, obj)

    def _validate(self, resource: Resource, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if resource.crd is None:
            return
        errors = resource.crd.validate(resource.version, obj, old)
        if errors:
            raise invalid(resource, obj["metadata"].get("name", ""), errors)

    def _attributes(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        operation: str,
        user: UserInfo,
        obj: dict[str, Any] | None,
        old: dict[str, Any] | None,
        options: dict[str, Any],
        dry: bool,
    ) -> Attributes:
        return Attributes(
            resource.group,
            resource.version,
            resource.plural,
            resource.kind,
            namespace,
            name,
            operation,
            user,
            obj,
            old,
            options,
            dry,
            self.namespace_labels(namespace) if namespace else None,
        )

    def _lifecycle(self, resource: Resource, namespace: str) -> None:
        """apiserver: pkg/admission/plugin/namespace/lifecycle — no objects in a missing namespace."""
        if resource.namespaced and self.namespace_labels(namespace) is None:
            raise StatusError(
                status(
                    404,
                    "NotFound",
                    f'namespaces "{namespace}" not found',
                    {"name": namespace, "kind": "namespaces"},
                )
            )

    def _respond(self, obj: Mapping[str, Any] | None, code: int, outcome: Outcome) -> web.StreamResponse:
        response = web.json_response(obj, status=code)
        for header in warning_headers(outcome.warnings):
            response.headers.add("Warning", header)
        return response

    async def _admit_and_store(
        self, resource: Resource, attr: Attributes, outcome: Outcome, create: bool
    ) -> dict[str, Any]:
        """apiserver: pkg/endpoints/handlers/create.go createHandler / update.go UpdateResource →
        registry/generic/registry/store.go (*Store).Create/Update: mutating admission, the
        strategy (CRD validation), validating admission, then storage (skipped for dryRun)."""
        self.outcomes.append(outcome)
        try:
            await self.admission.admit(attr, outcome)
        except StatusError as exc:
            raise _with_warnings(exc, outcome) from None
        obj = attr.object
        assert obj is not None
        # webhook output is pruned and defaulted like a request body, silently (kept in
        # outcome.pruned for the tests: a field mpigate adds that the CRD drops is a bug)
        if resource.crd is not None:
            outcome.pruned.extend(resource.crd.prune(resource.version, obj))
            resource.crd.default(resource.version, obj)
        if create:
            existing = self.get(resource.group, resource.plural, attr.namespace, attr.name)
            if existing is not None:
                raise _with_warnings(
                    StatusError(
                        status(
                            409,
                            "AlreadyExists",
                            f'{resource.group_resource} "{attr.name}" already exists',
                            {"name": attr.name, "group": resource.group, "kind": resource.plural},
                        )
                    ),
                    outcome,
                )
        try:
            self._validate(resource, obj, attr.old_object)
            await self.admission.validate(attr, outcome)
        except StatusError as exc:
            raise _with_warnings(exc, outcome) from None
        if not attr.dry_run:
            key = (resource.group, resource.plural, attr.namespace if resource.namespaced else "", attr.name)
            with self._lock:
                current = self.storage.get(key)
                if (
                    not create
                    and current is not None
                    and attr.old_object is not None
                    and current["metadata"]["resourceVersion"]
                    != attr.old_object["metadata"]["resourceVersion"]
                ):
                    raise _with_warnings(conflict(resource, attr.name), outcome)
                obj["metadata"]["resourceVersion"] = self._next_rv_locked()
                self.storage[key] = obj
        return obj

    def _next_rv_locked(self) -> str:
        self._rv += 1
        return str(self._rv)

    async def _create(
        self, request: web.Request, user: UserInfo, resource: Resource, namespace: str, name: str
    ) -> web.StreamResponse:
        options, dry, validation = self._options(request, "CreateOptions")
        obj = self._check_new(resource, namespace, await self._body(request))
        if resource.plural == "namespaces":
            return await self._create_namespace(obj)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta.pop("resourceVersion", None)
        outcome = Outcome()
        self._lifecycle(resource, namespace)
        self._prune_default(resource, obj, validation, outcome)
        self._fill_new(obj)
        attr = self._attributes(
            resource, namespace, meta.get("name", ""), "CREATE", user, obj, None, options, dry
        )
        stored = await self._admit_and_store(resource, attr, outcome, create=True)
        return self._respond(stored, 201, outcome)

    async def _create_namespace(self, obj: dict[str, Any]) -> web.StreamResponse:
        name = obj["metadata"].get("name", "")
        if self.namespace_labels(name) is not None:
            raise StatusError(
                status(
                    409,
                    "AlreadyExists",
                    f'namespaces "{name}" already exists',
                    {"name": name, "kind": "namespaces"},
                )
            )
        return web.json_response(self.put(obj), status=201)

    async def _update(
        self, request: web.Request, user: UserInfo, resource: Resource, namespace: str, name: str
    ) -> web.StreamResponse:
        options, dry, validation = self._options(request, "UpdateOptions")
        obj = self._check_new(resource, namespace, await self._body(request))
        if obj["metadata"].get("name") != name:
            raise StatusError(
                status(
                    400,
                    "BadRequest",
                    "the name of the object ({}) does not match the name on the URL ({})".format(
                        obj["metadata"].get("name"), name
                    ),
                )
            )
        return await self._update_object(resource, namespace, name, user, obj, options, dry, validation)

    async def _update_object(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        user: UserInfo,
        obj: dict[str, Any],
        options: dict[str, Any],
        dry: bool,
        validation: str,
    ) -> web.StreamResponse:
        old = self.get(resource.group, resource.plural, namespace, name)
        if old is None:
            raise self._not_found(resource, name)
        rv = obj["metadata"].get("resourceVersion")
        if not rv:
            # apiextensions-apiserver: customResourceStrategy.AllowUnconditionalUpdate is false
            raise invalid(
                resource,
                name,
                [
                    FieldError(
                        "metadata.resourceVersion", "Invalid value", "must be specified for an update", 0
                    )
                ],
            )
        if rv != old["metadata"]["resourceVersion"]:
            raise conflict(resource, name)
        outcome = Outcome()
        self._prune_default(resource, obj, validation, outcome)
        meta = obj["metadata"]
        for key in ("uid", "creationTimestamp", "generation"):
            meta[key] = old["metadata"].get(key)
        if "status" in old:  # the main resource's strategy keeps status (status subresource)
            obj["status"] = copy.deepcopy(old["status"])
        else:
            obj.pop("status", None)
        if obj.get("spec") != old.get("spec"):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        attr = self._attributes(
            resource, namespace, name, "UPDATE", user, obj, copy.deepcopy(old), options, dry
        )
        stored = await self._admit_and_store(resource, attr, outcome, create=False)
        return self._respond(stored, 200, outcome)

    async def _patch(
        self, request: web.Request, user: UserInfo, resource: Resource, namespace: str, name: str
    ) -> web.StreamResponse:
        """apiserver: pkg/endpoints/handlers/patch.go PatchResource — the patch applied to the
        stored object, then the update path with UpdateOptions (patchToUpdateOptions); an apply
        patch of a missing object creates it (CreateOptions)."""
        ctype = request.content_type
        if ctype not in _MERGE_TYPES:
            raise StatusError(
                status(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {', '.join(_MERGE_TYPES)}",
                )
            )
        raw = await request.read()
        current = self.get(resource.group, resource.plural, namespace, name)
        if ctype == "application/apply-patch+yaml":
            if not request.query.get("fieldManager"):
                raise StatusError(
                    status(
                        400,
                        "BadRequest",
                        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: '
                        "Required value: is required for apply patch",
                    )
                )
            applied = yaml.safe_load(raw)
            if current is None:
                options, dry, validation = self._options(request, "CreateOptions")
                obj = self._check_new(resource, namespace, applied)
                outcome = Outcome()
                self._lifecycle(resource, namespace)
                self._prune_default(resource, obj, validation, outcome)
                self._fill_new(obj)
                attr = self._attributes(resource, namespace, name, "CREATE", user, obj, None, options, dry)
                stored = await self._admit_and_store(resource, attr, outcome, create=True)
                return self._respond(stored, 201, outcome)
            patched = merge_patch(current, applied)
        else:
            if current is None:
                raise self._not_found(resource, name)
            try:
                document = json.loads(raw)
                if ctype == "application/json-patch+json":
                    import jsonpatch

                    patched = jsonpatch.JsonPatch(document).apply(copy.deepcopy(current))
                else:
                    patched = merge_patch(current, document)
            except Exception as exc:  # the patch libraries' many error types: a bad patch
                raise StatusError(
                    status(
                        422,
                        "Invalid",
                        f"the server rejected our request due to an error in our request: {exc}",
                    )
                ) from None
        options, dry, validation = self._options(request, "UpdateOptions")
        obj = self._check_new(resource, namespace, patched)
        obj["metadata"].setdefault("resourceVersion", current["metadata"]["resourceVersion"])
        return await self._update_object(resource, namespace, name, user, obj, options, dry, validation)

    async def _delete(
        self, request: web.Request, user: UserInfo, resource: Resource, namespace: str, name: str
    ) -> web.StreamResponse:
        options, dry, _ = self._options(request, "DeleteOptions")
        old = self.get(resource.group, resource.plural, namespace, name)
        if old is None:
            raise self._not_found(resource, name)
        outcome = Outcome()
        self.outcomes.append(outcome)
        attr = self._attributes(
            resource, namespace, name, "DELETE", user, None, copy.deepcopy(old), options, dry
        )
        try:
            await self.admission.validate(attr, outcome)
        except StatusError as exc:
            raise _with_warnings(exc, outcome) from None
        if not dry:
            self.storage.pop((resource.group, resource.plural, namespace, name), None)
        return self._respond(old, 200, outcome)


def invalid(resource: Resource, name: str, errors: Iterable[FieldError]) -> StatusError:
    """apimachinery: pkg/api/errors/errors.go NewInvalid — ``Kind.group "name" is invalid: ...``."""
    errors = list(errors)
    texts = [str(e) for e in errors]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
    causes = [{"reason": e.reason, "message": str(e).split(": ", 1)[1], "field": e.path} for e in errors]
    return StatusError(
        status(
            422,
            "Invalid",
            f'{qualified} "{name}" is invalid: {joined}',
            {"name": name, "group": resource.group, "kind": resource.kind, "causes": causes},
        )
    )


def conflict(resource: Resource, name: str) -> StatusError:
    """apimachinery: pkg/api/errors/errors.go NewConflict with the storage's OptimisticLockErrorMsg."""
    return StatusError(
        status(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {resource.group_resource} "{name}": '
            "the object has been modified; please apply your changes to the latest version and try again",
            {"name": name, "group": resource.group, "kind": resource.plural},
        )
    )


class _WarnedStatusError(StatusError):
    def __init__(self, body: dict[str, Any], warnings: list[str]) -> None:
        super().__init__(body)
        self.warnings = warnings


def _with_warnings(exc: StatusError, outcome: Outcome) -> StatusError:
    return _WarnedStatusError(exc.body, list(outcome.warnings))


def _integral(value: Any) -> Any:
    """A number with an integral value is an integer, as the API server reads it: kube-openapi's
    type check takes an integral float64 for an integer (validate/type.go, swag.IsFloat64AJSONInteger)
    and Go writes float64 4 back as ``4``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def _not_found_path() -> StatusError:
    return StatusError(status(404, "NotFound", "the server could not find the requested resource", {}))


def _field_terms(selector: str, resource: Resource) -> list[tuple[str, str, bool]]:
    """A list's fieldSelector as (metadata field, value, equal) terms. Custom resources select by
    metadata.name and, when namespaced, metadata.namespace (apiextensions-apiserver:
    pkg/apiserver/conversion/converter.go (*crConverter).ConvertFieldLabel); any other field is the
    API server's BadRequest (apiserver: pkg/endpoints/handlers/get.go). kubectl's delete lists by
    metadata.name to wait for the object to be gone (kubectl 1.20's wait IsDeleted)."""
    terms = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        label, op, value = term.partition("!=") if "!=" in term else term.replace("==", "=").partition("=")
        allowed = ("metadata.name", "metadata.namespace") if resource.namespaced else ("metadata.name",)
        if not op or label not in allowed:
            raise StatusError(status(400, "BadRequest", f"field label not supported: {label}"))
        terms.append((label.removeprefix("metadata."), value, op != "!="))
    return terms


def _selects(selector: str, obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True

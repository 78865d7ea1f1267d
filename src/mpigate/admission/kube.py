"""A small async Kubernetes API client for the webhook's live context (GET, LIST and WATCH) and the
controller's writes (:meth:`KubeClient.request`: POST, PATCH, DELETE).

Over aiohttp, with the credentials of a
kubeconfig (token, token file, client certificate; CA data or file) or of the pod's service
account (in-cluster). Exec and auth-provider plugins are not supported: a webhook runs
in-cluster or with a static credential. Errors are :class:`KubeError` values carrying the HTTP
status and the API server's ``Status`` message.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

import aiohttp
import msgspec
import yaml

__all__ = [
    "IN_CLUSTER_DIR",
    "KubeClient",
    "KubeConfig",
    "KubeConfigError",
    "KubeError",
    "ListPage",
    "in_cluster_config",
    "load_kubeconfig",
]

log = logging.getLogger(__name__)

IN_CLUSTER_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Bound service-account tokens rotate (hourly); re-read the file this often.
TOKEN_REREAD_SECONDS: Final = 60.0
# A watch event is one JSON line; TrainJobs with large runtime patches stay far below this.
MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
# A burst of watch events gives the event loop back to the admissions after this many bytes.
WATCH_YIELD_BYTES: Final = 64 * 1024
# Objects per LIST page. client-go's pager asks for 500 (tools/pager/pager.go defaultPageSize); the
# webhook asks for fewer, because the page bounds how long the loop answering admissions waits for
# one decode: 100 TrainJobs of ~5 KiB decode into the fields the cache keeps in about 0.5 ms.
LIST_PAGE_SIZE: Final = 100
# A paginated LIST whose continue token expired (410) starts again from a fresh snapshot, at most
# this many times in a row before the error is reported (see KubeClient.list_pages).
LIST_RESTARTS: Final = 3

T = TypeVar("T")
ItemT = TypeVar("ItemT")


class _ListMeta(msgspec.Struct, gc=False):
    """A list's ``metadata`` (k8s.io/apimachinery/pkg/apis/meta/v1 ``ListMeta``), what paging reads."""

    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _ListBody(msgspec.Struct, Generic[ItemT], gc=False):
    """A LIST answer, its items decoded as the caller's item type (every other field skipped)."""

    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[ItemT] | None = None


@dataclass(frozen=True, slots=True)
class ListPage(Generic[T]):
    """One page of a LIST, reduced by the caller's ``reduce``: what it kept of the items, the list's
    ``resourceVersion`` and its ``continue`` token (empty on the last page). ``restarted``: the list
    starts again from a fresh snapshot; drop what earlier pages gave."""

    items: T
    resource_version: str
    continue_token: str
    restarted: bool = False


class KubeConfigError(Exception):
    """The kubeconfig cannot be used (missing, malformed, unsupported auth)."""


class KubeError(Exception):
    """A failed API call: ``status`` is the HTTP status (None for transport errors)."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def kind(self) -> str:
        """A short label for metrics: ``http-403``, ``timeout``, ``connection``."""
        if self.status is not None:
            return f"http-{self.status}"
        return self.reason or "connection"


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate to it."""

    server: str
    ca_data: bytes | None = None
    insecure: bool = False
    token: str | None = None
    token_file: Path | None = None
    client_cert: bytes | None = None
    client_key: bytes | None = None
    source: str = "kubeconfig"


def _data_or_file(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    data = entry.get(f"{key}-data")
    if isinstance(data, str) and data:
        try:
            return base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise KubeConfigError(f"{key}-data is not base64: {exc}") from exc
    path = entry.get(key)
    if isinstance(path, str) and path:
        full = Path(path) if os.path.isabs(path) else base / path
        try:
            return full.read_bytes()
        except OSError as exc:
            raise KubeConfigError(f"{key} {full}: {exc.strerror}") from exc
    return None


def _named(items: Any, name: str, what: str) -> Mapping[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(what), dict):
            return item[what]  # type: ignore[no-any-return]
    raise KubeConfigError(f"{what} {name!r} not found in kubeconfig")


def load_kubeconfig(path: Path, context: str | None = None) -> KubeConfig:
    """Read a kubeconfig file (its ``current-context`` unless ``context`` is given)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeConfigError(f"kubeconfig {path} is not a mapping")
    name = context or doc.get("current-context")
    if not isinstance(name, str) or not name:
        raise KubeConfigError(f"kubeconfig {path} has no current-context")
    ctx = _named(doc.get("contexts"), name, "context")
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster", "")), "cluster")
    user = _named(doc.get("users"), str(ctx.get("user", "")), "user") if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise KubeConfigError(
            f"user {ctx.get('user')!r} authenticates with an exec/auth-provider plugin, which the "
            "webhook does not run; use a token or a client certificate"
        )
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"cluster {ctx.get('cluster')!r} has no http(s) server")
    base = path.parent
    token_file = user.get("tokenFile")
    return KubeConfig(
        server=server.rstrip("/"),
        ca_data=_data_or_file(cluster, "certificate-authority", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        token=user.get("token") if isinstance(user.get("token"), str) else None,
        token_file=(base / token_file) if isinstance(token_file, str) and token_file else None,
        client_cert=_data_or_file(user, "client-certificate", base),
        client_key=_data_or_file(user, "client-key", base),
        source=f"kubeconfig {path} (context {name})",
    )


def in_cluster_config(root: Path = IN_CLUSTER_DIR, env: Mapping[str, str] | None = None) -> KubeConfig | None:
    """The pod's service-account credentials, or None outside a cluster."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    token = root / "token"
    if not host or not token.is_file():
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    ca = root / "ca.crt"
    return KubeConfig(
        server=f"https://{host}:{port}",
        ca_data=ca.read_bytes() if ca.is_file() else None,
        token_file=token,
        source="in-cluster service account",
    )


def _client_ssl(config: KubeConfig) -> ssl.SSLContext | bool:
    if not config.server.startswith("https://"):
        return False
    if config.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    ctx = ssl.create_default_context(cadata=config.ca_data.decode() if config.ca_data else None)
    if config.client_cert and config.client_key:
        # The ssl module loads client keys only from files: write them to a private temporary
        # directory for the duration of the call.
        with tempfile.TemporaryDirectory(prefix="mpigate-kube-") as tmp:
            cert, key = Path(tmp) / "client.crt", Path(tmp) / "client.key"
            for target, data in ((cert, config.client_cert), (key, config.client_key)):
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
            ctx.load_cert_chain(str(cert), str(key))
    return ctx


class KubeClient:
    """Reads from the API server. Create inside a running event loop; :meth:`close` when done."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        connect_timeout: float = 5.0,
        user_agent: str = "mpigate-webhook",
        request_timeout: float | None = None,
    ) -> None:
        self.config = config
        self._ssl = _client_ssl(config)
        self._session = aiohttp.ClientSession(
            base_url=config.server,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=20),
            headers={"Accept": "application/json", "User-Agent": user_agent},
        )
        self._request_timeout = request_timeout
        self._token: str | None = config.token
        self._token_read = 0.0

    async def close(self) -> None:
        await self._session.close()

    def _headers(self) -> dict[str, str]:
        if self.config.token_file is not None and time.monotonic() - self._token_read > TOKEN_REREAD_SECONDS:
            try:
                self._token = self.config.token_file.read_text().strip()
                self._token_read = time.monotonic()
            except OSError as exc:
                log.warning("cannot read token file %s: %s", self.config.token_file, exc)
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _error(self, resp: aiohttp.ClientResponse, path: str, method: str = "GET") -> KubeError:
        message = ""
        try:
            body = await resp.json(content_type=None)
            if isinstance(body, dict):
                message = str(body.get("message") or "")
        except (ValueError, aiohttp.ClientError):
            pass
        return KubeError(
            f"{method} {path}: HTTP {resp.status}" + (f": {message}" if message else ""),
            status=resp.status,
        )

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """GET a JSON object; raises :class:`KubeError`."""
        try:
            async with self._session.get(path, params=params, headers=self._headers()) as resp:
                if resp.status != 200:
                    raise await self._error(resp, path)
                body = await resp.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise KubeError(f"GET {path}: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:
            raise KubeError(f"GET {path}: response is not JSON", reason="bad-response") from exc
        if not isinstance(body, dict):
            raise KubeError(f"GET {path}: response is not a JSON object", reason="bad-response")
        return body

    async def list_pages(
        self,
        path: str,
        item: type[ItemT],
        reduce: Callable[[list[ItemT]], T],
        *,
        limit: int = LIST_PAGE_SIZE,
        label_selector: str | None = None,
    ) -> AsyncIterator[ListPage[T]]:
        """LIST ``path`` in pages of ``limit`` objects (``limit``/``continue``): each page's body is
        read without blocking, then decoded into ``item`` — a :class:`msgspec.Struct` naming only
        the fields the caller keeps; msgspec skips every other one without making a Python object
        of it — and reduced by ``reduce(items)`` at once. Neither a whole list nor a page of full
        objects ever exists, and the event loop answering admissions is held for one page's decode
        at a time (about 0.5 ms for 100 TrainJobs of ~5 KiB; a full parse with orjson took 4–5 ms
        and, with the dictionaries it made, started the garbage collector's full collections that
        paused the loop for up to 50 ms: ``benchmarks/live_cache.py``). Raises :class:`KubeError`,
        also for a page that is not JSON or whose items do not have ``item``'s shape (the message
        says where: ``$.items[3].metadata.name``).

        The decode runs on the loop's thread on purpose: a worker thread would not run it beside
        the loop (the decoder holds the GIL), and handing the GIL back and forth made every
        admission wait for the thread's switch interval.

        A ``410 Gone`` on a continue request (the snapshot the first page was read from has been
        compacted) starts the list again from a fresh snapshot: the items yielded so far belong to
        the abandoned one, so a page marked ``restarted`` tells the caller to drop them. client-go's
        pager falls back to one unpaginated LIST there (tools/pager/pager.go ``(*ListPager).list``,
        ``FullListIfExpired``) and the reflector relists from ``resourceVersion=""`` when even that
        expired (tools/cache/reflector.go ``(*Reflector).list``, ``relistResourceVersion``); an
        unpaginated LIST is what blocked the webhook, so it restarts paginated instead, at most
        :data:`LIST_RESTARTS` times before the error is raised. The webhook's job cache and the
        controller (:meth:`mpigate.controller.api.ControllerApi.pages`) both list through here."""
        decoder = _page_decoder(item)
        token = ""
        restarts = 0
        while True:
            params = {"limit": str(limit)}
            if label_selector:
                params["labelSelector"] = label_selector
            if token:
                params["continue"] = token
            try:
                raw = await self._get_bytes(path, params)
            except KubeError as exc:
                if exc.status != 410 or not token or restarts >= LIST_RESTARTS:
                    raise
                restarts += 1
                log.info("LIST %s: continue token expired (410): listing again from a fresh snapshot", path)
                token = ""
                yield ListPage(reduce([]), "", "", restarted=True)
                continue
            page = _decode_page(raw, path, decoder, reduce)
            yield page
            token = page.continue_token
            if not token:
                return

    async def _get_bytes(self, path: str, params: Mapping[str, str]) -> bytes:
        try:
            async with self._session.get(path, params=params, headers=self._headers()) as resp:
                if resp.status != 200:
                    raise await self._error(resp, path)
                return await resp.read()
        except aiohttp.ClientError as exc:
            raise KubeError(f"GET {path}: {type(exc).__name__}: {exc}") from exc

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """Send ``body`` as JSON with ``method`` (``POST``, ``PATCH`` with ``content_type``
        ``application/merge-patch+json``, ``DELETE`` ...) and return the JSON object answered.

        Raises :class:`KubeError` carrying the HTTP status (409 conflict, 404, 5xx ...)."""
        headers = self._headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        timeout = aiohttp.ClientTimeout(total=self._request_timeout) if self._request_timeout else None
        try:
            async with self._session.request(
                method, path, params=params, data=data, headers=headers, timeout=timeout
            ) as resp:
                if resp.status >= 300:
                    raise await self._error(resp, path, method)
                answer = await resp.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise KubeError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:
            raise KubeError(f"{method} {path}: timed out", reason="timeout") from exc
        except ValueError as exc:
            raise KubeError(f"{method} {path}: response is not JSON", reason="bad-response") from exc
        if not isinstance(answer, dict):
            raise KubeError(f"{method} {path}: response is not a JSON object", reason="bad-response")
        return answer

    async def watch(
        self, path: str, resource_version: str, *, timeout_seconds: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream watch events (``{"type": ..., "object": ...}``) from ``resource_version``.

        Ends when the server closes the stream (its ``timeoutSeconds``); raises
        :class:`KubeError` on HTTP or transport errors. ``ERROR`` events are yielded as they come
        (a 410 Gone among them means: relist).
        """
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        try:
            async with self._session.get(
                path,
                params=params,
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30),
            ) as resp:
                if resp.status != 200:
                    raise await self._error(resp, path)
                # Events are cut out of the buffer by position (splitting it per event copied the
                # rest of a large chunk once per event), and a burst — a watch resumed from an old
                # resourceVersion delivers every change since — hands the loop back to the
                # admissions every WATCH_YIELD_BYTES of events: the reader returns buffered data
                # without suspending, so a burst was otherwise decoded in one go.
                buffer = bytearray()
                decoded = 0
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    start = 0
                    while (end := buffer.find(b"\n", start)) != -1:
                        line = bytes(buffer[start:end])
                        start = end + 1
                        if line.strip():
                            yield _event(line, path)
                        decoded += len(line)
                        if decoded >= WATCH_YIELD_BYTES:
                            decoded = 0
                            await asyncio.sleep(0)
                    del buffer[:start]
                    if len(buffer) > MAX_EVENT_BYTES:
                        raise KubeError(f"WATCH {path}: event larger than {MAX_EVENT_BYTES} bytes")
                if buffer.strip():
                    yield _event(bytes(buffer), path)
        except aiohttp.ClientError as exc:
            raise KubeError(f"WATCH {path}: {type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:
            raise KubeError(f"WATCH {path}: no data within the read timeout", reason="timeout") from exc


_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {}


def _page_decoder(item: type[ItemT]) -> msgspec.json.Decoder[_ListBody[ItemT]]:
    """The decoder of LIST pages of ``item`` (made once per item type)."""
    decoder = _DECODERS.get(item)
    if decoder is None:
        decoder = _DECODERS[item] = msgspec.json.Decoder(_ListBody[item])  # type: ignore[valid-type]
    return decoder


def _decode_page(
    raw: bytes, path: str, decoder: msgspec.json.Decoder[_ListBody[ItemT]], reduce: Callable[[list[ItemT]], T]
) -> ListPage[T]:
    """A LIST page's body decoded and reduced."""
    try:
        body = decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise KubeError(f"GET {path}: unexpected list page: {exc}", reason="bad-response") from exc
    except msgspec.DecodeError as exc:
        raise KubeError(f"GET {path}: response is not JSON ({exc})", reason="bad-response") from exc
    return ListPage(reduce(body.items or []), body.metadata.resourceVersion, body.metadata.continue_)


def _event(line: bytes, path: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise KubeError(f"WATCH {path}: event is not JSON", reason="bad-response") from exc
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise KubeError(f"WATCH {path}: malformed event", reason="bad-response")
    return event

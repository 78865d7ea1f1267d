"""Fixtures for the webhook tests: a trustme CA, serving certificates, a copy of the fixture
org, real servers on 127.0.0.1:0 and HTTPS clients that trust the CA.

A test that starts a server runs twice, once per event loop ``mpigate serve --loop`` offers
(uvloop, the default, and asyncio's own): pytest-asyncio runs the test on that loop, the
in-process server (``start_webhook``) serves on it and a ``mpigate serve`` process
(``serving``) is started with ``--loop`` of the same kind. Other async tests run on uvloop, as
the server does by default."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
import pytest_asyncio
import trustme
import yaml

from mpigate.admission.eventloop import DEFAULT_LOOP, LOOPS, loop_factory
from mpigate.admission.server import ServeOptions, WebhookServer
from mpigate.admission.service import ServiceSettings
from mpigate.config import load
from mpigate.policy import AdmissionInput, apply_patch, mutations
from tests.conftest import FIXTURES

from .stub_engine import RELEASE, stub_evaluate

if TYPE_CHECKING:
    from .serve_process import ServeProcess  # it imports this module

ADMISSION_FIXTURES = FIXTURES / "admission"
BASE_ORG = FIXTURES / "config" / "base"

StartWebhook = Callable[..., Awaitable[WebhookServer]]

# fixtures that start a webhook server: on the test's loop, or as a process on a loop of its kind
SERVER_FIXTURES = frozenset({"start_webhook", "serving"})


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    """The event loops an async test of this directory runs on (pytest-asyncio's hook): every
    loop the server offers when the test starts a server, else the default one."""
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return {name: loop_factory(name) for name in LOOPS}
    return {DEFAULT_LOOP: loop_factory(DEFAULT_LOOP)}


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def as_mutated(obj: dict[str, Any], config: Path) -> dict[str, Any]:
    """``obj`` as the API server sends it to ``/validate``: after mpigate's own ``/mutate`` (the
    engine's patch for a CREATE, applied)."""
    meta = obj.get("metadata", {})
    kind = obj.get("kind", "TrainJob")
    request = AdmissionInput("CREATE", kind, meta.get("namespace"), meta.get("name", ""), obj)
    mutated = apply_patch(obj, mutations(load(config), request).patch)
    assert isinstance(mutated, dict)
    return mutated


def trainjob(**labels: str) -> dict[str, Any]:
    obj = load_yaml(ADMISSION_FIXTURES / "trainjob.yaml")
    obj["metadata"].setdefault("labels", {}).update(labels)
    return obj


async def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy (or fail after ``timeout``, which is
    generous: it only bounds a failing test, and parallel test runs make the machine slow)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


def write_cert(ca: trustme.CA, directory: Path, *names: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    issued = ca.issue_cert(*(names or ("127.0.0.1", "localhost")))
    cert, key = directory / "tls.crt", directory / "tls.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    for extra in issued.cert_chain_pems[1:]:
        extra.write_to_path(str(cert), append=True)
    issued.private_key_pem.write_to_path(str(key))
    return cert, key


@pytest.fixture
def tls_files(ca: trustme.CA, tmp_path: Path) -> tuple[Path, Path]:
    return write_cert(ca, tmp_path / "tls")


@pytest.fixture
def client_ssl(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


@pytest.fixture
def org(tmp_path: Path) -> Path:
    target = tmp_path / "org"
    shutil.copytree(BASE_ORG, target)
    return target


@pytest_asyncio.fixture
async def start_webhook(tls_files: tuple[Path, Path], org: Path) -> AsyncIterator[StartWebhook]:
    servers: list[WebhookServer] = []

    async def start(**kwargs: Any) -> WebhookServer:
        # A deadline and a live-context budget no loaded machine reaches by accident (the default
        # 500 ms budget for the Kueue reads ran out at load 10); the deadline tests set their own.
        settings = kwargs.pop("settings", ServiceSettings(deadline=30.0, live_timeout=10.0))
        options = ServeOptions(
            config=kwargs.pop("config", org),
            tls_cert=kwargs.pop("tls_cert", tls_files[0]),
            tls_key=kwargs.pop("tls_key", tls_files[1]),
            host="127.0.0.1",
            port=0,
            settings=settings,
            reload_interval=kwargs.pop("reload_interval", 3600.0),
            reload_debounce=kwargs.pop("reload_debounce", 0.0),
            **{k: kwargs.pop(k) for k in list(kwargs) if k in ServeOptions.__dataclass_fields__},
        )
        kwargs.setdefault("evaluator", stub_evaluate)
        server = WebhookServer(options, **kwargs)
        await server.start()
        servers.append(server)
        return server

    RELEASE.clear()
    yield start
    RELEASE.set()  # engine threads held by a test's "hang" label finish now
    for server in servers:
        await server.stop()


@pytest_asyncio.fixture
async def http(client_ssl: ssl.SSLContext) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl)) as session:
        yield session


class ThreadedWebhook:
    """A webhook server on its own event loop (of kind ``loop``) in a thread, for synchronous
    clients (hypothesis tests, benchmarks-in-tests)."""

    def __init__(self, options: ServeOptions, *, loop: str = DEFAULT_LOOP, **kwargs: Any) -> None:
        import threading

        self.loop = loop_factory(loop)()
        self.thread = threading.Thread(target=self.loop.run_forever, name="webhook", daemon=True)
        self.thread.start()

        async def start() -> WebhookServer:
            server = WebhookServer(options, **kwargs)
            await server.start()
            return server

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest_asyncio.fixture
async def serving() -> AsyncIterator[list[ServeProcess]]:
    """Serve processes a test starts (append them): killed at teardown."""
    started: list[ServeProcess] = []
    yield started
    for proc in started:
        await proc.kill()

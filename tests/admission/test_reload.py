"""Hot reload: config trees (plain directory and kubelet ConfigMap symlink swap) and the
serving certificate, without dropping connections."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import time
from pathlib import Path

import aiohttp
import pytest
import trustme
from cryptography import x509

from mpigate.admission.client import make_review
from mpigate.admission.reload import tree_stamp

from .conftest import BASE_ORG, StartWebhook, trainjob, wait_for, write_cert


async def validate_revision(http: aiohttp.ClientSession, url: str) -> str:
    async with http.post(url + "/validate", json=make_review(trainjob(), uid="u")) as resp:
        body = await resp.json()
    return str(body["response"]["auditAnnotations"]["revision"])


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> str:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    return "\n".join(line for line in text.splitlines() if line.startswith(name))


async def test_a_valid_change_is_swapped_in_and_an_invalid_one_rejected(
    start_webhook: StartWebhook, http: aiohttp.ClientSession, org: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (org / ".mpigate-revision").write_text("rev-1\n")
    server = await start_webhook(reload_interval=0.05)
    assert await validate_revision(http, server.url) == "rev-1"
    (org / ".mpigate-revision").write_text("rev-2\n")
    await wait_for(lambda: server.store.current and server.store.current.revision == "rev-2")
    assert await validate_revision(http, server.url) == "rev-2"
    assert 'mpigate_config_info{revision="rev-2"} 1.0' in await metric(
        http, server.url, "mpigate_config_info"
    )
    assert (
        await metric(http, server.url, "mpigate_config_reloads_total") == "mpigate_config_reloads_total 2.0"
    )

    # A broken quota file: rejected, counted, and rev-2 keeps serving.
    quota = org / "quotas" / "alpha.yaml"
    quota.write_text(quota.read_text().replace("maxNodesPerJob: 2", "maxNodesPerJb: 2"))
    (org / ".mpigate-revision").write_text("rev-3\n")
    failures = "mpigate_config_reload_failures_total"
    await wait_for(lambda: server.store.last_error is not None)
    assert "maxNodesPerJb" in server.store.last_error  # type: ignore[operator]
    rejected = [r for r in caplog.records if getattr(r, "fields", {}).get("event") == "config_rejected"]
    assert len(rejected) == 1
    message = rejected[0].getMessage()
    assert "quotas/alpha.yaml:" in message and "unknown key 'maxNodesPerJb'" in message
    assert message.endswith("; still serving rev-2 (`mpigate check` lists every problem)")
    assert await metric(http, server.url, failures) == f"{failures} 1.0"
    assert await validate_revision(http, server.url) == "rev-2"
    async with http.get(server.url + "/readyz") as resp:
        assert resp.status == 200  # still serving the last good config


def kubelet_write(volume: Path, files: dict[str, str] | dict[str, bytes]) -> None:
    """Update a ConfigMap volume as the kubelet does: a new timestamped directory, an atomic
    rename of the ``..data`` symlink, visible symlinks into ``..data`` (text: ``data`` keys,
    bytes: ``binaryData``)."""
    stamp = f"..{time.time_ns()}"
    (volume / stamp).mkdir()
    for name, content in files.items():
        target = volume / stamp / name
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    tmp = volume / "..data_tmp"
    tmp.symlink_to(stamp)
    old = os.readlink(volume / "..data") if (volume / "..data").is_symlink() else None
    os.replace(tmp, volume / "..data")
    for name in files:
        link = volume / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    if old:
        shutil.rmtree(volume / old)


def bundle(revision: str) -> dict[str, str]:
    files = {
        p.relative_to(BASE_ORG).as_posix().replace("/", "_"): p.read_text() for p in BASE_ORG.rglob("*.yaml")
    }
    files = {k: v for k, v in files.items() if not k.startswith(("jobs_", "policies_tests_"))}
    files[".mpigate-revision"] = revision
    return files


async def test_a_configmap_symlink_swap_is_picked_up(
    start_webhook: StartWebhook, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    volume = tmp_path / "configmap"
    volume.mkdir()
    kubelet_write(volume, bundle("cm-1"))
    server = await start_webhook(config=volume, reload_interval=0.05, reload_debounce=0.1)
    assert await validate_revision(http, server.url) == "cm-1"
    kubelet_write(volume, bundle("cm-2"))
    await wait_for(lambda: server.store.current and server.store.current.revision == "cm-2")
    assert await validate_revision(http, server.url) == "cm-2"


async def http_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> int:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length"))
    await reader.readexactly(length)
    return int(lines[0].split()[1])


def serial_of(writer: asyncio.StreamWriter) -> int:
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


async def test_certificate_rotation_keeps_open_connections(
    start_webhook: StartWebhook, ca: trustme.CA, tls_files: tuple[Path, Path], client_ssl: ssl.SSLContext
) -> None:
    server = await start_webhook()
    first = x509.load_pem_x509_certificate(tls_files[0].read_bytes()).serial_number
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_ssl)
    assert await http_get(reader, writer, "/healthz") == 200
    assert serial_of(writer) == first

    # cert-manager renews into the Secret: a new pair replaces the files.
    staging = tls_files[0].parent.parent / "staging"
    new_cert, new_key = write_cert(ca, staging)
    os.replace(new_key, tls_files[1])
    os.replace(new_cert, tls_files[0])
    second = x509.load_pem_x509_certificate(tls_files[0].read_bytes()).serial_number
    assert second != first
    await server.check_reload()

    _, fresh = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_ssl)
    assert serial_of(fresh) == second
    fresh.close()
    # The connection opened before the rotation keeps working, on its original certificate.
    assert await http_get(reader, writer, "/readyz") == 200
    assert serial_of(writer) == first
    writer.close()


async def test_a_half_written_certificate_is_not_loaded(
    start_webhook: StartWebhook,
    ca: trustme.CA,
    tls_files: tuple[Path, Path],
    client_ssl: ssl.SSLContext,
    http: aiohttp.ClientSession,
) -> None:
    server = await start_webhook()
    first = x509.load_pem_x509_certificate(tls_files[0].read_bytes()).serial_number
    other = write_cert(ca, tls_files[0].parent.parent / "other")
    os.replace(other[0], tls_files[0])  # the new cert, but the old key: they do not match
    await server.check_reload()
    _, conn = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_ssl)
    assert serial_of(conn) == first
    conn.close()
    assert 'mpigate_tls_reloads_total{result="failed"} 1.0' in await metric(http, server.url, "mpigate_tls")
    os.replace(other[1], tls_files[1])  # now the key arrives
    await server.check_reload()
    _, conn = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_ssl)
    assert serial_of(conn) != first
    conn.close()


def test_the_fingerprint_covers_exactly_the_config_files(org: Path) -> None:
    before = tree_stamp(org)
    # Not config: other file types, excluded top-level folders, hidden folders.
    (org / "README.md").write_text("notes\n")
    (org / "docs").mkdir(exist_ok=True)
    (org / "docs" / "page.yaml").write_text("a: 1\n")
    (org / ".git").mkdir(exist_ok=True)
    (org / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert tree_stamp(org) == before
    # Config: a new YAML file, an edited one, the ignore file, the bundle revision.
    (org / "quotas" / "new.yaml").write_text("# empty\n")
    after_new = tree_stamp(org)
    assert after_new != before
    (org / ".mpigateignore").write_text("quotas/new.yaml\n")
    after_ignore = tree_stamp(org)
    assert after_ignore not in (before, after_new)
    (org / ".mpigate-revision").write_text("rev-9\n")
    assert tree_stamp(org) != after_ignore


async def test_a_path_that_is_no_config_tree_is_named_as_such(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mpigate.admission.reload import ConfigStore

    empty = tmp_path / "not-mounted-yet"
    empty.mkdir()
    store = ConfigStore(empty)
    assert await store.load_now() is None
    rejected = [r for r in caplog.records if getattr(r, "fields", {}).get("event") == "config_rejected"]
    assert len(rejected) == 1
    message = rejected[0].getMessage()
    assert message.startswith(
        f"config at {empty} rejected: {empty} is not an mpigate config tree (no OrgPolicy document): "
        "check --config and that the config bundle ConfigMap is mounted there (and "
    )
    assert message.endswith("; still serving nothing (`mpigate check` lists every problem)")


class _Garbage:
    """A weak-referenceable object kept alive only by a reference cycle."""

    def __init__(self) -> None:
        self.me = self


async def test_a_config_swap_freezes_the_heap_and_frees_what_the_previous_left(org: Path) -> None:
    """Full garbage collections skip the served config and the code (gc.freeze): they walked the
    whole heap on the loop that answers admissions. A swap collects what was frozen before."""
    import gc
    import weakref

    from mpigate.admission.reload import ConfigStore

    try:
        gc.unfreeze()
        store = ConfigStore(org, debounce=0.0)
        assert await store.load_now() is not None
        assert gc.get_freeze_count() > 0
        # garbage in a cycle that an earlier swap froze: freed at the next swap, not kept forever
        leftover = _Garbage()
        gone = weakref.ref(leftover)
        gc.freeze()
        del leftover
        assert gone() is not None
        (org / ".mpigate-revision").write_text("rev-next\n")
        await wait_for(lambda: store.poll())
        assert store.current is not None and store.current.revision == "rev-next"
        assert gone() is None
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()

"""Faults are answered, not crashed (issue 23, item 4), against the real ``mpigate serve`` over
TLS: a body in a content coding it cannot read, a client that goes away mid-body, and an audit
disk that is full when the server starts."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from click.testing import CliRunner

from mpigate.admission.client import make_review
from mpigate.audit import generate_key
from mpigate.cli import cli
from tests.conftest import fill_disk

from .conftest import BASE_ORG, trainjob, wait_for
from .serve_process import ServeProcess

pytestmark = pytest.mark.slow

REVIEW = json.dumps(make_review(trainjob(), uid="fault-1")).encode()


async def raw_request(
    url: str, ctx: ssl.SSLContext, head: bytes, body: bytes, *, close_after: bool = False
) -> bytes:
    """Send ``head`` and ``body`` on a fresh TLS connection; the whole answer (or b"" when
    ``close_after``: the client hangs up right after sending)."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=host)
    writer.write(head + body)
    await writer.drain()
    if close_after:
        writer.transport.abort()
        return b""
    answer = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return answer


def head(path: str, length: int, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}", "Connection: close"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    header, _, body = answer.partition(b"\r\n\r\n")
    return int(header.split(b" ", 2)[1]), json.loads(body)


@pytest.mark.parametrize(
    ("encoding", "status", "fragment"),
    [
        ("gzip", 400, "cannot decode the gzip body"),
        ("deflate", 400, "cannot decode the deflate body"),
        ("x-snappy", 415, "content encoding x-snappy is not supported"),
    ],
)
async def test_a_body_that_cannot_be_decoded_is_a_clear_client_error(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess], encoding: str, status: int, fragment: str
) -> None:
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG)).start()
    serving.append(server)
    answer = await raw_request(
        server.url, server.client_ssl, head("/validate", len(REVIEW), Content_Encoding=encoding), REVIEW
    )
    got, body = status_and_body(answer)
    assert got == status, answer
    assert body["kind"] == "Status" and fragment in body["message"], body
    # the server goes on: a good review is answered
    good = await raw_request(server.url, server.client_ssl, head("/validate", len(REVIEW)), REVIEW)
    assert status_and_body(good)[0] == 200
    assert await server.stop() == 0
    assert server.tracebacks() == []
    assert not [e for e in server.events if e.get("level") in ("error", "critical")]


async def test_a_client_that_hangs_up_mid_body_costs_one_debug_line(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG), "--log-level", "debug").start()
    serving.append(server)
    for _ in range(3):
        await raw_request(
            server.url, server.client_ssl, head("/validate", 10_000), REVIEW[:100], close_after=True
        )
    await wait_for(lambda: len([e for e in server.events if e.get("event") == "client_disconnected"]) == 3)
    good = await raw_request(server.url, server.client_ssl, head("/validate", len(REVIEW)), REVIEW)
    assert status_and_body(good)[0] == 200
    assert await server.stop() == 0
    gone = [e for e in server.events if e.get("event") == "client_disconnected"]
    assert len(gone) == 3 and all(e["level"] == "debug" for e in gone)
    assert server.tracebacks() == []
    assert not [e for e in server.events if e.get("level") in ("error", "critical", "warning")]


async def test_a_full_audit_disk_at_start_is_not_ready_with_the_reason_and_recovers(
    ca: trustme.CA, tmp_path: Path, tiny_tmpfs: Path, serving: list[ServeProcess]
) -> None:
    audit = tiny_tmpfs / "audit"
    filler = tiny_tmpfs / "filler"
    key = tmp_path / "audit.key"
    key.write_bytes(generate_key("ed25519")[0])
    with pytest.raises(OSError, match="No space left"):
        fill_disk(filler)
    server = await ServeProcess(
        ca, tmp_path, "--config", str(BASE_ORG), "--audit-dir", str(audit), "--audit-key", str(key)
    ).start()
    serving.append(server)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=server.client_ssl)) as http:
        async with http.get(server.url + "/readyz") as resp:
            assert resp.status == 503
            ready = await resp.json()
        assert ready["status"] == "audit trail not writable"
        assert "ENOSPC" in ready["reason"] and str(audit) in ready["reason"]
        # fail closed: no answer without its record (the API server's failurePolicy applies)
        async with http.post(
            server.url + "/validate", data=REVIEW, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 500
        filler.unlink()

        async def ready_again() -> bool:
            async with http.get(server.url + "/readyz") as resp:
                return resp.status == 200

        await wait_for(ready_again)
        async with http.post(
            server.url + "/validate", data=REVIEW, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 200
            assert (await resp.json())["response"]["uid"] == "fault-1"
    assert await server.stop() == 0
    assert server.tracebacks() == []
    verify = CliRunner().invoke(cli, ["audit", "verify", str(audit), "--key", str(key)])
    assert verify.exit_code == 0, verify.output
    assert "all verified" in verify.output
    records = [
        json.loads(line) for seg in sorted(audit.rglob("*.jsonl")) for line in seg.read_text().splitlines()
    ]
    assert [r["request"]["uid"] for r in records if r.get("stage") == "validate"] == ["fault-1"]

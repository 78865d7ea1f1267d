"""The job cache's LIST at cluster scale (issue 25 item 3): paginated (``limit``/``continue``), one
page parsed at a time and reduced to names while the loop serves between pages, an expired
continue token (410) answered by a fresh paginated list, and lookups that see the previous list
until the new one is complete.

A real aiohttp server on 127.0.0.1 plays the API server, with pages and 410s as the API server gives
them (kmock answers every LIST with the whole list)."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

import mpigate.admission.kube as kube
import mpigate.admission.live as live
from mpigate.admission.kube import (
    LIST_PAGE_SIZE,
    LIST_RESTARTS,
    WATCH_YIELD_BYTES,
    KubeClient,
    KubeConfig,
    KubeError,
)
from mpigate.admission.live import MPIJOBS, TRAINJOBS, JobCache, is_active

from .conftest import wait_for

TJ_PATH = "/apis/trainer.kubeflow.org/v1alpha1/trainjobs"


def job(ns: str, name: str, finished: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": "TrainJob", "metadata": {"name": name, "namespace": ns}}
    if finished:
        obj["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    return obj


@dataclass
class FakeApi:
    """Snapshots of TrainJobs served in pages; watches that end with 410 on demand."""

    snapshots: list[list[dict[str, Any]]]
    requests: list[dict[str, str]] = field(default_factory=list)
    expire_continues: int = 0  # answer this many continue requests with 410 Gone
    hold_page: int | None = None  # hold the page at this offset until `release` is set
    release: asyncio.Event = field(default_factory=asyncio.Event)
    held: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    current: int = 0  # the snapshot a fresh list reads
    burst: list[dict[str, Any]] = field(default_factory=list)  # events a watch sends in one write

    async def handle(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        if params.get("watch") == "true":
            return await self.watch(request)
        self.requests.append(params)
        token = params.get("continue", "")
        if token and self.expire_continues:
            self.expire_continues -= 1
            self.current = min(self.current + 1, len(self.snapshots) - 1)  # compacted meanwhile
            body = {"kind": "Status", "code": 410, "reason": "Expired", "message": "continue expired"}
            return web.json_response(body, status=410)
        snapshot, start = (int(token.split(":")[0]), int(token.split(":")[1])) if token else (self.current, 0)
        if self.hold_page is not None and start == self.hold_page:
            self.held.set()
            await self.release.wait()
        items = self.snapshots[snapshot]
        limit = int(params.get("limit") or 0) or len(items)
        page = items[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(100 + snapshot)}
        if start + limit < len(items):
            meta["continue"] = f"{snapshot}:{start + limit}"
        return web.json_response({"kind": "TrainJobList", "metadata": meta, "items": page})

    async def watch(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        if self.burst:
            await resp.write(b"".join(json.dumps(event).encode() + b"\n" for event in self.burst))
            self.burst = []
        await self.gone.wait()
        self.gone.clear()
        error = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
        await resp.write(json.dumps(error).encode() + b"\n")
        return resp


@pytest_asyncio.fixture
async def api() -> AsyncIterator[tuple[FakeApi, KubeClient]]:
    fake = FakeApi(snapshots=[])
    app = web.Application()
    app.router.add_get(TJ_PATH, fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = KubeClient(KubeConfig(server=f"http://127.0.0.1:{runner.addresses[0][1]}"))
    yield fake, client
    await client.close()
    fake.gone.set()  # end the open watches and held pages, so that the server stops at once
    fake.release.set()
    await runner.cleanup()


def jobs(n: int, prefix: str = "j") -> list[dict[str, Any]]:
    """``n`` jobs over two namespaces, every third finished."""
    return [job("alpha" if i % 2 else "beta", f"{prefix}{i}", finished=i % 3 == 0) for i in range(n)]


def active(items: list[dict[str, Any]], ns: str) -> int:
    return sum(1 for j in items if j["metadata"]["namespace"] == ns and "status" not in j)


class Ticker:
    """Stands for the admissions the loop answers meanwhile: counts the loop's turns it gets."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.ticks += 1

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def test_the_list_is_paginated_and_the_loop_serves_between_pages(
    api: tuple[FakeApi, KubeClient], monkeypatch: Any
) -> None:
    fake, client = api
    fake.snapshots = [jobs(2 * LIST_PAGE_SIZE + 50)]
    ticker = Ticker()

    parsed: list[tuple[int, int]] = []  # (items parsed at once, ticks so far)
    reduce = live._active_names

    def recorded(items: list[Any], **kind: Any) -> list[tuple[str, str]]:
        parsed.append((len(items), ticker.ticks))
        return reduce(items, **kind)

    monkeypatch.setattr(live, "_active_names", recorded)
    cache = JobCache(client)
    ticker.start()
    cache.start()
    try:
        await wait_for(lambda: cache.synced)
        assert cache.active_jobs(("alpha",)) == active(fake.snapshots[0], "alpha")
        assert cache.active_jobs(("beta",)) == active(fake.snapshots[0], "beta")
        # three pages of at most LIST_PAGE_SIZE, each continuing the one before
        assert [r.get("limit") for r in fake.requests] == [str(LIST_PAGE_SIZE)] * 3
        assert [r.get("continue") for r in fake.requests] == [
            None,
            f"0:{LIST_PAGE_SIZE}",
            f"0:{2 * LIST_PAGE_SIZE}",
        ]
        # never more than a page parsed at once, and the loop ran other tasks between pages
        assert [n for n, _ in parsed] == [LIST_PAGE_SIZE, LIST_PAGE_SIZE, 50]
        assert parsed[0][1] < parsed[1][1] < parsed[2][1]
    finally:
        ticker.stop()
        await cache.stop()


async def test_an_expired_continue_token_restarts_the_list_from_a_fresh_snapshot(
    api: tuple[FakeApi, KubeClient],
) -> None:
    fake, client = api
    old, fresh = jobs(250, "old"), jobs(130, "new")
    fake.snapshots = [old, fresh]
    fake.expire_continues = 1
    cache = JobCache(client)
    cache.start()
    try:
        await wait_for(lambda: cache.synced)
        # only the fresh snapshot counts: nothing of the abandoned first page is kept
        assert cache.active_jobs(("alpha", "beta")) == active(fresh, "alpha") + active(fresh, "beta")
        assert [r.get("continue") for r in fake.requests] == [
            None,
            f"0:{LIST_PAGE_SIZE}",
            None,
            f"1:{LIST_PAGE_SIZE}",
        ]
        assert cache.lists == 1
    finally:
        await cache.stop()


async def test_a_list_that_keeps_expiring_is_reported(api: tuple[FakeApi, KubeClient]) -> None:
    fake, client = api
    fake.snapshots = [jobs(250)]
    fake.expire_continues = LIST_RESTARTS + 1
    errors: list[tuple[str, str]] = []
    cache = JobCache(client, on_error=lambda s, r: errors.append((s, r)), backoff=(30, 30))
    cache.start()
    try:
        await wait_for(lambda: errors)
        assert not cache.synced
        assert errors[0] == ("trainjobs", "http-410")
        assert "410" in (cache.last_error or "")
        continues = [r for r in fake.requests if r.get("continue")]
        assert len(continues) == LIST_RESTARTS + 1
    finally:
        await cache.stop()


async def test_lookups_see_the_previous_list_until_the_new_one_is_complete(
    api: tuple[FakeApi, KubeClient],
) -> None:
    fake, client = api
    before, after = jobs(250, "a"), jobs(40, "b") + jobs(300, "c")
    fake.snapshots = [before, after]
    cache = JobCache(client, backoff=(0.01, 0.05))
    cache.start()
    try:
        await wait_for(lambda: cache.synced)
        team = ("alpha", "beta")
        old_count = active(before, "alpha") + active(before, "beta")
        assert cache.active_jobs(team) == old_count
        # the watch expires: the cache relists, and the API server is slow with its second page
        fake.current = 1
        fake.hold_page = LIST_PAGE_SIZE
        fake.gone.set()
        await wait_for(fake.held.is_set)
        assert cache.active_jobs(team) == old_count  # not the first page of the new list
        assert cache.synced
        fake.release.set()
        await wait_for(lambda: cache.lists == 2)
        assert cache.active_jobs(team) == active(after, "alpha") + active(after, "beta")
    finally:
        await cache.stop()


def heavy_job(i: int) -> dict[str, Any]:
    """A listed TrainJob as ``kubectl apply`` leaves it: spec, managedFields, last-applied copy."""
    obj = job(f"team-{i % 7}", f"job-{i}")
    obj["spec"] = {
        "runtimeRef": {"name": "mpi"},
        "trainer": {"numNodes": 4, "env": [{"name": "A", "value": "b"}]},
    }
    obj["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj)}
    obj["metadata"]["managedFields"] = [
        {"manager": "kubectl", "fieldsV1": {f"f:field{n}": {} for n in range(150)}}
    ]
    obj["status"] = {
        "conditions": [{"type": "Suspended", "status": "False"}],
        "jobsStatus": [{"name": "node"}],
    }
    return obj


def test_a_page_is_decoded_into_the_fields_the_cache_keeps() -> None:
    # A full parse made every object of the page (several times its size in Python objects, and
    # enough containers to start the garbage collector's full collections on the serving loop);
    # the decode makes only what decides whether a job is active.
    raw = json.dumps(
        {"metadata": {"resourceVersion": "7", "continue": "c"}, "items": [heavy_job(i) for i in range(100)]}
    ).encode()
    decoder = kube._page_decoder(live._ListedJob)
    tracemalloc.start()
    try:
        page = kube._decode_page(raw, "/x", decoder, live._active_names)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (page.resource_version, page.continue_token) == ("7", "c")
    assert len(page.items) == 100 and ("team-3", "job-3") in page.items
    assert peak < len(raw) / 4, (peak, len(raw))


def test_a_listed_job_is_active_exactly_when_is_active_says_so() -> None:
    deleting = job("a", "deleting")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    variants = [
        job("a", "plain"),
        job("a", "complete", finished=True),
        deleting,
        {
            "metadata": {"name": "x", "namespace": "a"},
            "status": {"conditions": [{"type": "Failed", "status": "False"}]},
        },
        {
            "metadata": {"name": "y", "namespace": "a"},
            "status": {"conditions": [{"type": "Failed", "status": "True"}]},
        },
        {
            "metadata": {"name": "z", "namespace": "a"},
            "status": {"conditions": [{"type": "Succeeded", "status": "True"}]},
        },
        {"metadata": {"name": "w", "namespace": "a"}, "status": {}},
        # not the strings a condition has: the job keeps counting, the list does not fail
        {
            "metadata": {"name": "v", "namespace": "a"},
            "status": {"conditions": [{"type": 7, "status": True}]},
        },
        {"metadata": {"name": "u", "namespace": "a"}, "status": {"conditions": [{"type": "Complete"}]}},
        {"metadata": {"name": "cluster-scoped"}},
    ]
    raw = json.dumps({"metadata": {}, "items": variants}).encode()
    for kind in (TRAINJOBS, MPIJOBS):
        reduce = lambda items, kind=kind: live._active_names(items, kind)  # noqa: E731
        page = kube._decode_page(raw, "/x", kube._page_decoder(live._ListedJob), reduce)
        expected = [
            (v["metadata"]["namespace"], v["metadata"]["name"])
            for v in variants
            if "namespace" in v["metadata"] and is_active(v, kind)
        ]
        assert page.items == expected, kind.kind
        assert page.continue_token == "" and page.resource_version == ""


async def test_a_page_that_is_not_a_list_of_jobs_is_an_error_that_says_where(
    api: tuple[FakeApi, KubeClient],
) -> None:
    fake, client = api
    bad = jobs(5)
    bad[3]["metadata"]["name"] = 17  # not a name
    fake.snapshots = [bad]
    errors: list[tuple[str, str]] = []
    cache = JobCache(client, on_error=lambda s, r: errors.append((s, r)), backoff=(30, 30))
    cache.start()
    try:
        await wait_for(lambda: errors)
        assert errors[0] == ("trainjobs", "bad-response")
        assert not cache.synced
        assert "$.items[3].metadata.name" in (cache.last_error or ""), cache.last_error
    finally:
        await cache.stop()


def test_a_page_that_is_not_json_is_an_error() -> None:
    with pytest.raises(KubeError, match="not JSON"):
        kube._decode_page(b'{"items": [', "/x", kube._page_decoder(live._ListedJob), live._active_names)


async def test_a_burst_of_watch_events_lets_the_loop_serve_in_between(
    api: tuple[FakeApi, KubeClient], monkeypatch: Any
) -> None:
    # A watch resumed from an old resourceVersion gets every change since in a burst; the reader
    # hands out buffered data without suspending, so the whole burst was decoded in one go.
    fake, client = api
    fake.snapshots = [jobs(10)]
    padding = "x" * 1000
    fake.burst = [
        {"type": "ADDED", "object": {**job("gamma", f"w{i}"), "spec": {"pad": padding}}} for i in range(600)
    ]
    per_yield = WATCH_YIELD_BYTES // 1000 + 2  # events of ~1 KB between two hand-backs, at most
    ticker = Ticker()

    seen: list[int] = []  # the ticker's count when each event was applied
    judge = live.is_active

    def recorded(obj: Any, kind: Any = TRAINJOBS) -> bool:
        if (obj.get("metadata") or {}).get("namespace") == "gamma":
            seen.append(ticker.ticks)
        return judge(obj, kind)

    monkeypatch.setattr(live, "is_active", recorded)
    cache = JobCache(client)
    ticker.start()
    cache.start()
    try:
        await wait_for(lambda: cache.active_jobs(("gamma",)) == 600)
        runs = [sum(1 for t in seen if t == tick) for tick in sorted(set(seen))]
        assert max(runs) <= per_yield, runs
    finally:
        ticker.stop()
        await cache.stop()

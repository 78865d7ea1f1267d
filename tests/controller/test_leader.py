"""Leader election on an in-memory Lease store that enforces resourceVersion (kmock does not):
one winner per race, takeover only after the lease duration on the candidate's own clock, a
holder that cannot renew in time gives up, release hands over at once."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest

from mpigate.admission.kube import KubeError
from mpigate.controller.leader import LeadershipLost, LeaseElector, LeaseSettings

# The lease (30 s) is far longer than the renew deadline (1 s), so that "gave up before the lease
# expired" holds on a loaded machine too; takeovers are driven by a fake clock.
SETTINGS = LeaseSettings(
    namespace="mpigate-system", lease_duration=30.0, renew_deadline=1.0, retry_period=0.1
)


class LeaseStore:
    """The API server's behaviour for one Lease: 404, 409 on create and on a stale resourceVersion."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.hang = False

    async def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    async def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.lease is not None:
            raise KubeError("exists", status=409)
        self.version += 1
        self.lease = {
            **copy.deepcopy(dict(body)),
            "metadata": {**body["metadata"], "resourceVersion": str(self.version)},
        }
        return copy.deepcopy(self.lease)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        if self.hang:
            await asyncio.Event().wait()
        assert self.lease is not None
        if patch.get("metadata", {}).get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise KubeError("conflict", status=409)
        for key, value in patch["spec"].items():
            if value is None:
                self.lease["spec"].pop(key, None)
            else:
                self.lease["spec"][key] = value
        self.version += 1
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(store: LeaseStore, identity: str, clock: Clock | None = None) -> LeaseElector:
    kwargs = {"clock": clock} if clock else {}
    return LeaseElector(store, SETTINGS, identity, **kwargs)  # type: ignore[arg-type]


async def test_only_one_candidate_wins_a_race() -> None:
    store = LeaseStore()
    a, b = elector(store, "a"), elector(store, "b")
    results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
    assert sorted(results) == [False, True]
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] in ("a", "b")
    assert store.lease["spec"]["leaseDurationSeconds"] == 30


async def test_takeover_only_after_the_lease_expired_on_the_candidates_clock() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, "a"), elector(store, "b", clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # first sight of the record starts b's timer
    clock.now += 29.9
    assert not await b.try_acquire_or_renew()
    assert await a.try_acquire_or_renew()  # a renews: the record changes, b's timer restarts
    clock.now += 29.9
    assert not await b.try_acquire_or_renew()
    clock.now += 30.1  # a went silent for longer than the lease
    assert await b.try_acquire_or_renew()
    assert store.lease is not None
    assert store.lease["spec"]["holderIdentity"] == "b"
    assert store.lease["spec"]["leaseTransitions"] == 1


async def test_a_holder_whose_renewals_hang_gives_up_before_the_lease_expires() -> None:
    store = LeaseStore()
    a = elector(store, "a")
    assert await a.try_acquire_or_renew()
    store.hang = True
    with pytest.raises(LeadershipLost, match="could not renew lease mpigate-controller for 1s"):
        await asyncio.wait_for(a.hold(), SETTINGS.lease_duration)
    assert not a.leading


async def test_a_holder_that_finds_another_holder_gives_up() -> None:
    store = LeaseStore()
    a = elector(store, "a")
    assert await a.try_acquire_or_renew()
    assert store.lease is not None
    store.lease["spec"]["holderIdentity"] = "intruder"
    store.lease["spec"]["renewTime"] = "2026-11-22T10:00:00.000000Z"
    with pytest.raises(LeadershipLost, match="held by another instance"):
        await asyncio.wait_for(a.hold(), SETTINGS.lease_duration)


async def test_release_hands_over_at_once() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, "a"), elector(store, "b", clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert store.lease is not None and "holderIdentity" not in store.lease["spec"]
    assert await b.try_acquire_or_renew()  # no waiting for the lease duration
    await a.release()  # not the holder any more: leaves b alone
    assert store.lease["spec"]["holderIdentity"] == "b"

"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection``.

Replicas of the controller compete for one Lease; only the holder runs the kopf handlers, the
others wait. The holder renews every ``retry_period``; a candidate takes over when it has not
seen the Lease change for ``lease_duration`` (judged by the candidate's own clock since it last
saw the record change, so clock skew between nodes does not matter). Every write carries the
``resourceVersion`` it read, so two candidates cannot both win: the second write is a 409.

A holder that cannot renew within ``renew_deadline`` gives up (:class:`LeadershipLost`) and the
process exits — like controller-runtime — so it restarts as a candidate. On a clean shutdown the
holder releases the Lease (empty holder) and a standby takes over at once.

Why not kopf's peering: with equal priorities kopf pauses *every* operator that sees a peer
(``Pausing all operators, including self``), so two identical replicas would both stop; it
needs distinct priorities per replica and its own CRDs. A Lease is what Kubernetes controllers
use and needs only Role permissions in the controller's namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mpigate.admission.kube import KubeError

from .api import ControllerApi, lease_path

__all__ = ["LeadershipLost", "LeaseElector", "LeaseSettings"]

log = logging.getLogger(__name__)


class LeadershipLost(Exception):
    """The Lease could not be renewed in time (or another holder took it)."""


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    namespace: str
    name: str = "mpigate-controller"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry period < renew deadline < lease duration")


def _micro_time(value: dt.datetime) -> str:
    """A ``MicroTime`` as the API server writes it."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _guarded(lease: Mapping[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` with the resourceVersion read, so that a concurrent change makes it fail (409)."""
    version = (lease.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": version}, **patch} if version else patch


class LeaseElector:
    """Acquires, renews and releases the Lease for ``identity``."""

    def __init__(
        self,
        api: ControllerApi,
        settings: LeaseSettings,
        identity: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.api = api
        self.settings = settings
        self.identity = identity
        self._clock = clock
        self._wall = wall
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._leading = False

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def path(self) -> str:
        return lease_path(self.settings.namespace, self.settings.name)

    def _spec(self, spec: Mapping[str, Any], *, renew: bool) -> dict[str, Any]:
        now = _micro_time(self._wall())
        found = spec.get("leaseTransitions")
        transitions = found if isinstance(found, int) else 0
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_duration)),
            "acquireTime": spec.get("acquireTime") if renew and spec.get("acquireTime") else now,
            "renewTime": now,
            "leaseTransitions": transitions if renew else transitions + 1,
        }

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this instance holds the Lease afterwards."""
        lease = await self.api.get(self.path)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
                "spec": {**self._spec({}, renew=False), "leaseTransitions": 0},
            }
            try:
                await self.api.create(lease_path(self.settings.namespace), body)
            except KubeError as exc:
                if exc.status == 409:
                    return False  # another candidate created it first
                raise
            self._leading = True
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (
            holder,
            spec.get("renewTime"),
            spec.get("leaseTransitions"),
            spec.get("leaseDurationSeconds"),
        )
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.get("leaseDurationSeconds") or self.settings.lease_duration
        if holder and holder != self.identity and now < self._observed_at + float(duration):
            self._leading = False
            return False
        renew = holder == self.identity
        patch = _guarded(lease, {"spec": self._spec(spec, renew=renew)})
        try:
            await self.api.merge_patch(self.path, patch)
        except KubeError as exc:
            if exc.status == 409:
                self._leading = False
                return False
            raise
        if not renew:
            log.info(
                "acquired lease %s/%s as %s (previous holder: %s)",
                self.settings.namespace,
                self.settings.name,
                self.identity,
                holder or "none",
            )
        self._leading = True
        return True

    async def acquire(self, stop: asyncio.Event | None = None) -> bool:
        """Wait until this instance leads (True) or ``stop`` is set (False)."""
        while stop is None or not stop.is_set():
            try:
                async with asyncio.timeout(self.settings.renew_deadline):
                    if await self.try_acquire_or_renew():
                        return True
            except (KubeError, TimeoutError) as exc:
                log.warning("leader election: %s", exc or "timed out")
            if stop is None:
                await asyncio.sleep(self.settings.retry_period)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.retry_period)
        return False

    async def hold(self) -> None:
        """Renew until the renew deadline passes without success; then raise LeadershipLost."""
        last_renewed = self._clock()
        while True:
            await asyncio.sleep(self.settings.retry_period)
            # A hanging request must not outlive the deadline: by then a standby may lead.
            remaining = self.settings.renew_deadline - (self._clock() - last_renewed)
            try:
                async with asyncio.timeout(max(remaining, 0.001)):
                    renewed = await self.try_acquire_or_renew()
                if renewed:
                    last_renewed = self._clock()
                    continue
                self._leading = False
                raise LeadershipLost(f"lease {self.settings.name} is held by another instance")
            except (KubeError, TimeoutError) as exc:
                log.warning("could not renew lease %s: %s", self.settings.name, exc or "timed out")
            if self._clock() - last_renewed > self.settings.renew_deadline:
                self._leading = False
                raise LeadershipLost(
                    f"could not renew lease {self.settings.name} for {self.settings.renew_deadline:g}s"
                )

    async def release(self) -> None:
        """Give the Lease up (only when held), so that a standby takes over at once."""
        if not self._leading:
            return
        self._leading = False
        try:
            lease = await self.api.get(self.path)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            released = {
                "holderIdentity": None,
                "leaseDurationSeconds": 1,
                "renewTime": _micro_time(self._wall()),
            }
            await self.api.merge_patch(self.path, _guarded(lease, {"spec": released}))
            log.info("released lease %s/%s", self.settings.namespace, self.settings.name)
        except KubeError as exc:
            log.warning("could not release lease %s: %s", self.settings.name, exc)

"""A reproducible random sample of the period's decisions (``--sample N --seed S``).

Bottom-k sampling: each validate record gets the priority ``hash ⊕ seed`` (the record's own
SHA-256, which is uniformly distributed, mixed with a key derived from the seed) and the sample is
the N records of lowest priority. The same inputs and seed give the same sample whatever the order
of reading, the number of worker processes or the merging; another seed gives an independent one.
An auditor re-draws it with the same command and tests each sampled request against the chain
(``<chain>:<seq>:<hash>``) and the API server's log (request UID).
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Any

__all__ = ["Sampler"]

_MASK = (1 << 64) - 1


class Sampler:
    """The ``size`` lowest-priority samples seen (a max-heap on priority)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.seed = seed
        self._key = int.from_bytes(hashlib.sha256(f"mpigate-sample:{seed}".encode()).digest()[:8], "big")
        self._heap: list[tuple[int, tuple[Any, ...]]] = []  # (-priority, sample)
        self.population = 0

    def priority(self, digest: str) -> int | None:
        try:
            return (int(digest[:16], 16) ^ self._key) & _MASK
        except ValueError:
            return None

    def offer(self, digest: str) -> int | None:
        """The priority if a record with this hash enters the sample, else None (counted either way)."""
        self.population += 1
        if self.size <= 0:
            return None
        priority = self.priority(digest)
        if priority is None:
            return None
        if len(self._heap) < self.size or -self._heap[0][0] > priority:
            return priority
        return None

    def add(self, priority: int, sample: tuple[Any, ...]) -> None:
        item = (-priority, sample)
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, item)
        elif -self._heap[0][0] > priority:
            heapq.heapreplace(self._heap, item)

    def merge(self, other: Sampler) -> None:
        self.population += other.population
        for negative, sample in other._heap:
            self.add(-negative, sample)

    def items(self) -> list[tuple[Any, ...]]:
        """The sample, by priority (a reproducible order)."""
        return [sample for _, sample in sorted(self._heap, key=lambda item: -item[0])]

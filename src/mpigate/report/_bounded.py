"""Counters and samples whose memory has a fixed bound, whatever the number of records."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["OTHERS", "KeyedSamples", "LimitedCounter"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

OTHERS = "(others)"


class LimitedCounter(Generic[K]):
    """Exact counts for the first ``limit`` distinct keys; later new keys are counted together
    under ``overflow_key`` (and ``overflowed`` says how many records went there). Keys in real
    audit logs (users, rules, teams) stay far below the limit; the limit is what keeps a log full
    of random names from exhausting memory."""

    __slots__ = ("counts", "limit", "overflow_key", "overflowed")

    def __init__(self, limit: int, overflow_key: K) -> None:
        self.counts: dict[K, int] = {}
        self.limit = limit
        self.overflow_key = overflow_key
        self.overflowed = 0

    def add(self, key: K, amount: int = 1) -> None:
        counts = self.counts
        if key in counts:
            counts[key] += amount
        elif len(counts) < self.limit:
            counts[key] = amount
        else:
            self.overflowed += amount
            counts[self.overflow_key] = counts.get(self.overflow_key, 0) + amount

    def merge(self, other: LimitedCounter[K]) -> None:
        """Add another counter's counts (its overflow bucket counts as overflow here too)."""
        for key, count in other.counts.items():
            if key == other.overflow_key:
                self.overflowed += count
                self.counts[self.overflow_key] = self.counts.get(self.overflow_key, 0) + count
            else:
                self.add(key, count)

    def items(self) -> Iterator[tuple[K, int]]:
        return iter(self.counts.items())

    def __len__(self) -> int:
        return len(self.counts)


class KeyedSamples(Generic[K, T]):
    """The most recent ``per_key`` samples of each of at most ``max_keys`` keys."""

    __slots__ = ("max_keys", "per_key", "samples")

    def __init__(self, per_key: int, max_keys: int = 1000) -> None:
        self.per_key = per_key
        self.max_keys = max_keys
        self.samples: dict[K, deque[T]] = {}

    def add(self, key: K, sample: T) -> None:
        bucket = self.samples.get(key)
        if bucket is None:
            if len(self.samples) >= self.max_keys:
                return
            bucket = self.samples[key] = deque(maxlen=self.per_key)
        bucket.append(sample)

    def merge(self, other: KeyedSamples[K, T], key: Callable[[T], Any]) -> None:
        """Keep, per key, the ``per_key`` latest samples of both (ordered by ``key``)."""
        for name, samples in other.samples.items():
            mine = self.samples.get(name)
            if mine is None:
                if len(self.samples) >= self.max_keys:
                    continue
                self.samples[name] = deque(samples, maxlen=self.per_key)
            else:
                self.samples[name] = deque(sorted([*mine, *samples], key=key), maxlen=self.per_key)

    def get(self, key: K) -> list[T]:
        bucket = self.samples.get(key)
        return list(bucket) if bucket is not None else []

"""The inventory of admitted images (PCI DSS 6.3.2): every image of every admitted request's
effective pods, as the validate record's ``demand.jobs[].images`` lists them, with its registry,
repository, tag and digest, the teams that ran it and how many requests named it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpigate.policy.images import ImageRefError, parse_image

__all__ = ["ImageInventory"]


class ImageInventory:
    """Images of admitted requests (bounded: at most ``max_keys`` distinct references)."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self.images: dict[str, list[Any]] = {}  # reference -> [requests, first, last, teams]
        self.without_images = 0  # admitted requests whose record lists no image (older webhooks)
        self.overflowed = 0

    def add(self, demand: Any, time: str, team: str) -> None:
        """The images of one admitted request's ``demand`` (None for a DELETE)."""
        jobs = demand.get("jobs") if type(demand) is dict else None
        if type(jobs) is not list:
            return
        seen: set[str] = set()
        listed = False
        for job in jobs:
            images = job.get("images") if type(job) is dict else None
            if type(images) is not list:
                continue
            listed = True
            for image in images:
                if type(image) is str and image:
                    seen.add(image)
        if not listed:
            self.without_images += 1
            return
        for image in seen:
            row = self.images.get(image)
            if row is None:
                if len(self.images) >= self.max_keys:
                    self.overflowed += 1
                    continue
                row = self.images[image] = [0, time, time, set()]
            row[0] += 1
            row[1] = min(row[1], time)
            row[2] = max(row[2], time)
            if len(row[3]) < 64:
                row[3].add(team)

    def merge(self, other: ImageInventory) -> None:
        self.without_images += other.without_images
        self.overflowed += other.overflowed
        for image, (count, first, last, teams) in other.images.items():
            row = self.images.get(image)
            if row is None:
                if len(self.images) >= self.max_keys:
                    self.overflowed += count
                    continue
                self.images[image] = [count, first, last, set(teams)]
                continue
            row[0] += count
            row[1] = min(row[1], first)
            row[2] = max(row[2], last)
            row[3] |= set(sorted(teams)[: max(0, 64 - len(row[3]))])

    def section(self) -> dict[str, Any]:
        rows = []
        for image, (count, first, last, teams) in sorted(self.images.items()):
            rows.append(
                {
                    "image": image,
                    **_parts(image),
                    "requests": count,
                    "teams": sorted(teams),
                    "firstSeen": first,
                    "lastSeen": last,
                }
            )
        return {
            "images": rows,
            "distinct": len(rows),
            "pinnedByDigest": sum(1 for r in rows if r["digest"]),
            "requestsWithoutImageList": self.without_images,
            "overflowed": self.overflowed,
        }


def _parts(image: str) -> Mapping[str, Any]:
    try:
        ref = parse_image(image)
    except ImageRefError:
        return {"registry": None, "repository": None, "tag": None, "digest": None, "parsed": False}
    return {
        "registry": ref.registry,
        "repository": ref.repository,
        "tag": ref.tag,
        "digest": ref.digest,
        "parsed": True,
    }

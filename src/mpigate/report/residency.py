"""Data residency: where pods ran (the controller's ``evidence`` records of kind ``placement``)
against where their team may run. Judged once all inputs are merged, so that the verdict does
not depend on the order of chains."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._bounded import KeyedSamples
from ._util import add_counts, at, text

__all__ = ["Residency"]

_PLACEMENT_KINDS = frozenset({"placement", "residency"})
#: A placement whose region nobody could tell (the controller found its node gone: docs/controller.md,
#: "Residency evidence"): unverified, never a violation.
UNKNOWN_REGION = "(unknown)"


def _explicit_verdict(region: str, details: Mapping[str, Any]) -> bool | None:
    """The controller's own judgement of a placement (``details.compliant``, else
    ``details.expectedRegions``): True when the pod is outside its allowed regions, False when
    inside, None when the record says nothing (or says that it does not know)."""
    compliant = details.get("compliant")
    if type(compliant) is bool:
        return not compliant
    if "compliant" in details:
        return None  # the controller's "unknown"
    expected = details.get("expectedRegions")
    if isinstance(expected, list) and expected:
        return region not in {text(r) for r in expected}
    return None


class Residency:
    """Placements per region and team, samples of them, and every region known per team."""

    def __init__(self, team_regions: Mapping[str, tuple[str, ...]], max_examples: int, max_keys: int) -> None:
        self.team_regions = team_regions
        # (region, team) -> [placements, judged by the controller, of those outside]
        self.placements: dict[tuple[str, str], list[int]] = {}
        self.placement_samples: KeyedSamples[tuple[str, str], tuple[Any, ...]] = KeyedSamples(
            max_examples, max_keys=max_keys
        )
        self.evidence_kinds: dict[str, int] = {}
        self.learned_regions: dict[str, set[str]] = {}  # team -> regions admission resolved to
        self.expected_regions: dict[str, set[str]] = {}  # team -> regions the controller expected

    @property
    def records(self) -> int:
        """Placement records in the period."""
        return sum(v[0] for v in self.placements.values())

    def learn(self, team: str, region: str) -> None:
        """A region an admitted job of ``team`` was resolved to."""
        regions = self.learned_regions.get(team)
        if regions is None:
            regions = self.learned_regions[team] = set()
        if region not in regions and len(regions) < 64:
            regions.add(region)

    def add(self, record: Mapping[str, Any], time: str, team: str, ref: tuple[str, int, str]) -> None:
        """One evidence record of the period (``ref``: its chain, seq and hash)."""
        evidence = record.get("evidence")
        if type(evidence) is not dict:
            return
        kind = evidence.get("kind")
        if type(kind) is not str:
            kind = text(kind)
        self.evidence_kinds[kind] = self.evidence_kinds.get(kind, 0) + 1
        if kind not in _PLACEMENT_KINDS:
            return
        region = evidence.get("region")
        if type(region) is not str or not region:
            region = text(region) or UNKNOWN_REGION
        details = evidence.get("details")
        verdict = None
        if type(details) is dict and details:
            verdict = _explicit_verdict(region, details)
            expected = details.get("expectedRegions")
            if type(expected) is list and expected:
                regions = self.expected_regions.setdefault(team, set())
                if len(regions) < 64:
                    regions.update(text(r) for r in expected)
        key = (region, team)
        counts = self.placements.get(key)
        if counts is None:
            counts = self.placements[key] = [0, 0, 0]
        counts[0] += 1
        if verdict is not None:
            counts[1] += 1
            if verdict:
                counts[2] += 1
        obj = record.get("object")
        if type(obj) is not dict:
            obj = {}
        # raw values: most placements are never shown, so text conversion waits for the section
        self.placement_samples.add(
            key,
            (
                time,
                team,
                obj.get("namespace"),
                obj.get("name"),
                evidence.get("pod"),
                evidence.get("node"),
                region,
                verdict,
                ref,
            ),
        )

    def merge(self, other: Residency) -> None:
        for key, counts in other.placements.items():
            placed = self.placements.setdefault(key, [0, 0, 0])
            for i in range(3):
                placed[i] += counts[i]
        self.placement_samples.merge(other.placement_samples, key=at(0))
        add_counts(self.evidence_kinds, other.evidence_kinds)
        for team, regions in other.learned_regions.items():
            self.learned_regions.setdefault(team, set()).update(regions)
        for team, regions in other.expected_regions.items():
            self.expected_regions.setdefault(team, set()).update(regions)

    def allowed_regions(self, team: str) -> frozenset[str] | None:
        """Where a team's pods may run: the config's regions for it, else the regions the
        controller's placement records expected, else every region its admitted jobs were resolved
        to; None when none is known."""
        configured = self.team_regions.get(team)
        if configured:
            return frozenset(configured)
        for known in (self.expected_regions.get(team), self.learned_regions.get(team)):
            if known:
                return frozenset(known)
        return None

    def counts(self) -> tuple[int, int, list[dict[str, Any]]]:
        """(outside, unverified, rows): placements the controller judged itself, plus the others
        judged against the team's allowed regions."""
        outside = unverified = 0
        rows: list[dict[str, Any]] = []
        for (region, team), (placed, judged, judged_outside) in sorted(self.placements.items()):
            allowed = self.allowed_regions(team)
            rest = placed - judged
            if allowed is None or region == UNKNOWN_REGION:
                unverified += rest
                out = judged_outside
            else:
                out = judged_outside + (rest if region not in allowed else 0)
            outside += out
            rows.append(
                {
                    "region": region,
                    "team": team,
                    "placements": placed,
                    "outside": out,
                    "allowedRegions": sorted(allowed or ()),
                }
            )
        return outside, unverified, rows

    def section(self, max_events: int) -> dict[str, Any]:
        """The report's ``residency`` section."""
        outside, unverified, rows = self.counts()
        by_region: dict[str, int] = {}
        for row in rows:
            by_region[row["region"]] = by_region.get(row["region"], 0) + row["placements"]
        examples = []
        for (region, team), samples in self.placement_samples.samples.items():
            allowed = self.allowed_regions(team)
            for sample in samples:
                verdict = sample[7]
                if verdict is True or (
                    verdict is None
                    and allowed is not None
                    and region not in allowed
                    and region != UNKNOWN_REGION
                ):
                    examples.append(sample)
        examples.sort(key=lambda e: e[0], reverse=True)
        return {
            "placements": sum(r["placements"] for r in rows),
            "outside": outside,
            "unverified": unverified,
            "byRegion": [{"region": r, "placements": c} for r, c in sorted(by_region.items())],
            "byRegionAndTeam": rows,
            "outsideExamples": [
                {
                    "time": e[0],
                    "team": e[1],
                    "namespace": text(e[2]) or None,
                    "name": text(e[3]) or None,
                    "pod": text(e[4]) or None,
                    "node": text(e[5]) or None,
                    "region": e[6],
                    "allowedRegions": sorted(self.allowed_regions(e[1]) or ()),
                    "record": f"{e[8][0]}:{e[8][1]}:{e[8][2]}",
                }
                for e in examples[:max_events]
            ],
            "evidenceKinds": dict(sorted(self.evidence_kinds.items())),
        }

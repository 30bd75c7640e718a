"""A layout detector's regions, made safe to use, and put in reading order.

A detector's output is untrusted (random weights, a checkpoint of unknown origin, a page
made to confuse it): boxes may lie outside the page, have no area, be NaN, or come by the
thousand. `cleaned` keeps finite boxes clamped to the page with at least `MIN_SIDE` pixels
a side, at most `max_regions` of them (best scores first), and drops a box that nearly
repeats a better one. `reading_order` sorts what is left the way a reader goes through a
page in columns: where the detector gives no order of its own (a plain RT-DETR), the page
is cut recursively (XY-cut): first into columns at vertical gaps that no box crosses, left
to right, else into bands at horizontal gaps, top to bottom; what cannot be cut is read
top to bottom, then left to right. A full-width title or figure thus divides a page into
bands, and each band's columns are read one after another.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIN_SIDE = 4.0  # pixels: a narrower region holds nothing a model could read
REPEAT_OVERLAP = 0.9  # a box overlapping a better one this much (IoU) repeats it
LABEL_CHARACTERS = 40


@dataclass(frozen=True)
class Region:
    """One region of a page: its detector label, score and box in pixels of the image
    the detector saw (x1 < x2, y1 < y2)."""

    label: str
    score: float
    x1: float
    y1: float
    x2: float
    y2: float

    @property
    def area(self) -> float:
        return (self.x2 - self.x1) * (self.y2 - self.y1)

    def overlap(self, other: Region) -> float:
        """Intersection over union with `other`."""
        width = min(self.x2, other.x2) - max(self.x1, other.x1)
        height = min(self.y2, other.y2) - max(self.y1, other.y1)
        if width <= 0 or height <= 0:
            return 0.0
        common = width * height
        return common / (self.area + other.area - common)


def clamped(region: Region, width: int, height: int) -> Region | None:
    """The region inside a page of `width` x `height` pixels; None where too little of it
    is (or its numbers are no numbers)."""
    values = (region.score, region.x1, region.y1, region.x2, region.y2)
    if not all(math.isfinite(v) for v in values):
        return None
    x1, x2 = sorted((region.x1, region.x2))
    y1, y2 = sorted((region.y1, region.y2))
    x1, x2 = max(0.0, x1), min(float(width), x2)
    y1, y2 = max(0.0, y1), min(float(height), y2)
    if x2 - x1 < MIN_SIDE or y2 - y1 < MIN_SIDE:
        return None
    label = region.label[:LABEL_CHARACTERS]
    return Region(label, region.score, x1, y1, x2, y2)


def cleaned(regions: Iterable[Region], width: int, height: int, max_regions: int) -> list[Region]:
    """The usable regions, in the order given: inside the page, best `max_regions`
    scores, no near repeats of a better one."""
    inside = [r for region in regions if (r := clamped(region, width, height)) is not None]
    best = sorted(range(len(inside)), key=lambda i: -inside[i].score)[:max_regions]
    kept: list[int] = []
    for index in best:
        if all(inside[index].overlap(inside[other]) < REPEAT_OVERLAP for other in kept):
            kept.append(index)
    return [inside[index] for index in sorted(kept)]


def reading_order(regions: Sequence[Region]) -> list[Region]:
    """The regions as a reader of a page in columns goes through them (XY-cut, columns
    before bands)."""
    if len(regions) <= 1:
        return list(regions)
    columns = _split(regions, vertical=True)
    if len(columns) > 1:
        return [r for column in columns for r in reading_order(column)]
    bands = _split(regions, vertical=False)
    if len(bands) > 1:
        return [r for band in bands for r in reading_order(band)]
    return sorted(regions, key=lambda r: (r.y1, r.x1))


def _split(regions: Sequence[Region], vertical: bool) -> list[list[Region]]:
    """The regions in groups separated by gaps no region crosses: columns (`vertical`
    gaps, left to right) or bands (top to bottom)."""

    def span(region: Region) -> tuple[float, float]:
        return (region.x1, region.x2) if vertical else (region.y1, region.y2)

    groups: list[list[Region]] = []
    reach = -math.inf
    for region in sorted(regions, key=span):
        start, end = span(region)
        if not groups or start >= reach:
            groups.append([])
        groups[-1].append(region)
        reach = max(reach, end)
    return groups

"""Sorting by size (transformation): sort bars of different heights ascending from left to right.

Problem: ``n`` bars of one palette colour and distinct heights, standing on a common baseline in random order.
Solution: the same bars sorted by height, shortest on the left; the video swaps neighbouring bars one at a time, as
bubble sort does.

Scorer (classical CV on the last frame): bars are the connected components of the configuration's colour at most
``_MAX_WIDTH`` bar widths wide (a wider blob, such as a canvas flooded with the colour, is no bar); their size is the
bounding-box height.

* ``sorted_ascending`` (hard): at least two bars, and their heights read left to right are strictly increasing.
* ``count_matches`` (soft, weight 1): as many bars as in the configuration.
* ``sizes_match`` (soft, weight 1): the fraction of the configuration's heights matched (within tolerance, one to one)
  by a measured bar height: the same multiset of sizes.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from app.cv import PALETTE, blobs, color_mask
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, to_array
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

_HEIGHT_STEP = 10  # distinct heights differ by at least this many pixels
_HEIGHT_TOLERANCE = 4  # a measured height matches an expected one within this many pixels
_MAX_WIDTH = 1.5  # bar widths: a blob wider than this is no bar (two merged bars are at least two bar widths)


def bubble_sort_swaps(heights: list[int]) -> list[int]:
    """The positions ``i`` of the neighbour swaps (i, i + 1) that bubble sort performs to sort ``heights`` ascending."""
    order, swaps = list(heights), []
    for end in range(len(order) - 1, 0, -1):
        for i in range(end):
            if order[i] > order[i + 1]:
                order[i], order[i + 1] = order[i + 1], order[i]
                swaps.append(i)
    return swaps


class SortingBySizeTask(VisualTask):
    name = "sorting_by_size"
    faculty = "transformation"
    min_image_size = 128

    def __init__(self, image_size: int = 128, min_bars: int = 4, max_bars: int = 6) -> None:
        super().__init__(image_size, min_bars=min_bars, max_bars=max_bars)
        self.min_bars, self.max_bars = min_bars, max_bars

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"min_bars": self.max_bars + 1, "max_bars": self.max_bars + 2}

    def _geometry(self, count: int) -> tuple[float, int, int]:
        """Slot width, bar width and the baseline row for ``count`` bars."""
        slot = (self.image_size - 8) / count
        return slot, max(4, int(slot * 0.6)), self.image_size - 8

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        count = rng.randint(self.min_bars, self.max_bars)
        tallest = self.image_size - 24
        heights = sorted(rng.sample(range(14, tallest + 1, _HEIGHT_STEP), count))
        while heights == sorted(heights):  # the problem must not be solved already
            rng.shuffle(heights)
        return {"heights": heights, "color": rng.choice(sorted(PALETTE))}

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"sorted_heights": sorted(config["heights"]), "swaps": bubble_sort_swaps(config["heights"])}

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            f"Sort the {config['color']} bars by height, shortest on the left and tallest on the right, by swapping "
            "neighbouring bars."
        )

    def _draw(self, config: dict[str, Any], heights: list[int], count: int | None = None) -> np.ndarray:
        """Bars of ``heights`` in the slots of a ``count``-bar layout (the configuration's count by default)."""
        image, draw = canvas(self.image_size)
        slot, width, base = self._geometry(count or len(config["heights"]))
        for i, height in enumerate(heights):
            left = int(round(4 + i * slot + (slot - width) / 2))
            draw.rectangle((left, base - height + 1, left + width - 1, base), fill=PALETTE[config["color"]])
        return to_array(image)

    def render(self, config, solution):
        order, frames, pass_ends = list(config["heights"]), [self._draw(config, config["heights"])], []
        previous = None
        for i in solution["swaps"]:
            if previous is not None and i <= previous:  # a new bubble-sort pass starts
                pass_ends.append(len(frames) - 1)
            order[i], order[i + 1] = order[i + 1], order[i]
            frames.append(self._draw(config, order))
            previous = i
        return np.stack(frames), pass_ends

    def perturbations(self, config, solution):
        ordered = list(solution["sorted_heights"])
        unsorted = list(ordered)
        last = solution["swaps"][-1]  # undo bubble sort's last swap
        unsorted[last], unsorted[last + 1] = unsorted[last + 1], unsorted[last]
        return {
            "unsorted": self._draw(config, unsorted),
            "missing_item": self._draw(config, ordered[:-1], count=len(ordered)),
        }

    def measure(self, image: np.ndarray, config: dict[str, Any]) -> list[int]:
        """Bar heights (bounding-box heights) of the configuration's colour, left to right."""
        _, width, _ = self._geometry(len(config["heights"]))
        found = blobs(color_mask(image, config["color"]), min_area=max(12, width * 6))
        bars = [b for b in found if b.bbox[2] <= _MAX_WIDTH * width]
        return [b.bbox[3] for b in sorted(bars, key=lambda b: b.centroid[0])]

    def score(self, frames, config) -> ScoreResult:
        measured = self.measure(as_frames(frames)[-1], config)
        expected = sorted(config["heights"])
        ascending = all(b > a for a, b in zip(measured, measured[1:], strict=False)) and len(measured) > 1
        remaining, matched = list(measured), 0
        for height in expected:
            best = min(remaining, key=lambda m: abs(m - height), default=None)
            if best is not None and abs(best - height) <= _HEIGHT_TOLERANCE:
                remaining.remove(best)
                matched += 1
        return combine(
            [
                Check("sorted_ascending", float(ascending), hard=True, detail=f"heights left to right {measured}"),
                Check(
                    "count_matches",
                    float(len(measured) == len(expected)),
                    detail=f"{len(measured)} bars, {len(expected)} expected",
                ),
                Check(
                    "sizes_match", matched / len(expected), detail=f"{matched}/{len(expected)} heights match {expected}"
                ),
            ]
        )

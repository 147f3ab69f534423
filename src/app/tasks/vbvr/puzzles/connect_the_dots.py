"""Connect the dots (spatial): join dark dots with straight line segments in order of size, smallest to largest.

Problem: ``n`` dark dots of strictly increasing radius (the order; no numbers are drawn). Solution: line segments of a
palette colour from each dot to the next larger one; the video adds one segment per frame. Dots are placed so that no
dot lies near a segment between two others, which keeps every segment unambiguous.

Scorer (classical CV on the last frame): line pixels are the configuration's line colour (HSV mask, dilated by one pixel
to absorb anti-aliasing and compression); each segment is sampled at points outside the dots at its ends.

* ``all_pairs_connected`` (hard): every consecutive pair (i, i + 1) has at least 80% of its sample points on line
  pixels.
* ``segments_covered`` (soft, weight 2): the mean fraction of covered sample points over the consecutive pairs.
* ``no_extra_segments`` (soft, weight 1): no non-consecutive pair of dots is joined by a line (sample points away from
  the expected segments); each extra segment costs half of the value.
* ``dots_unchanged`` (soft, weight 1): ``n`` dark dots are still visible.
* ``line_colour_on_segments`` (hard): the line colour off the expected segments (farther than ``_BAND`` pixels from
  them) covers at most the expected lines' own area: a canvas flooded with the line colour joins every pair of dots
  but draws no lines.
"""

from __future__ import annotations

import math
import random
from typing import Any

import cv2
import numpy as np
from PIL import ImageDraw

from app.cv import PALETTE, WALL, blobs, color_mask
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, to_array
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

_LINE_WIDTH = 3
_CLEARANCE = 6  # minimum gap between a dot's rim and the segments (i, i+1), (i, i+2) between two other dots
_COVERED = 0.8  # fraction of a segment's sample points on line pixels for the pair to count as connected
_BAND = 4  # pixels around an expected segment that count as on it: half the line width, blur and a wobble


def point_segment_distance(p, a, b) -> float:
    (px, py), (ax, ay), (bx, by) = p, a, b
    dx, dy = bx - ax, by - ay
    t = max(0.0, min(1.0, ((px - ax) * dx + (py - ay) * dy) / max(dx * dx + dy * dy, 1e-9)))
    return math.hypot(px - ax - t * dx, py - ay - t * dy)


def segment_samples(a, b, skip_a: float, skip_b: float, spacing: float = 2.0) -> list[tuple[float, float]]:
    """Points every ``spacing`` pixels along a-b, leaving out ``skip_a`` / ``skip_b`` pixels at the ends (the dots)."""
    length = math.dist(a, b)
    count = max(int((length - skip_a - skip_b) / spacing), 0)
    return [
        (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t)
        for t in ((skip_a + (length - skip_a - skip_b) * (k + 0.5) / count) / length for k in range(count))
    ]


class ConnectTheDotsTask(VisualTask):
    name = "connect_the_dots"
    faculty = "spatial"
    min_image_size = 128

    def __init__(self, image_size: int = 128, min_dots: int = 4, max_dots: int = 6) -> None:
        super().__init__(image_size, min_dots=min_dots, max_dots=max_dots)
        self.min_dots, self.max_dots = min_dots, max_dots

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"min_dots": self.max_dots + 1, "max_dots": self.max_dots + 2}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        count = rng.randint(self.min_dots, self.max_dots)
        radii = [3 + i for i in range(count)]
        points = None
        for _ in range(100):
            points = self._place(rng, radii)
            if points is not None:
                break
        else:
            raise ValueError(f"{self.name}: cannot place {count} dots apart on a {self.image_size} px image")
        return {"dots": [list(p) for p in points], "radii": radii, "line_color": rng.choice(sorted(PALETTE))}

    def _place(self, rng: random.Random, radii: list[int]) -> list[tuple[int, int]] | None:
        """Dots placed one at a time, spread out, none within the clearance of a segment (i, i+1) or (i, i+2) between
        two other dots (the solution's segments and the likeliest wrong ones); None when the placement gets stuck."""
        points: list[tuple[int, int]] = []
        for k, radius in enumerate(radii):
            for _ in range(200):
                p = (rng.randint(12, self.image_size - 12), rng.randint(12, self.image_size - 12))
                candidate = points + [p]
                segments = [(i, j) for i in range(k + 1) for j in (i + 1, i + 2) if j <= k]
                if all(math.dist(p, q) >= radius + radii[i] + 16 for i, q in enumerate(points)) and all(
                    point_segment_distance(candidate[m], candidate[i], candidate[j]) >= _CLEARANCE + radii[m]
                    for i, j in segments
                    for m in range(k + 1)
                    if m not in (i, j)
                ):
                    points.append(p)
                    break
            else:
                return None
        return points

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"segments": [[i, i + 1] for i in range(len(config["dots"]) - 1)]}

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            f"Connect the dots with {config['line_color']} straight lines in order of size: from the smallest dot to "
            "the next larger one, and so on up to the largest."
        )

    def _draw(self, config: dict[str, Any], segments: list[list[int]]) -> np.ndarray:
        image, draw = canvas(self.image_size)
        dots = [tuple(p) for p in config["dots"]]
        for i, j in segments:
            draw.line([dots[i], dots[j]], fill=PALETTE[config["line_color"]], width=_LINE_WIDTH)
        self._draw_dots(draw, dots, config["radii"])
        return to_array(image)

    @staticmethod
    def _draw_dots(draw: ImageDraw.ImageDraw, dots, radii) -> None:
        for (x, y), r in zip(dots, radii, strict=True):
            draw.ellipse((x - r, y - r, x + r, y + r), fill=WALL)

    def render(self, config, solution):
        segments = solution["segments"]
        frames = [self._draw(config, segments[:k]) for k in range(len(segments) + 1)]
        return np.stack(frames), list(range(1, len(frames) - 1))

    def perturbations(self, config, solution):
        segments = solution["segments"]
        order = list(range(len(config["dots"])))
        order[1], order[2] = order[2], order[1]  # visit the second- and third-smallest dots the wrong way round
        return {
            "missing_segment": self._draw(config, segments[:-1]),
            "wrong_order": self._draw(config, [[a, b] for a, b in zip(order, order[1:], strict=False)]),
        }

    def _coverage(
        self, line: np.ndarray, config: dict[str, Any], i: int, j: int, away_from: list | None = None
    ) -> float | None:
        """Fraction of the sample points of segment i-j on line pixels (optionally only points farther than the
        clearance from the segments in ``away_from``); None when there are too few points to tell."""
        dots, radii = config["dots"], config["radii"]
        points = segment_samples(dots[i], dots[j], radii[i] + 2, radii[j] + 2)
        if away_from:
            points = [p for p in points if all(point_segment_distance(p, a, b) > _CLEARANCE for a, b in away_from)]
        if len(points) < 3:
            return None
        size = line.shape[0]
        hits = sum(bool(line[min(int(round(y)), size - 1), min(int(round(x)), size - 1)]) for x, y in points)
        return hits / len(points)

    @staticmethod
    def _stray(colour: np.ndarray, config: dict[str, Any]) -> tuple[int, int]:
        """Pixels of the line colour farther than ``_BAND`` from every expected segment, and how many are allowed:
        the expected lines' own area (their length times the line width)."""
        dots = [tuple(int(v) for v in p) for p in config["dots"]]
        band = np.zeros(colour.shape, dtype=np.uint8)
        for a, b in zip(dots, dots[1:], strict=False):
            cv2.line(band, a, b, 1, thickness=2 * _BAND + 1)
        allowed = sum(math.dist(a, b) for a, b in zip(dots, dots[1:], strict=False)) * _LINE_WIDTH
        return int(np.count_nonzero(colour & (band == 0))), int(allowed)

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        colour = color_mask(last, config["line_color"])
        stray, allowed = self._stray(colour, config)
        line = cv2.dilate(colour.astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
        n, dots = len(config["dots"]), config["dots"]
        covered = [self._coverage(line, config, i, i + 1) or 0.0 for i in range(n - 1)]
        connected = sum(c >= _COVERED for c in covered)
        expected = [(dots[i], dots[i + 1]) for i in range(n - 1)]
        extra = []
        for i in range(n):
            for j in range(i + 2, n):
                value = self._coverage(line, config, i, j, away_from=expected)
                if value is not None and value >= _COVERED:
                    extra.append((i, j))
        brightness = cv2.cvtColor(np.ascontiguousarray(last), cv2.COLOR_RGB2HSV)[..., 2]
        dark = blobs(brightness <= 100, min_area=8)  # by value only: noise makes dark pixels' saturation meaningless
        return combine(
            [
                Check(
                    "all_pairs_connected",
                    float(connected == n - 1),
                    hard=True,
                    detail=f"{connected}/{n - 1} consecutive pairs connected",
                ),
                Check(
                    "segments_covered",
                    sum(covered) / max(n - 1, 1),
                    weight=2.0,
                    detail=f"coverage {[round(c, 2) for c in covered]}",
                ),
                Check(
                    "no_extra_segments",
                    1.0 - 0.5 * len(extra),
                    detail=f"extra segments between dots {extra}" if extra else "",
                ),
                Check("dots_unchanged", float(len(dark) == n), detail=f"{len(dark)} dots, {n} expected"),
                Check(
                    "line_colour_on_segments",
                    float(stray <= allowed),
                    hard=True,
                    detail=f"{stray} px of the line colour off the segments, at most {allowed}",
                ),
            ]
        )

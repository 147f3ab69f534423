"""Shape matching (perception): copy the target shape, in the target's colour, into the empty slot.

Problem: a target shape (circle, square or triangle) of a palette colour at the top, and an empty slot (a dark outlined
box) at the bottom. Solution: the same shape, in the same colour and size, drawn inside the slot.

Scorer (classical CV on the last frame): the slot's content is the largest coloured (saturated) blob inside the slot
box.

* ``slot_shape_matches`` (hard): the blob's shape (fill ratio of its bounding box) is the target's shape, and the slot's
  paint stays clear of the box's outline: at most a quarter of the 2-pixel rim inside its left, right and bottom sides
  is coloured (a drawn shape keeps ``_SLOT_PAD`` pixels away from it; a flood or a checkerboard filling the box to its
  outline is no shape in it).
* ``slot_hue_matches`` (hard): at least half of the slot's coloured pixels have the target's palette hue.
* ``size_matches`` (soft, weight 2): blob area / target area within 1 +- 0.25 (falls off to 0 at +- 0.75).
* ``target_unchanged`` (soft, weight 1): the target is still at the top, same colour and shape.
"""

from __future__ import annotations

import math
import random
from typing import Any

import cv2
import numpy as np

from app.cv import PALETTE, WALL, blobs, color_mask, palette_hue, saturated_mask
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, draw_shape, to_array
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

SHAPES = ("circle", "square", "triangle")
_SLOT_PAD = 6  # pixels between the shape and the slot's outline


def nearest_hue(color: str) -> str:
    """The palette colour whose hue is closest to ``color``'s (magenta for purple): the hardest wrong colour."""
    hue = palette_hue(color)
    return min(
        (c for c in sorted(PALETTE) if c != color),
        key=lambda c: min(abs(palette_hue(c) - hue), 180 - abs(palette_hue(c) - hue)),
    )


def shape_area(shape: str, radius: float) -> float:
    """Nominal pixel area of a shape drawn by :func:`app.tasks.vbvr.draw.draw_shape`."""
    side = 2 * radius + 1
    return {"circle": math.pi * (radius + 0.5) ** 2, "square": side * side, "triangle": side * side / 2}[shape]


class ShapeMatchingTask(VisualTask):
    name = "shape_matching"
    faculty = "perception"
    min_image_size = 80

    def __init__(self, image_size: int = 128, min_radius: int = 12, max_radius: int = 16) -> None:
        super().__init__(image_size, min_radius=min_radius, max_radius=max_radius)
        self.min_radius, self.max_radius = min_radius, max_radius

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"min_radius": self.max_radius + 1, "max_radius": self.max_radius + 4}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        radius = rng.randint(self.min_radius, self.max_radius)
        half = radius + _SLOT_PAD
        size = self.image_size
        return {
            "shape": rng.choice(SHAPES),
            "color": rng.choice(sorted(PALETTE)),
            "radius": radius,
            "target": [rng.randint(radius + 4, size - radius - 4), round(size * 0.25)],
            "slot": [rng.randint(half + 3, size - half - 3), round(size * 0.72)],
        }

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        return {
            "shape": config["shape"],
            "color": config["color"],
            "center": list(config["slot"]),
            "radius": config["radius"],
        }

    def prompt(self, config: dict[str, Any]) -> str:
        return "Draw a copy of the shape at the top, with the same shape, colour and size, inside the empty box."

    def _slot_box(self, config: dict[str, Any]) -> tuple[int, int, int, int]:
        (x, y), half = config["slot"], config["radius"] + _SLOT_PAD
        return (x - half, y - half, x + half, y + half)

    def _draw(
        self, config: dict[str, Any], shape: str | None, color: str | None = None, radius: float | None = None
    ) -> np.ndarray:
        image, draw = canvas(self.image_size)
        draw_shape(draw, config["shape"], tuple(config["target"]), config["radius"], config["color"])
        draw.rectangle(self._slot_box(config), outline=WALL, width=2)
        if shape is not None:
            draw_shape(draw, shape, tuple(config["slot"]), radius or config["radius"], color or config["color"])
        return to_array(image)

    def render(self, config, solution):
        frames = [self._draw(config, None)]
        frames += [self._draw(config, solution["shape"], solution["color"], solution["radius"] * f) for f in (0.5, 1.0)]
        return np.stack(frames), []

    def perturbations(self, config, solution):
        other_shape = SHAPES[(SHAPES.index(solution["shape"]) + 1) % len(SHAPES)]
        return {
            "wrong_shape": self._draw(config, other_shape),
            "wrong_hue": self._draw(config, solution["shape"], nearest_hue(solution["color"])),
            "empty_slot": self._draw(config, None),
        }

    def _region_blob(
        self, image: np.ndarray, saturated: np.ndarray, region: np.ndarray, color: str, min_area: int
    ) -> tuple[Any, float]:
        """The largest coloured blob in ``region`` (``saturated`` masked to it and opened with a 3x3 kernel, which
        strips the one-pixel JPEG fringes that would spoil the shape's fill ratio) and the fraction of its region's
        coloured pixels of ``color``."""
        coloured = saturated & region
        opened = cv2.morphologyEx(coloured.astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8)) > 0
        found = blobs(opened, min_area=min_area)
        hue = np.count_nonzero(color_mask(image, color) & region) / max(np.count_nonzero(coloured), 1)
        return (found[0] if found else None), hue

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        radius, size, shape, color = config["radius"], self.image_size, config["shape"], config["color"]
        min_area = max(12, radius * radius // 4)
        x0, y0, x1, y1 = self._slot_box(config)
        top_left, bottom_right = (max(0, x0 + 3), max(0, y0 + 3)), (x1 - 2, y1 - 2)  # the interior, outline excluded
        inside = np.zeros((size, size), dtype=bool)
        inside[top_left[1] : bottom_right[1], top_left[0] : bottom_right[0]] = True
        top = np.zeros_like(inside)
        top[: size // 2] = True
        saturated = saturated_mask(last)
        target, target_hue = self._region_blob(last, saturated, top, color, min_area)
        target_ok = (
            target is not None
            and target.shape == shape
            and target_hue >= 0.5
            and math.dist(target.centroid, config["target"]) <= radius / 2
        )
        reference = target.area if target_ok else shape_area(shape, radius)
        blob, hue = self._region_blob(last, saturated, inside, color, min_area)
        ratio = blob.area / reference if blob else 0.0
        rim = inside.copy()  # its left, right and bottom edges: a large target above can reach into the top one
        rim[: bottom_right[1] - 2, top_left[0] + 2 : bottom_right[0] - 2] = False
        clear = blob is not None and np.count_nonzero(saturated & rim) <= 0.25 * np.count_nonzero(rim)
        what = "nothing" if blob is None else blob.shape if clear else "paint up to the outline"
        return combine(
            [
                Check(
                    "slot_shape_matches",
                    float(clear and blob.shape == shape),
                    hard=True,
                    detail=f"{what}, expected {shape}",
                ),
                Check(
                    "slot_hue_matches",
                    float(blob is not None and hue >= 0.5),
                    hard=True,
                    detail=f"{hue:.0%} of the slot is {color}",
                ),
                Check(
                    "size_matches", 1.0 - (abs(ratio - 1.0) - 0.25) / 0.5, weight=2.0, detail=f"area ratio {ratio:.2f}"
                ),
                Check("target_unchanged", float(target_ok), detail="" if target_ok else "target missing or changed"),
            ]
        )

"""Rotation (spatial): draw an L-shaped polyomino rotated clockwise by 90, 180 or 270 degrees about the grid centre.

Problem: two ``grid`` x ``grid`` panels; the left one holds an L-tromino-or-larger polyomino (arms of unequal length,
so no rotation or reflection maps it onto itself) in a palette colour, the right one is empty. Solution: the right
panel holds the same cells rotated clockwise by ``angle`` about the grid centre (cell ``(r, c)`` goes to
``(c, grid - 1 - r)`` per quarter turn). Scorer (a cell is occupied when a palette colour fills most of its centre):
the IoU of the right panel's occupied cells with the rotated set is at least ``threshold`` (hard) and as a fraction
(soft, weight 2), the occupied cells have the polyomino's colour (soft), the left panel is unchanged (soft).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from app.cv import PALETTE, WALL
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, to_array
from app.tasks.vbvr.puzzles._regions import box_label_counts, box_slices, dominant_from_counts
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

COLORS = ("red", "blue", "green", "purple", "orange")
GRID_LINE = (200, 200, 200)
Cells = set[tuple[int, int]]


def rotate(cells, grid: int, angle: int) -> Cells:
    """``cells`` rotated clockwise by ``angle`` (a multiple of 90) degrees about the centre of a ``grid`` x ``grid``.

    >>> sorted(rotate({(0, 0), (0, 1)}, 3, 90))
    [(0, 2), (1, 2)]
    """
    out = {tuple(c) for c in cells}
    for _ in range(angle // 90 % 4):
        out = {(c, grid - 1 - r) for r, c in out}
    return out


def mirror(cells, grid: int) -> Cells:
    """``cells`` flipped left-right about the grid's vertical centre line."""
    return {(r, grid - 1 - c) for r, c in cells}


def iou(a: Cells, b: Cells) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


class RotationTask(VisualTask):
    name = "rotation"
    faculty = "spatial"

    def __init__(self, image_size: int = 128, grid: int = 5, max_arm: int = 4, threshold: float = 0.85) -> None:
        super().__init__(image_size, grid=grid, max_arm=max_arm, threshold=threshold)
        self.grid, self.max_arm, self.threshold = grid, min(max_arm, grid), threshold

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"grid": self.grid + 2, "max_arm": self.max_arm + 2}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        long = rng.randint(3, self.max_arm)
        short = rng.randint(2, long - 1)
        arms = [long, short] if rng.random() < 0.5 else [short, long]
        cells = {(r, 0) for r in range(arms[0])} | {(arms[0] - 1, c) for c in range(arms[1])}
        cells = rotate(cells, self.grid, 90 * rng.randrange(4))
        if rng.random() < 0.5:
            cells = mirror(cells, self.grid)
        r0, c0 = min(r for r, _ in cells), min(c for _, c in cells)
        h, w = max(r for r, _ in cells) - r0 + 1, max(c for _, c in cells) - c0 + 1
        dr, dc = rng.randint(0, self.grid - h) - r0, rng.randint(0, self.grid - w) - c0
        cells = sorted([r + dr, c + dc] for r, c in cells)
        return {"grid": self.grid, "cells": cells, "angle": rng.choice((90, 180, 270)), "color": rng.choice(COLORS)}

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"cells": sorted(list(c) for c in rotate(config["cells"], config["grid"], config["angle"]))}

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            f"Draw the coloured shape of the left grid in the empty right grid, rotated {config['angle']} degrees "
            "clockwise about the centre of the grid. Keep its colour and leave the left grid unchanged."
        )

    def _panels(self, config) -> tuple[int, list[tuple[int, int]]]:
        """Cell size and the top-left corners of the source and target panels."""
        margin = max(4, self.image_size // 32)
        cell = (self.image_size - 3 * margin) // 2 // config["grid"]
        side = cell * config["grid"]
        gap = self.image_size - 2 * side
        y = (self.image_size - side) // 2
        return cell, [(gap // 3, y), (self.image_size - gap // 3 - side, y)]

    def _draw(self, config, target) -> np.ndarray:
        image, draw = canvas(self.image_size)
        cell, corners = self._panels(config)
        grid, fill = config["grid"], PALETTE[config["color"]]
        for (x0, y0), cells in zip(corners, ({tuple(c) for c in config["cells"]}, set(target)), strict=True):
            for r in range(grid):
                for c in range(grid):
                    x, y = x0 + c * cell, y0 + r * cell
                    draw.rectangle(
                        (x, y, x + cell, y + cell), fill=fill if (r, c) in cells else None, outline=GRID_LINE
                    )
            draw.rectangle((x0, y0, x0 + grid * cell, y0 + grid * cell), outline=WALL, width=2)
        return to_array(image)

    def render(self, config, solution):
        turns = config["angle"] // 90
        frames = [self._draw(config, set())]
        frames += [self._draw(config, rotate(config["cells"], config["grid"], 90 * k)) for k in range(1, turns + 1)]
        return np.stack(frames), list(range(1, len(frames)))

    def perturbations(self, config, solution):
        grid, angle = config["grid"], config["angle"]
        wrong_angle = 360 - angle if angle != 180 else 90  # the other way round (180 either way: a quarter turn)
        return {
            "wrong_angle": self._draw(config, rotate(config["cells"], grid, wrong_angle)),
            "mirrored": self._draw(config, mirror(rotate(config["cells"], grid, angle), grid)),
        }

    def _read(self, image: np.ndarray, config) -> list[dict[tuple[int, int], str]]:
        """Occupied cells (with their colour) of the source and the target panel."""
        cell, corners = self._panels(config)
        keys, boxes = [], []
        for panel, (x0, y0) in enumerate(corners):
            for r in range(config["grid"]):
                for c in range(config["grid"]):
                    x, y = x0 + c * cell, y0 + r * cell
                    keys.append((panel, (r, c)))
                    boxes.append(box_slices(image.shape, x, y, x + cell, y + cell))
        found: list[dict[tuple[int, int], str]] = [{}, {}]
        for (panel, key), (counts, area) in zip(keys, box_label_counts(image, boxes), strict=True):
            name, cover = dominant_from_counts(counts, area)
            if cover > 0.5:
                found[panel][key] = name
        return found

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        expected = rotate(config["cells"], config["grid"], config["angle"])
        source, target = self._read(last, config)
        overlap = iou(set(target), expected)
        colour = sum(v == config["color"] for v in target.values()) / len(target) if target else 0.0
        kept = iou({k for k, v in source.items() if v == config["color"]}, {tuple(c) for c in config["cells"]})
        return combine(
            [
                Check(
                    "rotated_cells_match",
                    float(overlap >= self.threshold),
                    hard=True,
                    detail=f"IoU {overlap:.2f} < {self.threshold}" if overlap < self.threshold else "",
                ),
                Check(
                    "rotated_cells_iou",
                    overlap,
                    weight=2.0,
                    detail=f"IoU {overlap:.2f} with the {config['angle']} degree rotation",
                ),
                Check("target_colour", colour, detail=f"{colour:.0%} of drawn cells are {config['color']}"),
                Check("source_unchanged", kept, detail=f"source IoU {kept:.2f}"),
            ]
        )

"""Symmetry completion (abstraction): complete the mirror image of a coloured grid pattern across a vertical axis.

Problem: a ``rows`` x ``2 * half`` board split by a dark vertical axis; the left half holds a pattern of coloured
cells, the right half is empty. Solution: the right half is the left half mirrored about the axis (column ``c`` goes
to ``2 * half - 1 - c``), colours kept. The sampler rejects patterns whose translated copy would nearly equal their
mirror image, so mirroring has to be done. Scorer (each cell read by the dominant palette colour of its centre): the
fraction of right-half cells, over those filled in the expected or the observed pattern, that hold the expected colour
(soft, weight 2) and is at least ``threshold`` (hard); the left half is unchanged (soft).
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

COLORS = ("red", "blue", "yellow", "green", "purple")
GRID_LINE = (200, 200, 200)
Cells = dict[tuple[int, int], str]


def mirror(cells: Cells, half: int) -> Cells:
    """The cells mirrored about the vertical axis between column ``half - 1`` and ``half``."""
    return {(r, 2 * half - 1 - c): color for (r, c), color in cells.items()}


def agreement(observed: Cells, expected: Cells) -> float:
    """Fraction of the cells filled in either pattern that hold the same colour in both (1 when both are empty)."""
    union = set(observed) | set(expected)
    return sum(observed.get(k) == expected.get(k) for k in union) / len(union) if union else 1.0


class SymmetryCompletionTask(VisualTask):
    name = "symmetry_completion"
    faculty = "abstraction"

    def __init__(
        self,
        image_size: int = 128,
        rows: int = 6,
        half: int = 4,
        colors: int = 2,
        density: float = 0.45,
        threshold: float = 0.8,
    ) -> None:
        super().__init__(image_size, rows=rows, half=half, colors=colors, density=density, threshold=threshold)
        self.rows, self.half, self.colors, self.density, self.threshold = rows, half, colors, density, threshold

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"rows": self.rows + 2, "half": self.half + 1, "colors": self.colors + 1}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        palette = rng.sample(COLORS, self.colors)
        while True:
            cells = {
                (r, c): rng.choice(palette)
                for r in range(self.rows)
                for c in range(self.half)
                if rng.random() < self.density
            }
            translated = {(r, c + self.half): color for (r, c), color in cells.items()}
            if (
                len(cells) >= 3
                and len(set(cells.values())) == self.colors
                and agreement(translated, mirror(cells, self.half)) <= 0.4
            ):
                break
        return {
            "rows": self.rows,
            "half": self.half,
            "left": [[r, c, color] for (r, c), color in sorted(cells.items())],
        }

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        right = mirror(self._left(config), config["half"])
        return {"right": [[r, c, color] for (r, c), color in sorted(right.items())]}

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            "Complete the picture so that it is mirror-symmetric about the dark vertical line: colour the cells of the "
            "right half as the mirror image of the left half, keeping each cell's colour."
        )

    @staticmethod
    def _left(config) -> Cells:
        return {(r, c): color for r, c, color in config["left"]}

    def _board(self, config) -> tuple[int, int, int]:
        """Cell size and the board's top-left corner."""
        cols, rows = 2 * config["half"], config["rows"]
        cell = int(self.image_size * 0.9 / max(cols, rows))
        return cell, (self.image_size - cols * cell) // 2, (self.image_size - rows * cell) // 2

    def _draw(self, config, cells: Cells) -> np.ndarray:
        image, draw = canvas(self.image_size)
        cell, x0, y0 = self._board(config)
        cols, rows = 2 * config["half"], config["rows"]
        for r in range(rows):
            for c in range(cols):
                x, y = x0 + c * cell, y0 + r * cell
                fill = PALETTE[cells[(r, c)]] if (r, c) in cells else None
                draw.rectangle((x, y, x + cell, y + cell), fill=fill, outline=GRID_LINE)
        axis = x0 + config["half"] * cell
        draw.line((axis, y0 - 2, axis, y0 + rows * cell + 2), fill=WALL, width=max(2, self.image_size // 64))
        return to_array(image)

    def render(self, config, solution):
        left = self._left(config)
        right = sorted(((r, c), color) for r, c, color in solution["right"])
        frames = [self._draw(config, left)]
        for row in range(config["rows"]):
            frames.append(self._draw(config, {**left, **{k: v for k, v in right if k[0] <= row}}))
        return np.stack(frames), [len(frames) - 1]

    def perturbations(self, config, solution):
        left, half = self._left(config), config["half"]
        right = mirror(left, half)
        keep = sorted(right)[: len(right) // 2]
        wrong = {
            "unmirrored_copy": self._draw(config, {**left, **{(r, c + half): v for (r, c), v in left.items()}}),
            "missing_cells": self._draw(config, {**left, **{k: right[k] for k in keep}}),
        }
        colors = sorted(set(left.values()))
        if len(colors) > 1:
            swap = dict(zip(colors, colors[1:] + colors[:1], strict=True))
            wrong["swapped_colours"] = self._draw(config, {**left, **{k: swap[v] for k, v in right.items()}})
        return wrong

    def _read(self, image: np.ndarray, config, columns: range) -> Cells:
        """Filled cells of ``columns``: those whose centre is more than half one palette colour (``read_cell``)."""
        cell, x0, y0 = self._board(config)
        keys, boxes = [], []
        for r in range(config["rows"]):
            for c in columns:
                x, y = x0 + c * cell, y0 + r * cell
                keys.append((r, c))
                boxes.append(box_slices(image.shape, x, y, x + cell, y + cell))
        found = {}
        for key, (counts, area) in zip(keys, box_label_counts(image, boxes), strict=True):
            name, cover = dominant_from_counts(counts, area)
            if cover > 0.5:
                found[key] = name
        return found

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        half = config["half"]
        left = self._left(config)
        cells = self._read(last, config, range(2 * half))
        right = {k: v for k, v in cells.items() if k[1] >= half}
        match = agreement(right, mirror(left, half))
        kept = agreement({k: v for k, v in cells.items() if k[1] < half}, left)
        return combine(
            [
                Check("right_mirrors_left", match, weight=2.0, detail=f"{match:.0%} of filled right-half cells match"),
                Check(
                    "mirror_above_threshold",
                    float(match >= self.threshold),
                    hard=True,
                    detail=f"{match:.0%} < {self.threshold:.0%}" if match < self.threshold else "",
                ),
                Check("left_unchanged", kept, detail=f"{kept:.0%} of left-half cells as given"),
            ]
        )

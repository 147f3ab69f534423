"""Object counting (perception): add red circles until they match the number of blue squares.

Problem: ``k`` blue squares on the top row of a grid. Solution: ``k`` red circles on the bottom row. Scorer: the number
of red objects equals the number of blue squares and each fits in one grid cell (hard: red paint spread over the canvas,
as a flood or a checkerboard, is no object), the red objects are circles (soft), the blue squares are where they were
(soft).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from app.cv import blobs, color_mask
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, cell_center, draw_shape, to_array
from app.tasks.vbvr.scoring import Check, ScoreResult, combine


class CountingTask(VisualTask):
    name = "object_counting"
    faculty = "perception"

    def __init__(self, image_size: int = 128, min_count: int = 1, max_count: int = 5, columns: int = 6) -> None:
        super().__init__(image_size, min_count=min_count, max_count=max_count, columns=columns)
        self.min_count, self.max_count, self.columns = min_count, max_count, columns

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"min_count": self.max_count + 1, "max_count": self.columns, "columns": self.columns}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        count = rng.randint(self.min_count, self.max_count)
        return {"squares": sorted(rng.sample(range(self.columns), count)), "columns": self.columns}

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"circles": list(range(len(config["squares"])))}

    def prompt(self, config: dict[str, Any]) -> str:
        return "Draw red circles on the bottom row, as many as there are blue squares on the top row."

    def _draw(self, config, circles: list[int], circle_color: str = "red", circle_shape: str = "circle") -> np.ndarray:
        image, draw = canvas(self.image_size)
        radius = self.image_size / self.columns / 3
        for col in config["squares"]:
            draw_shape(draw, "square", cell_center(0, col, self.columns, self.image_size), radius, "blue")
        for col in circles:
            draw_shape(
                draw,
                circle_shape,
                cell_center(self.columns - 1, col, self.columns, self.image_size),
                radius,
                circle_color,
            )
        return to_array(image)

    def render(self, config, solution):
        circles = solution["circles"]
        frames = [self._draw(config, circles[:n]) for n in range(len(circles) + 1)]
        return np.stack(frames), [len(frames) - 1]

    def perturbations(self, config, solution):
        circles = solution["circles"]
        extra = [c for c in range(self.columns) if c not in circles][:1]
        return {
            "wrong_count": self._draw(config, circles + extra if extra else circles[:-1]),
            "wrong_hue": self._draw(config, circles, circle_color="orange"),
            "wrong_shape": self._draw(config, circles, circle_shape="triangle"),
        }

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        min_area = max(6, int((self.image_size / self.columns / 3) ** 2))
        red = blobs(color_mask(last, "red"), min_area=min_area)
        blue = blobs(color_mask(last, "blue"), min_area=min_area)
        expected = len(config["squares"])
        step = self.image_size / self.columns
        oversized = sum(max(b.bbox[2], b.bbox[3]) > step for b in red)
        circles = sum(1 for b in red if b.shape == "circle" and max(b.bbox[2], b.bbox[3]) <= step)
        blue_cols = sorted(int(b.centroid[0] // step) for b in blue if b.centroid[1] < step)
        return combine(
            [
                Check(
                    "red_count_matches",
                    float(len(red) == expected and not oversized),
                    hard=True,
                    detail=f"{len(red)} red, {expected} expected"
                    + (f", {oversized} larger than a cell" if oversized else ""),
                ),
                Check("red_are_circles", circles / max(len(red), 1), detail=f"{circles}/{len(red)} circles"),
                Check("blue_unchanged", float(blue_cols == config["squares"]), detail=f"blue at {blue_cols}"),
            ]
        )

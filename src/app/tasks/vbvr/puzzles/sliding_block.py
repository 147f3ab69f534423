"""Sliding block (planning): slide one coloured block in a given direction until it stops.

Problem: an ``n x n`` grid with dark wall cells, a dark-outlined target square and a few coloured blocks. The prompt
names one block and a direction; the block slides cell by cell until the next cell is a wall, another block or the
grid edge, or until it reaches the target square (where it stops). The frames show the slide, one cell per frame.
Scorer: exactly one blob of the moved block's colour (hard, ``exactly_one_moved_block``), its centroid in the expected
cell (hard, ``moved_block_at_expected_cell``), the other blocks in their cells (soft, ``other_blocks_unmoved``: the
fraction in place).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from app.cv import PALETTE, WALL, blobs, color_mask
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, to_array
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

COLORS = ("red", "yellow", "green", "cyan", "blue", "magenta")  # >= 25 hue units apart
DIRECTIONS = {"right": (0, 1), "down": (1, 0), "left": (0, -1), "up": (-1, 0)}


def slide(config: dict[str, Any], mover: int | None = None, direction: str | None = None) -> list[list[int]]:
    """The cells the block visits (start included) sliding in ``direction`` until it is stopped or on the target."""
    mover = config["mover"] if mover is None else mover
    dr, dc = DIRECTIONS[direction or config["direction"]]
    n, walls, target = config["size"], {tuple(w) for w in config["walls"]}, tuple(config["target"])
    others = {tuple(b["cell"]) for i, b in enumerate(config["blocks"]) if i != mover}
    cells = [tuple(config["blocks"][mover]["cell"])]
    while cells[-1] != target or len(cells) == 1:
        r, c = cells[-1][0] + dr, cells[-1][1] + dc
        if not (0 <= r < n and 0 <= c < n) or (r, c) in walls or (r, c) in others:
            break
        cells.append((r, c))
    return [list(c) for c in cells]


class SlidingBlockTask(VisualTask):
    name = "sliding_block"
    faculty = "planning"
    min_image_size = 80

    def __init__(self, image_size: int = 128, size: int = 6, blocks: int = 3, walls: int = 4) -> None:
        super().__init__(image_size, size=size, blocks=blocks, walls=walls)
        self.size, self.blocks, self.walls = size, blocks, walls

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"size": self.size + 3, "blocks": min(len(COLORS), self.blocks + 2), "walls": self.walls + 4}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        n = self.size
        for _ in range(10_000):  # rejection sampling: the block moves at least two cells
            cells = rng.sample([(r, c) for r in range(n) for c in range(n)], self.walls + self.blocks + 1)
            colors = rng.sample(COLORS, self.blocks)
            config = {
                "size": n,
                "walls": [list(c) for c in sorted(cells[: self.walls])],
                "blocks": [{"color": k, "cell": list(c)} for k, c in zip(colors, cells[self.walls : -1], strict=True)],
                "target": list(cells[-1]),
                "mover": 0,
                "direction": rng.choice(sorted(DIRECTIONS)),
            }
            path = slide(config)
            if len(path) < 3:
                continue
            if rng.random() < 0.5 and len(path) > 3:  # put the target on the way: the block stops on it
                config["target"] = path[rng.randrange(2, len(path) - 1)]
            return config
        raise ValueError(f"no {n}x{n} layout where the block slides two cells")

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        path = slide(config)
        return {"path": path, "final": path[-1], "distance": len(path) - 1}

    def prompt(self, config: dict[str, Any]) -> str:
        color = config["blocks"][config["mover"]]["color"]
        return (
            f"Slide the {color} block {config['direction']} until it hits a wall, another block or the edge, or "
            "until it reaches the outlined target square; leave every other block where it is."
        )

    def _draw(self, config, cells: list[list[int]]) -> np.ndarray:
        """The board with block ``i`` at ``cells[i]`` (a cell may be ``None``: block absent; extras are drawn in the
        mover's colour)."""
        n, size = config["size"], self.image_size
        bounds = [round(i * size / n) for i in range(n + 1)]
        image, draw = canvas(size)

        def box(r, c, inset):
            return (bounds[c] + inset, bounds[r] + inset, bounds[c + 1] - 1 - inset, bounds[r + 1] - 1 - inset)

        for r in range(n):
            for c in range(n):
                draw.rectangle(box(r, c, 0), outline=(205, 205, 205))
        for r, c in config["walls"]:
            draw.rectangle(box(r, c, 0), fill=WALL)
        draw.rectangle(box(*config["target"], 1), outline=WALL, width=2)
        inset = max(3, round(0.2 * size / n))
        colors = [b["color"] for b in config["blocks"]]
        colors += [colors[config["mover"]]] * (len(cells) - len(colors))
        for color, cell in zip(colors, cells, strict=True):
            if cell is not None:
                draw.rectangle(box(*cell, inset), fill=PALETTE[color])
        return to_array(image)

    def _cells(self, config, mover_cell) -> list[list[int] | None]:
        return [mover_cell if i == config["mover"] else b["cell"] for i, b in enumerate(config["blocks"])]

    def render(self, config, solution):
        frames = [self._draw(config, self._cells(config, cell)) for cell in solution["path"]]
        return np.stack(frames), [1, len(frames) - 1]

    def perturbations(self, config, solution):
        path, start = solution["path"], solution["path"][0]
        back = slide(
            config, direction={"right": "left", "left": "right", "up": "down", "down": "up"}[config["direction"]]
        )
        return {
            "wrong_position": self._draw(config, self._cells(config, path[-2])),
            "extra_block": self._draw(config, self._cells(config, path[-1]) + [start]),
            "wrong_direction": self._draw(config, self._cells(config, back[-1])),
        }

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        step = last.shape[0] / config["size"]
        expected = tuple(slide(config)[-1])
        found: dict[int, list[tuple[int, int]]] = {}
        for i, block in enumerate(config["blocks"]):
            parts = blobs(color_mask(last, block["color"]), min_area=max(6, int((0.3 * step) ** 2)))
            found[i] = [(int(b.centroid[1] // step), int(b.centroid[0] // step)) for b in parts]
        mover = found[config["mover"]]
        others = [i for i in found if i != config["mover"]]
        unmoved = sum(found[i] == [tuple(config["blocks"][i]["cell"])] for i in others)
        return combine(
            [
                Check(
                    "exactly_one_moved_block",
                    float(len(mover) == 1),
                    hard=True,
                    detail=f"{len(mover)} blocks of the moved colour",
                ),
                Check(
                    "moved_block_at_expected_cell",
                    float(expected in mover),
                    hard=True,
                    detail=f"found at {mover}, expected {expected}",
                ),
                Check(
                    "other_blocks_unmoved", unmoved / max(len(others), 1), detail=f"{unmoved}/{len(others)} in place"
                ),
            ]
        )

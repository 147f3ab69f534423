"""Gravity drop (physics): coloured balls fall straight down until they rest on the floor, a filled cell or a ball.

Problem: an ``n x n`` grid with dark filled cells (stacks on the floor and floating ledges) and balls of distinct
colours in the top two rows (two balls may share a column). Solution: every ball at its resting cell; the frames
animate the fall one row per frame (all balls at once). Scorer: exactly one blob per ball colour (hard, count:
``one_blob_per_ball``), every ball in its start column (hard, ``balls_stay_in_column``), every ball supported by the
floor, a filled cell or another ball (hard, ``balls_supported``), each ball at its expected resting cell (soft, one
``<colour>_ball_at_rest`` check per ball).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from app.cv import WALL, blobs, color_mask
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, cell_center, draw_shape, to_array
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

COLORS = ("red", "yellow", "green", "cyan", "blue", "magenta")  # >= 25 hue units apart


def drop(config: dict[str, Any], balls: list[dict[str, Any]] | None = None) -> list[list[int]]:
    """Resting cells of ``balls`` (default: the config's): the lowest ball of a column falls first."""
    balls = config["balls"] if balls is None else balls
    n, occupied = config["size"], {tuple(c) for c in config["filled"]}
    rest: list[list[int]] = [[0, 0]] * len(balls)
    for i in sorted(range(len(balls)), key=lambda i: -balls[i]["cell"][0]):
        r, c = balls[i]["cell"]
        while r + 1 < n and (r + 1, c) not in occupied:
            r += 1
        occupied.add((r, c))
        rest[i] = [r, c]
    return rest


class GravityDropTask(VisualTask):
    name = "gravity_drop"
    faculty = "physics"

    def __init__(self, image_size: int = 128, size: int = 6, balls: int = 3, ledges: int = 2) -> None:
        super().__init__(image_size, size=size, balls=balls, ledges=ledges)
        self.size, self.balls, self.ledges = size, balls, ledges

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"size": self.size + 3, "balls": min(len(COLORS), self.balls + 2), "ledges": self.ledges + 2}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        n = self.size
        filled = {(r, c) for c in range(n) for r in range(n - rng.randint(0, n - 4), n)}  # floor stacks, rows >= 3
        filled |= {(rng.randint(3, n - 2), rng.randrange(n)) for _ in range(self.ledges)}  # floating ledges
        slots = [(r, c) for c in range(n) for r in (0, 1)]
        cells = sorted(rng.sample(slots, self.balls), key=lambda rc: (rc[1], rc[0]))
        balls = [{"color": k, "cell": list(c)} for k, c in zip(rng.sample(COLORS, self.balls), cells, strict=True)]
        return {"size": n, "filled": [list(c) for c in sorted(filled)], "balls": balls}

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        rest = drop(config)
        return {"rest": rest, "falls": [r[0] - b["cell"][0] for r, b in zip(rest, config["balls"], strict=True)]}

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            "The coloured balls fall straight down under gravity. Show where each ball comes to rest: on the floor, "
            "on a dark filled cell or on another ball."
        )

    def _draw(self, config, cells: list[list[int]]) -> np.ndarray:
        n, size = config["size"], self.image_size
        bounds = [round(i * size / n) for i in range(n + 1)]
        image, draw = canvas(size)
        for r in range(n):
            for c in range(n):
                draw.rectangle((bounds[c], bounds[r], bounds[c + 1] - 1, bounds[r + 1] - 1), outline=(205, 205, 205))
        for r, c in config["filled"]:
            draw.rectangle((bounds[c], bounds[r], bounds[c + 1] - 1, bounds[r + 1] - 1), fill=WALL)
        for (r, c), color in zip(cells, [b["color"] for b in config["balls"]], strict=True):
            draw_shape(draw, "circle", cell_center(r, c, n, size), 0.38 * size / n, color)
        return to_array(image)

    def render(self, config, solution):
        starts = [b["cell"] for b in config["balls"]]
        frames = [
            self._draw(config, [[min(s[0] + t, e[0]), s[1]] for s, e in zip(starts, solution["rest"], strict=True)])
            for t in range(max(solution["falls"]) + 1)
        ]
        return np.stack(frames), [1, len(frames) - 1]

    def perturbations(self, config, solution):
        rest, falls, n = solution["rest"], solution["falls"], config["size"]
        i = max(range(len(falls)), key=lambda k: (falls[k], -k))  # the ball with the longest fall
        floating = [list(c) for c in rest]
        floating[i] = [config["balls"][i]["cell"][0] + falls[i] // 2, rest[i][1]]  # stuck mid-air
        taken = {tuple(b["cell"]) for b in config["balls"]}
        r, c = config["balls"][i]["cell"]
        col = next(c + d for d in (1, -1, 2, -2, 3, -3) if 0 <= c + d < n and (r, c + d) not in taken)
        moved = [dict(b, cell=[r, col]) if k == i else b for k, b in enumerate(config["balls"])]
        return {
            "ball_floating": self._draw(config, floating),
            "wrong_column": self._draw(config, drop(config, moved)),
            "not_fallen": self._draw(config, [b["cell"] for b in config["balls"]]),
        }

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        n = config["size"]
        step = last.shape[0] / n
        expected = drop(config)
        found: list[list[tuple[int, int]]] = []
        for ball in config["balls"]:
            parts = blobs(color_mask(last, ball["color"]), min_area=max(6, int((0.35 * step) ** 2)))
            found.append([(int(b.centroid[1] // step), int(b.centroid[0] // step)) for b in parts])
        counts = [len(f) for f in found]
        seen = [f[0] for f in found if len(f) == 1]
        support = {tuple(c) for c in config["filled"]} | set(seen)
        in_column = sum(len(f) == 1 and f[0][1] == b["cell"][1] for f, b in zip(found, config["balls"], strict=True))
        floating = [(r, c) for r, c in seen if r + 1 < n and (r + 1, c) not in support]
        checks = [
            Check("one_blob_per_ball", float(all(k == 1 for k in counts)), hard=True, detail=f"blob counts {counts}"),
            Check(
                "balls_stay_in_column",
                float(in_column == len(found)),
                hard=True,
                detail=f"{in_column}/{len(found)} balls in their start column",
            ),
            Check("balls_supported", float(not floating), hard=True, detail=f"floating balls at {floating}"),
        ]
        for ball, f, e in zip(config["balls"], found, expected, strict=True):
            checks.append(
                Check(f"{ball['color']}_ball_at_rest", float(f == [tuple(e)]), detail=f"at {f}, expected {tuple(e)}")
            )
        return combine(checks)

"""Colour mixing (transformation): paint the empty target circle with the mix of the two source colours.

Problem: two filled source circles of paint colours (red, blue, yellow; green in the out-of-domain split) and an empty
outlined target circle, on cells of a ``grid`` x ``grid`` board. Solution: the target filled with the mixed colour
(red + blue = purple, red + yellow = orange, blue + yellow = green, blue + green = cyan), each a palette colour.
Scorer: the dominant palette colour of the target's centre is the mixed colour (hard; nearest palette hue, so violet
or magenta where purple was required fails, VBVR-Pro's example), the mixed colour stays in the target (hard: outside
the target circle, widened by a fifth of its radius for the outline, at most one target's area of it; a canvas
flooded or checkered with the mixed colour is no fill of the target), the mixed colour covers the target (soft), the
source circles keep their colours (soft).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from app.cv import PALETTE, WALL
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, cell_center, to_array
from app.tasks.vbvr.puzzles._regions import disk_window, dominant_color, palette_labels
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

MIXES = {
    ("blue", "red"): "purple",
    ("red", "yellow"): "orange",
    ("blue", "yellow"): "green",
}
EXTENDED_MIXES = {**MIXES, ("blue", "green"): "cyan"}
# The wrong-but-close colour of each mix: its palette neighbour in hue (violet for purple, as in VBVR-Pro).
NEIGHBOUR = {"purple": "violet", "orange": "yellow", "green": "cyan", "cyan": "blue"}


def mix(a: str, b: str) -> str:
    """The palette colour of mixing paints ``a`` and ``b``.

    >>> mix("red", "blue")
    'purple'
    """
    return EXTENDED_MIXES[tuple(sorted((a, b)))]


class ColorMixingTask(VisualTask):
    name = "color_mixing"
    faculty = "transformation"

    def __init__(self, image_size: int = 128, grid: int = 3, extended_mixes: bool = False) -> None:
        super().__init__(image_size, grid=grid, extended_mixes=extended_mixes)
        self.grid, self.extended_mixes = grid, extended_mixes

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"grid": self.grid + 1, "extended_mixes": True}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        pair = list(rng.choice(sorted(EXTENDED_MIXES if self.extended_mixes else MIXES)))
        rng.shuffle(pair)
        cells = rng.sample([(r, c) for r in range(self.grid) for c in range(self.grid)], 3)
        sources = [{"color": color, "cell": list(cell)} for color, cell in zip(pair, cells[:2], strict=True)]
        return {"grid": self.grid, "sources": sources, "target": list(cells[2])}

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"color": mix(*(s["color"] for s in config["sources"]))}

    def prompt(self, config: dict[str, Any]) -> str:
        a, b = (s["color"] for s in config["sources"])
        return (
            f"Mix the {a} paint and the {b} paint like real paints, and fill the empty outlined circle with the "
            "mixed colour. Leave the two paint circles unchanged."
        )

    def _geometry(self, config, cell) -> tuple[tuple[float, float], float]:
        return cell_center(cell[0], cell[1], config["grid"], self.image_size), self.image_size / config["grid"] * 0.34

    def _draw(self, config, fill: str | None, fill_fraction: float = 1.0) -> np.ndarray:
        image, draw = canvas(self.image_size)
        for source in config["sources"]:
            (x, y), r = self._geometry(config, source["cell"])
            draw.ellipse((x - r, y - r, x + r, y + r), fill=PALETTE[source["color"]])
        (x, y), r = self._geometry(config, config["target"])
        if fill is not None:
            f = r * fill_fraction
            draw.ellipse((x - f, y - f, x + f, y + f), fill=PALETTE[fill])
        draw.ellipse((x - r, y - r, x + r, y + r), outline=WALL, width=max(2, self.image_size // 64))
        return to_array(image)

    def render(self, config, solution):
        frames = [
            self._draw(config, None),
            self._draw(config, solution["color"], 0.5),
            self._draw(config, solution["color"]),
        ]
        return np.stack(frames), [len(frames) - 1]

    def perturbations(self, config, solution):
        return {
            "wrong_hue_neighbour": self._draw(config, NEIGHBOUR[solution["color"]]),
            "target_empty": self._draw(config, None),
            "unmixed_source_colour": self._draw(config, config["sources"][0]["color"]),
        }

    def _stray_paint(self, image: np.ndarray, config, colour: str) -> tuple[int, int]:
        """Pixels of ``colour`` (nearest palette hue) outside the target circle widened by a fifth of its radius (its
        outline and a sloppy edge), and how many are allowed: the target's own area. Counted on every other row and
        column (times 4): an area estimate, at a quarter of the cost."""
        (cx, cy), radius = self._geometry(config, config["target"])
        painted = palette_labels(image[::2, ::2]) == list(PALETTE).index(colour)
        ys, xs = np.arange(0, image.shape[0], 2)[:, None], np.arange(0, image.shape[1], 2)[None, :]
        outside = (xs + 0.5 - cx) ** 2 + (ys + 0.5 - cy) ** 2 > (1.2 * radius) ** 2
        return 4 * int(np.count_nonzero(painted & outside)), int(np.pi * radius**2)

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        a, b = (s["color"] for s in config["sources"])
        expected = mix(a, b)

        def region(cell):  # labels of the disk's pixels only (the disk's window of the image, not all of it)
            center, radius = self._geometry(config, cell)
            rows, columns, mask = disk_window(last.shape, center, radius * 0.6)
            if mask.size == 0:  # the disk lies outside the image
                return np.full(mask.shape, -1), mask
            return palette_labels(last[rows, columns]), mask

        labels, target = region(config["target"])
        found, cover = dominant_color(last, target, labels)
        stray, allowed = self._stray_paint(last, config, expected)
        expected_cover = float(np.mean(labels[target] == list(PALETTE).index(expected)))
        kept = []
        for source in config["sources"]:
            labels, mask = region(source["cell"])
            name, share = dominant_color(last, mask, labels)
            kept.append(name == source["color"] and share > 0.5)
        return combine(
            [
                Check(
                    "mixed_colour",
                    float(found == expected and cover >= 0.3),
                    hard=True,
                    detail=f"target is {found or 'empty'} ({cover:.0%}), expected {expected} = {a} + {b}",
                ),
                Check(
                    "mixed_colour_stays_in_target",
                    float(stray <= allowed),
                    hard=True,
                    detail=f"{stray} px of {expected} outside the target, at most {allowed}",
                ),
                Check("target_filled", min(1.0, expected_cover / 0.9), detail=f"{expected_cover:.0%} {expected}"),
                Check("sources_unchanged", sum(kept) / len(kept), detail=f"{sum(kept)}/{len(kept)} sources kept"),
            ]
        )

"""Pattern continuation (abstraction): fill the empty cells at the end of a periodic sequence of coloured shapes.

Problem: a ``rows`` x ``columns`` board read row by row; the first cells hold a sequence that repeats a period of
``P`` distinct (shape, colour) items (ABAB..., ABCABC...; ABCD... out of domain), the last ``blanks`` cells are empty
with a dark outline. Solution: each empty cell ``i`` holds item ``i mod P``. Scorer (a cell's colour is the dominant
palette colour of its pixels; its shape the template best fitting its largest foreground blob, none when no template
fits it, as for a checkerboard): the fraction of filled cells with both the expected colour and shape (hard, multiplies
the score), the fractions with the expected colour and with the expected shape (soft, naming which attribute failed),
the given cells unchanged (soft), nothing drawn on the canvas around the board (hard: at most a tenth of a band a
quarter cell wide around it palette coloured; a canvas flooded or filled with a colour is no answer).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from app.cv import PALETTE, WALL
from app.tasks.vbvr.core import VisualTask, as_frames
from app.tasks.vbvr.draw import canvas, draw_shape, to_array
from app.tasks.vbvr.puzzles._regions import box_label_counts, box_slices, palette_labels, shape_in_box
from app.tasks.vbvr.scoring import Check, ScoreResult, combine

COLORS = ("red", "yellow", "green", "blue", "purple")
SHAPES = ("circle", "square", "triangle")
NEIGHBOUR = {"red": "orange", "yellow": "orange", "green": "cyan", "blue": "violet", "purple": "magenta"}
GRID_LINE = (200, 200, 200)
_NAMES = tuple(PALETTE)
_MAX_OUTSIDE = 0.1  # palette-coloured share of the band around the board that still counts as untouched


def _outside_cover(image: np.ndarray, x0: int, y0: int, x1: int, y1: int, width: int) -> float:
    """Palette-coloured fraction of a band ``width`` pixels wide around the board ``(x0, y0)-(x1, y1)``, two pixels
    clear of its outline (the canvas there is empty in every drawing of the task)."""
    height, full = image.shape[0], image.shape[1]
    top, bottom = slice(max(y0 - 2 - width, 0), max(y0 - 2, 0)), slice(min(y1 + 3, height), min(y1 + 3 + width, height))
    left, right = slice(max(x0 - 2 - width, 0), max(x0 - 2, 0)), slice(min(x1 + 3, full), min(x1 + 3 + width, full))
    rows = slice(top.start, bottom.stop)
    strips = [image[top, :], image[bottom, :], image[rows, left], image[rows, right]]
    strips = [np.ascontiguousarray(s) for s in strips if s.size]
    coloured = sum(int(np.count_nonzero(palette_labels(s) >= 0)) for s in strips)
    return coloured / max(sum(s.shape[0] * s.shape[1] for s in strips), 1)


class PatternContinuationTask(VisualTask):
    name = "pattern_continuation"
    faculty = "abstraction"

    def __init__(
        self,
        image_size: int = 128,
        rows: int = 3,
        columns: int = 4,
        periods: tuple[int, ...] = (2, 3),
        min_blanks: int = 2,
        max_blanks: int = 4,
    ) -> None:
        periods = tuple(periods)
        super().__init__(
            image_size, rows=rows, columns=columns, periods=periods, min_blanks=min_blanks, max_blanks=max_blanks
        )
        self.rows, self.columns, self.periods = rows, columns, periods
        self.min_blanks, self.max_blanks = min_blanks, max_blanks

    def out_of_domain_params(self) -> dict[str, Any]:
        return {"columns": self.columns + 1, "periods": (max(self.periods) + 1,), "min_blanks": 3, "max_blanks": 5}

    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        period = rng.choice(self.periods)
        items = rng.sample([(s, c) for s in SHAPES for c in COLORS], period)
        length = self.rows * self.columns
        blanks = rng.randint(self.min_blanks, min(self.max_blanks, length - 2 * period))
        return {"rows": self.rows, "columns": self.columns, "items": [list(i) for i in items], "given": length - blanks}

    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        period = len(config["items"])
        length = config["rows"] * config["columns"]
        return {"fill": [config["items"][i % period] for i in range(config["given"], length)]}

    def prompt(self, config: dict[str, Any]) -> str:
        return (
            "The coloured shapes, read row by row from left to right, follow a repeating pattern. Fill every empty "
            "outlined cell at the end with the shape and colour that continue the pattern."
        )

    def _cell(self, config, index: int) -> tuple[int, int, int]:
        cell = int(self.image_size * 0.9 / max(config["rows"], config["columns"]))
        x0, y0 = (self.image_size - config["columns"] * cell) // 2, (self.image_size - config["rows"] * cell) // 2
        return x0 + (index % config["columns"]) * cell, y0 + (index // config["columns"]) * cell, cell

    def _draw(self, config, fill: list) -> np.ndarray:
        image, draw = canvas(self.image_size)
        sequence = [config["items"][i % len(config["items"])] for i in range(config["given"])] + list(fill)
        for index in range(config["rows"] * config["columns"]):
            x, y, cell = self._cell(config, index)
            blank = index >= config["given"]
            draw.rectangle((x, y, x + cell, y + cell), outline=WALL if blank else GRID_LINE, width=2 if blank else 1)
            if index < len(sequence):
                shape, color = sequence[index]
                draw_shape(draw, shape, (x + cell / 2, y + cell / 2), cell * 0.34, color)
        return to_array(image)

    def render(self, config, solution):
        frames = [self._draw(config, solution["fill"][:n]) for n in range(len(solution["fill"]) + 1)]
        return np.stack(frames), list(range(1, len(frames)))

    def perturbations(self, config, solution):
        period = len(config["items"])
        shifted = [
            config["items"][(i + 1) % period] for i in range(config["given"], config["rows"] * config["columns"])
        ]
        return {
            "wrong_next_item": self._draw(config, shifted),
            "wrong_hue": self._draw(config, [[shape, NEIGHBOUR[color]] for shape, color in solution["fill"]]),
        }

    def _read(self, image: np.ndarray, config) -> tuple[list[tuple[str | None, str | None]], float]:
        """(colour, shape) of the object in every cell, (None, None) for an empty cell; and the palette-coloured
        fraction of a band a quarter cell wide around the board."""
        length = config["rows"] * config["columns"]
        cells = [self._cell(config, index) for index in range(length)]
        boxes = [box_slices(image.shape, x, y, x + cell, y + cell, inset=0.12) for x, y, cell in cells]
        read = []
        for (_, _, cell), (rows, columns), (found, _) in zip(cells, boxes, box_label_counts(image, boxes), strict=True):
            if found.sum() < 0.12 * cell * cell:
                read.append((None, None))
            else:
                read.append((_NAMES[int(found.argmax())], shape_in_box(image, rows, columns)))
        x0, y0, cell = cells[0]
        x1, y1 = x0 + config["columns"] * cell, y0 + config["rows"] * cell
        return read, _outside_cover(image, x0, y0, x1, y1, width=max(2, cell // 4))

    def score(self, frames, config) -> ScoreResult:
        last = as_frames(frames)[-1]
        items, length = config["items"], config["rows"] * config["columns"]
        read, outside = self._read(last, config)
        expected = [tuple(items[i % len(items)])[::-1] for i in range(length)]  # (colour, shape)
        blanks = range(config["given"], length)
        both = sum(read[i] == expected[i] for i in blanks) / len(blanks)
        colour = sum(read[i][0] == expected[i][0] for i in blanks) / len(blanks)
        shape = sum(read[i][1] == expected[i][1] for i in blanks) / len(blanks)
        given = sum(read[i] == expected[i] for i in range(config["given"])) / config["given"]
        seen = ", ".join(f"{c or 'empty'} {s or ''}".strip() for c, s in (read[i] for i in blanks))
        want = ", ".join(f"{expected[i][0]} {expected[i][1]}" for i in blanks)
        return combine(
            [
                Check("next_items_match_rule", both, hard=True, detail=f"found [{seen}], expected [{want}]"),
                Check("next_items_colour", colour, detail=f"{colour:.0%} of filled cells have the expected colour"),
                Check("next_items_shape", shape, detail=f"{shape:.0%} of filled cells have the expected shape"),
                Check("given_items_unchanged", given, detail=f"{given:.0%} of given cells as shown"),
                Check(
                    "nothing_drawn_outside_board",
                    float(outside <= _MAX_OUTSIDE),
                    hard=True,
                    detail=f"{outside:.0%} of the band around the board is coloured",
                ),
            ]
        )

"""Task-specific tests of object_counting: the scorer counts red circles of a cell's size, not red paint."""

import numpy as np
import pytest

from app.cv import PALETTE
from app.tasks.vbvr import get_task
from app.tasks.vbvr.puzzles._regions import foreground

ONE_SQUARE = {"squares": [2], "columns": 6}


def failed_names(result):
    return {c.name for c in result.checks if not c.passed}


def test_the_solution_scores_one_and_a_missing_circle_fails_the_count():
    task = get_task("object_counting")
    assert task.score(task._draw(ONE_SQUARE, [0]), ONE_SQUARE).score == 1.0
    assert "red_count_matches" in failed_names(task.score(task._draw(ONE_SQUARE, []), ONE_SQUARE))


@pytest.mark.parametrize("cell", [None, 8, 16])
def test_red_paint_over_the_canvas_is_not_one_red_circle(cell):
    task = get_task("object_counting")
    problem = task._draw(ONE_SQUARE, [])
    if cell is None:  # the background flooded red, the blue square kept
        paint = ~foreground(problem)
    else:  # a red checkerboard over the problem: its squares touch at their corners, one 8-connected blob
        ys, xs = np.mgrid[0:128, 0:128] // cell
        paint = (ys + xs) % 2 == 0
    image = np.where(paint[..., None], np.array(PALETTE["red"], dtype=np.uint8), problem)
    result = task.score(image, ONE_SQUARE)
    assert result.score == 0.0 and "red_count_matches" in failed_names(result)

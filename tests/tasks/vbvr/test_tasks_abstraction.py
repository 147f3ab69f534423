"""Task-specific tests of colour mixing, symmetry completion, pattern continuation and rotation: the solvers on
hand-made configurations, and the scorers on hand-drawn right and wrong answers (docs/algorithms.md#papers's
violet-for-purple)."""

import itertools

import numpy as np
import pytest

from app.cv import PALETTE
from app.tasks.vbvr import get_task
from app.tasks.vbvr.puzzles._regions import classify_shape, dominant_color, foreground
from app.tasks.vbvr.puzzles.color_mixing import mix
from app.tasks.vbvr.puzzles.rotation import mirror as flip
from app.tasks.vbvr.puzzles.rotation import rotate
from app.tasks.vbvr.puzzles.symmetry_completion import agreement, mirror

MIXING = {"grid": 3, "sources": [{"color": "red", "cell": [0, 0]}, {"color": "blue", "cell": [2, 2]}], "target": [1, 1]}


def failed_names(result):
    return {f.split(":")[0] for f in result.failed}


def flooded(image, color):
    """``image`` with its background (everything but its objects and outlines) painted ``color``."""
    return np.where(foreground(image)[..., None], image, np.array(PALETTE[color], dtype=np.uint8))


# --- colour mixing ---------------------------------------------------------------------------------------------------


def test_mixing_rule_is_symmetric_and_lands_on_palette_colours():
    assert mix("red", "blue") == mix("blue", "red") == "purple"
    assert mix("yellow", "red") == "orange" and mix("blue", "yellow") == "green" and mix("green", "blue") == "cyan"


def test_mixing_solver_and_its_rendering():
    task = get_task("color_mixing")
    solution = task.solve(MIXING)
    assert solution == {"color": "purple"}
    frames, _ = task.render(MIXING, solution)
    assert task.score(frames, MIXING).score == 1.0


def test_violet_for_purple_scores_at_most_0_4_and_names_the_mixing_check():
    task = get_task("color_mixing")
    result = task.score(task._draw(MIXING, "violet"), MIXING)
    assert result.score <= 0.4
    assert "mixed_colour" in failed_names(result)
    assert any("violet" in f and "expected purple" in f for f in result.failed), result.failed


@pytest.mark.parametrize("wrong", ["magenta", "blue", "red", None])
def test_other_wrong_targets_fail_the_mixing_check(wrong):
    task = get_task("color_mixing")
    result = task.score(task._draw(MIXING, wrong), MIXING)
    assert result.score == 0.0 and "mixed_colour" in failed_names(result)


def test_a_painted_over_source_costs_only_the_soft_check():
    task = get_task("color_mixing")
    image = task._draw(MIXING, "purple")
    (x, y), r = task._geometry(MIXING, MIXING["sources"][0]["cell"])
    image[int(y - r) : int(y + r) + 1, int(x - r) : int(x + r) + 1] = (235, 235, 235)
    result = task.score(image, MIXING)
    assert 0.5 < result.score < 1.0 and failed_names(result) == {"sources_unchanged"}


@pytest.mark.parametrize("fill", [None, "purple"])
def test_the_mixed_colour_flooding_the_canvas_fails_the_hard_check(fill):
    task = get_task("color_mixing")
    result = task.score(flooded(task._draw(MIXING, fill), "purple"), MIXING)  # the sources and outline kept
    assert result.score == 0.0 and "mixed_colour_stays_in_target" in failed_names(result)
    purple = np.full_like(task._draw(MIXING, None), PALETTE["purple"])
    assert task.score(purple, MIXING).score == 0.0


def test_a_little_of_the_mixed_colour_beside_the_target_is_tolerated():
    task = get_task("color_mixing")
    image = task._draw(MIXING, "purple")
    image[2:12, 100:110] = PALETTE["purple"]  # a 10 x 10 smudge in an empty cell: far less than the target's area
    assert task.score(image, MIXING).score == 1.0


# --- symmetry completion ---------------------------------------------------------------------------------------------

SYMMETRY = {"rows": 3, "half": 3, "left": [[0, 0, "red"], [1, 1, "blue"], [1, 2, "red"], [2, 0, "blue"]]}


def test_symmetry_solver_mirrors_about_the_axis():
    task = get_task("symmetry_completion")
    assert task.solve(SYMMETRY) == {"right": [[0, 5, "red"], [1, 3, "red"], [1, 4, "blue"], [2, 5, "blue"]]}
    frames, _ = task.render(SYMMETRY, task.solve(SYMMETRY))
    assert task.score(frames, SYMMETRY).score == 1.0


def test_symmetry_translated_copy_fails_the_threshold():
    task = get_task("symmetry_completion")
    left = {(r, c): v for r, c, v in SYMMETRY["left"]}
    result = task.score(task._draw(SYMMETRY, {**left, **{(r, c + 3): v for (r, c), v in left.items()}}), SYMMETRY)
    assert result.score == 0.0 and "mirror_above_threshold" in failed_names(result)


def test_symmetry_agreement_counts_union_of_filled_cells():
    expected = mirror({(0, 0): "red", (1, 1): "blue"}, 2)
    assert expected == {(0, 3): "red", (1, 2): "blue"}
    assert agreement({(0, 3): "red"}, expected) == 0.5
    assert agreement({(0, 3): "red", (1, 2): "blue", (0, 2): "red"}, expected) == pytest.approx(2 / 3)
    assert agreement({}, {}) == 1.0


def test_symmetry_sampler_rejects_patterns_a_translation_would_solve():
    task = get_task("symmetry_completion")
    for seed in range(20):
        config = task.generate(seed).config
        left = {(r, c): v for r, c, v in config["left"]}
        assert (
            agreement({(r, c + config["half"]): v for (r, c), v in left.items()}, mirror(left, config["half"])) <= 0.4
        )


# --- pattern continuation --------------------------------------------------------------------------------------------

PATTERN = {"rows": 3, "columns": 4, "items": [["circle", "red"], ["square", "blue"], ["triangle", "red"]], "given": 9}


def test_pattern_solver_continues_the_period():
    task = get_task("pattern_continuation")
    assert task.solve(PATTERN) == {"fill": [["circle", "red"], ["square", "blue"], ["triangle", "red"]]}
    frames, _ = task.render(PATTERN, task.solve(PATTERN))
    assert task.score(frames, PATTERN).score == 1.0


def test_pattern_wrong_shape_names_the_shape_check():
    task = get_task("pattern_continuation")
    fill = [["circle", "red"], ["square", "blue"], ["circle", "red"]]  # triangle expected in the last cell
    result = task.score(task._draw(PATTERN, fill), PATTERN)
    assert result.score < 0.7
    assert {"next_items_match_rule", "next_items_shape"} <= failed_names(result)
    assert "next_items_colour" not in failed_names(result)


@pytest.mark.parametrize("color", ["red", "blue"])
def test_pattern_canvas_flooded_or_checkered_with_a_colour_is_no_answer(color):
    task = get_task("pattern_continuation")
    blank = task._draw(PATTERN, [])
    ys, xs = np.mgrid[0:128, 0:128]
    checkerboard = np.where(((ys + xs) % 2 == 0)[..., None], np.array(PALETTE[color], np.uint8), blank)
    for image in (flooded(blank, color), np.full_like(blank, PALETTE[color]), checkerboard):
        result = task.score(image, PATTERN)
        assert result.score == 0.0 and "nothing_drawn_outside_board" in failed_names(result)
    inside = blank.copy()  # the checkerboard inside the empty cells only: a colour, but no shape
    for index in range(PATTERN["given"], 12):
        x, y, cell = task._cell(PATTERN, index)
        inside[y + 3 : y + cell - 2, x + 3 : x + cell - 2] = checkerboard[y + 3 : y + cell - 2, x + 3 : x + cell - 2]
    read, outside = task._read(inside, PATTERN)
    assert read[PATTERN["given"] :] == [(color, None)] * 3 and outside == 0.0


def test_pattern_missing_item_scores_lower():
    task = get_task("pattern_continuation")
    result = task.score(task._draw(PATTERN, [["circle", "red"], ["square", "blue"]]), PATTERN)
    assert result.score < 0.7 and "empty" in result.failed[0]


# --- rotation --------------------------------------------------------------------------------------------------------

L_SHAPE = {"grid": 5, "cells": [[0, 0], [1, 0], [2, 0], [2, 1]], "angle": 90, "color": "blue"}


def test_rotation_solver_turns_clockwise_about_the_grid_centre():
    task = get_task("rotation")
    assert task.solve(L_SHAPE) == {"cells": [[0, 2], [0, 3], [0, 4], [1, 2]]}
    assert rotate(L_SHAPE["cells"], 5, 360) == {tuple(c) for c in L_SHAPE["cells"]}
    assert rotate(rotate(L_SHAPE["cells"], 5, 90), 5, 270) == {tuple(c) for c in L_SHAPE["cells"]}
    frames, keys = task.render({**L_SHAPE, "angle": 270}, task.solve({**L_SHAPE, "angle": 270}))
    assert len(frames) == 4 and keys == [1, 2, 3]
    assert task.score(frames, {**L_SHAPE, "angle": 270}).score == 1.0


@pytest.mark.parametrize("angle", [90, 180, 270])
def test_rotation_by_another_angle_or_mirrored_fails_the_hard_check(angle):
    task = get_task("rotation")
    config = {**L_SHAPE, "angle": angle}
    for wrong in {90, 180, 270} - {angle}:
        result = task.score(task._draw(config, rotate(config["cells"], 5, wrong)), config)
        assert result.score == 0.0 and "rotated_cells_match" in failed_names(result)
    result = task.score(task._draw(config, flip(rotate(config["cells"], 5, angle), 5)), config)
    assert result.score == 0.0


def test_rotation_sampler_draws_chiral_shapes():
    task = get_task("rotation", grid=7, max_arm=6)
    for seed in range(20):
        cells = task.generate(seed).config["cells"]
        images = [
            frozenset(f(rotate(cells, 7, a), 7))
            for a, f in itertools.product((0, 90, 180, 270), (lambda s, g: s, flip))
        ]
        shapes = {frozenset((r - min(x for x, _ in s), c - min(y for _, y in s)) for r, c in s) for s in images}
        assert len(shapes) == 8, cells


# --- shared helpers --------------------------------------------------------------------------------------------------


def test_region_helpers_tell_neighbouring_hues_and_shapes_apart():
    from app.tasks.vbvr.draw import canvas, draw_shape, to_array

    for color in ("purple", "violet", "magenta"):
        image, draw = canvas(32)
        draw_shape(draw, "triangle", (16, 16), 10, color)
        array = to_array(image)
        assert dominant_color(array, foreground(array))[0] == color
        assert classify_shape(foreground(array)) == "triangle"
    assert classify_shape(np.zeros((8, 8), bool)) is None

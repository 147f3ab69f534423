"""Task-specific tests of object_tracking, sorting_by_size, shape_matching and connect_the_dots: the solvers are
correct, the video scorer checks the trajectory, and each wrong rendering names the check it fails."""

import math

import numpy as np
import pytest

from app.cv import PALETTE
from app.tasks.vbvr import get_task
from app.tasks.vbvr.puzzles._regions import foreground
from app.tasks.vbvr.puzzles.connect_the_dots import point_segment_distance
from app.tasks.vbvr.puzzles.shape_matching import nearest_hue
from app.tasks.vbvr.puzzles.sorting_by_size import bubble_sort_swaps

SEEDS = range(8)


def failed_names(result):
    return {c.name for c in result.checks if not c.passed}


def flooded(image, color):
    """``image`` with its background (everything but its objects and outlines) painted ``color``."""
    return np.where(foreground(image)[..., None], image, np.array(PALETTE[color], dtype=np.uint8))


def checkerboard(image, color, cell=1):
    """``image`` with every other ``cell``-pixel square painted ``color``."""
    ys, xs = np.mgrid[0 : image.shape[0], 0 : image.shape[1]] // cell
    return np.where(((ys + xs) % 2 == 0)[..., None], np.array(PALETTE[color], dtype=np.uint8), image)


# --- object_tracking ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_tracking_solver_extrapolates_constant_velocity(seed):
    task = get_task("object_tracking")
    instance = task.generate(seed)
    config, solution = instance.config, instance.solution
    (x, y), (vx, vy), steps = config["start"], config["velocity"], config["steps"]
    assert solution["final_position"] == pytest.approx([x + steps * vx, y + steps * vy], abs=0.01)
    assert len(instance.frames) == steps + 1 and config["shown"] in instance.key_frame_indices
    radius = config["radius"]
    for t in range(steps + 1):  # the ball stays inside the image at every step
        px, py = task.position(config, t)
        assert radius <= px <= task.image_size - radius and radius <= py <= task.image_size - radius
    # The answer is far from the last shown position: extrapolation is needed.
    assert math.dist(task.position(config, config["shown"]), solution["final_position"]) >= 2 * radius


def test_tracking_video_and_last_frame_agree_when_correct():
    task = get_task("object_tracking")
    instance = task.generate(0)
    video, image = task.score(instance.frames, instance.config), task.score(instance.last_frame, instance.config)
    assert video == image and video.score == 1.0
    assert {c.name for c in video.checks} == {
        "single_ball",
        "ball_at_expected_position",
        "moves_along_direction",
        "stays_on_line",
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_tracking_ball_moving_the_wrong_way_scores_lower(seed):
    task = get_task("object_tracking")
    instance = task.generate(seed)
    correct = task.score(instance.frames, instance.config)
    reversed_video = task.score(instance.frames[::-1], instance.config)  # from the answer back to the start
    assert reversed_video.score < correct.score
    assert {"ball_at_expected_position", "moves_along_direction"} <= failed_names(reversed_video)
    # Wrong-way motion that still ends on the right answer: only the trajectory check can catch it.
    backwards_then_jump = np.concatenate([instance.frames[:-1][::-1], instance.frames[-1:]])
    result = task.score(backwards_then_jump, instance.config)
    assert result.score < correct.score
    assert "moves_along_direction" in failed_names(result)
    assert "ball_at_expected_position" not in failed_names(result)


def test_tracking_ball_leaving_the_line_fails_stays_on_line():
    task = get_task("object_tracking")
    instance = task.generate(1)
    config = instance.config
    (vx, vy), radius = config["velocity"], config["radius"]
    norm = math.hypot(vx, vy)
    frames = []
    for t in range(config["steps"] + 1):
        x, y = task.position(config, t)
        bump = 2 * radius if 0 < t < config["steps"] else 0.0  # detour perpendicular to the motion, same endpoints
        frames.append(task._draw(config, [((x - vy / norm * bump, y + vx / norm * bump), config["color"])]))
    result = task.score(np.stack(frames), config)
    assert "stays_on_line" in failed_names(result) and 0.0 < result.score < 1.0


def test_tracking_perturbations_name_their_failed_checks():
    task = get_task("object_tracking")
    instance = task.generate(2)
    perturbed = task.perturbations(instance.config, instance.solution)
    assert "ball_at_expected_position" in failed_names(task.score(perturbed["wrong_position"], instance.config))
    two = task.score(perturbed["two_balls"], instance.config)
    assert two.score == 0.0 and any(f.startswith("single_ball") for f in two.failed)


def test_tracking_a_canvas_of_the_ball_colour_is_no_ball():
    task = get_task("object_tracking")
    config = {"color": "red", "radius": 7, "start": [34.0, 64.0], "velocity": [3.0, 0.0], "steps": 10, "shown": 5}
    assert task.score(task._draw(config, [(task.position(config, 10), "red")]), config).score == 1.0
    problem = task._draw(config, [(task.position(config, 0), "red")])
    for image in (np.full_like(problem, PALETTE["red"]), flooded(problem, "red"), checkerboard(problem, "red")):
        result = task.score(image, config)  # its centroid is the canvas centre: the answer
        assert result.score == 0.0 and "single_ball" in failed_names(result)


# --- sorting_by_size ------------------------------------------------------------------------------------------------


def test_bubble_sort_swaps_sort_the_list():
    heights = [44, 14, 74, 24]
    order = list(heights)
    for i in bubble_sort_swaps(heights):
        assert order[i] > order[i + 1]
        order[i], order[i + 1] = order[i + 1], order[i]
    assert order == sorted(heights)


@pytest.mark.parametrize("seed", SEEDS)
def test_sorting_solver_and_video(seed):
    task = get_task("sorting_by_size")
    instance = task.generate(seed)
    heights = instance.config["heights"]
    assert heights != sorted(heights) and len(set(heights)) == len(heights)
    assert instance.solution["sorted_heights"] == sorted(heights)
    assert len(instance.frames) == len(instance.solution["swaps"]) + 1  # one swap per frame
    assert task.measure(instance.first_frame, instance.config) == pytest.approx(heights, abs=1)
    assert task.measure(instance.last_frame, instance.config) == pytest.approx(sorted(heights), abs=1)


def test_sorting_perturbations_and_wrong_sizes_name_their_failed_checks():
    task = get_task("sorting_by_size")
    instance = task.generate(0)
    config, perturbed = instance.config, task.perturbations(instance.config, instance.solution)
    assert task.score(perturbed["unsorted"], config).score == 0.0
    assert "sorted_ascending" in failed_names(task.score(perturbed["unsorted"], config))
    assert {"count_matches", "sizes_match"} <= failed_names(task.score(perturbed["missing_item"], config))
    shrunk = task._draw(config, [h + 5 for h in sorted(config["heights"])])  # sorted, but not the given bars
    result = task.score(shrunk, config)
    assert failed_names(result) == {"sizes_match"} and result.score <= 0.6


def test_sorting_one_bar_or_a_block_is_not_a_sorted_row():
    task = get_task("sorting_by_size")
    config = task.generate(0).config
    tallest = max(config["heights"])
    block = task._draw(config, [])
    block[120 - tallest + 1 : 121, 4:64] = PALETTE[config["color"]]  # a tallest bar's height, three bars wide
    for image in (task._draw(config, [tallest]), block):
        result = task.score(image, config)
        assert result.score == 0.0 and "sorted_ascending" in failed_names(result)


# --- shape_matching -------------------------------------------------------------------------------------------------


def test_nearest_hue_is_the_confusable_neighbour():
    assert nearest_hue("purple") == "magenta" and nearest_hue("blue") == "violet"


@pytest.mark.parametrize("seed", SEEDS)
def test_shape_matching_solver_copies_the_target(seed):
    task = get_task("shape_matching")
    instance = task.generate(seed)
    config, solution = instance.config, instance.solution
    assert (solution["shape"], solution["color"], solution["radius"]) == (
        config["shape"],
        config["color"],
        config["radius"],
    )
    assert solution["center"] == config["slot"]
    assert task.score(instance.first_frame, config).score == 0.0  # the empty slot is not a solution


def test_shape_matching_perturbations_name_their_failed_checks():
    task = get_task("shape_matching")
    instance = task.generate(0)
    config, perturbed = instance.config, task.perturbations(instance.config, instance.solution)
    assert "slot_shape_matches" in failed_names(task.score(perturbed["wrong_shape"], config))
    assert failed_names(task.score(perturbed["wrong_hue"], config)) == {"slot_hue_matches"}
    too_small = task._draw(config, config["shape"], radius=config["radius"] * 0.6)
    result = task.score(too_small, config)
    assert failed_names(result) == {"size_matches"} and result.score < 1.0


@pytest.mark.parametrize("cell", [1, 4])
def test_shape_matching_a_slot_filled_to_its_outline_is_no_shape(cell):
    task = get_task("shape_matching")
    config = {**task.generate(0).config, "shape": "square", "color": "magenta"}
    blank = task._draw(config, None)
    for image in (checkerboard(blank, "magenta", cell), flooded(blank, "magenta")):
        result = task.score(image, config)
        assert result.score == 0.0 and "slot_shape_matches" in failed_names(result)


# --- connect_the_dots -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_connect_the_dots_solver_joins_dots_in_order_of_size(seed):
    task = get_task("connect_the_dots")
    instance = task.generate(seed)
    config = instance.config
    n = len(config["dots"])
    assert config["radii"] == sorted(config["radii"]) and len(set(config["radii"])) == n
    assert instance.solution["segments"] == [[i, i + 1] for i in range(n - 1)]
    assert len(instance.frames) == n  # one segment added per frame
    for i in range(n - 1):  # no other dot sits on a solution segment
        for m in set(range(n)) - {i, i + 1}:
            assert (
                point_segment_distance(config["dots"][m], config["dots"][i], config["dots"][i + 1]) > config["radii"][m]
            )


def test_connect_the_dots_failed_checks():
    task = get_task("connect_the_dots")
    instance = task.generate(0)
    config, perturbed = instance.config, task.perturbations(instance.config, instance.solution)
    for kind in ("missing_segment", "wrong_order"):
        result = task.score(perturbed[kind], config)
        assert result.score == 0.0 and "all_pairs_connected" in failed_names(result)
    extra = task._draw(config, instance.solution["segments"] + [[0, 2]])  # every pair joined, plus a stray segment
    result = task.score(extra, config)
    assert failed_names(result) == {"no_extra_segments"} and 0.0 < result.score < 1.0


def test_connect_the_dots_a_canvas_of_the_line_colour_joins_nothing():
    task = get_task("connect_the_dots")
    instance = task.generate(0)
    config, colour = instance.config, instance.config["line_color"]
    for image in (flooded(instance.first_frame, colour), np.full_like(instance.first_frame, PALETTE[colour])):
        result = task.score(image, config)
        assert result.score == 0.0 and "line_colour_on_segments" in failed_names(result)
    sloppy = task._draw(config, instance.solution["segments"])
    sloppy[4:14, 4:14] = PALETTE[colour]  # a small smudge off the lines is tolerated
    assert task.score(sloppy, config).score == 1.0


@pytest.mark.parametrize("name", ["object_tracking", "sorting_by_size", "shape_matching", "connect_the_dots"])
def test_out_of_domain_params_change_the_problem(name):
    task = get_task(name)
    ood = get_task(name, **{**task.params, **task.out_of_domain_params()})
    assert ood.params != task.params
    for seed in range(3):
        instance = ood.generate(seed)
        assert ood.score(instance.frames, instance.config).score >= 0.999

"""Task-specific tests of the planning / physics tasks (maze_path, path_around_obstacles, sliding_block, gravity_drop):
solvers on hand-made configurations, and scorers that name the check a specific mistake breaks."""

import numpy as np
import pytest

from app.cv import PALETTE
from app.tasks.vbvr import get_task
from app.tasks.vbvr.puzzles._grid_path import shortest_path
from app.tasks.vbvr.puzzles._regions import foreground
from app.tasks.vbvr.puzzles.gravity_drop import drop
from app.tasks.vbvr.puzzles.sliding_block import slide

# Two routes from S (1, 1) to G (3, 4): over the top (7 steps) and round the bottom (9 steps).
MAZE = {
    "grid": ["#######", "#.....#", "#.###.#", "#.#...#", "#.#.###", "#.....#", "#######"],
    "start": [1, 1],
    "goal": [3, 4],
}
LONG_WAY = [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (5, 2), (5, 3), (4, 3), (3, 3), (3, 4)]


def failed_names(result):
    return {name.split(":")[0] for name in result.failed}


def test_bfs_finds_the_shortest_route():
    path = shortest_path(MAZE["grid"], (1, 1), (3, 4))
    assert len(path) - 1 == 7 and path[0] == (1, 1) and path[-1] == (3, 4)
    assert all(MAZE["grid"][r][c] == "." for r, c in path)
    assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(path, path[1:], strict=False))
    assert shortest_path([".#.", ".#.", ".#."], (0, 0), (0, 2)) is None
    assert get_task("maze_path").solve(MAZE)["length"] == 7


def test_maze_scorer_accepts_the_solution_and_grades_a_longer_path():
    task = get_task("maze_path")
    frames, keys = task.render(MAZE, task.solve(MAZE))
    assert task.score(frames, MAZE).score == 1.0
    assert keys[0] == 1 and not (frames[0] == frames[-1]).all()
    detour = task.score(task._draw(MAZE, [LONG_WAY]), MAZE)  # valid but two steps too long: soft penalty only
    assert 0.6 < detour.score < 1.0 and failed_names(detour) == {"length_near_shortest"}
    assert task.score(frames[0], MAZE).score == 0.0  # the unsolved maze


@pytest.mark.parametrize(
    ("kind", "check"),
    [
        ("broken_path", "one_blue_component"),
        ("broken_path", "path_connects_start_to_goal"),
        ("path_through_wall", "path_avoids_walls"),
        ("wrong_goal", "path_connects_start_to_goal"),
    ],
)
def test_maze_perturbations_fail_their_check(kind, check):
    task = get_task("maze_path")
    for seed in range(3):
        instance = task.generate(seed)
        result = task.score(task.perturbations(instance.config, instance.solution)[kind], instance.config)
        assert check in failed_names(result) and result.score == 0.0


def test_maze_generator_makes_a_walled_solvable_maze():
    for params in ({}, get_task("maze_path").out_of_domain_params()):
        task = get_task("maze_path", **params)
        config = task.generate(1).config
        grid, n = config["grid"], 2 * task.cells + 1
        assert len(grid) == n and grid[0] == "#" * n and all(row[0] == row[-1] == "#" for row in grid)
        assert shortest_path(grid, tuple(config["start"]), tuple(config["goal"])) is not None


OPEN = {"grid": ["....", ".##.", ".##.", "...."], "start": [0, 0], "goal": [3, 3]}


def test_any_shortest_path_around_obstacles_is_accepted():
    task = get_task("path_around_obstacles")
    assert task.solve(OPEN)["length"] == 6
    top = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (2, 3), (3, 3)]
    left = [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (3, 2), (3, 3)]
    for path in (top, left):
        assert task.score(task._draw(OPEN, [path]), OPEN).score == 1.0
    through = task.score(task._draw(OPEN, [[(0, 0), (0, 1), (1, 1), (2, 1), (3, 1), (3, 2), (3, 3)]]), OPEN)
    assert through.score == 0.0 and "path_avoids_obstacles" in failed_names(through)


def flooded(image, color="blue"):
    """``image`` with its background and grid lines (everything but walls and markers) painted ``color``."""
    return np.where(foreground(image)[..., None], image, np.array(PALETTE[color], dtype=np.uint8))


def test_maze_flooded_blue_is_no_path():
    task = get_task("maze_path")
    result = task.score(flooded(task._draw(MAZE, [])), MAZE)  # one blue area joining start and goal, walls clear
    assert result.score == 0.0 and "path_is_a_line" in failed_names(result)
    assert "path_is_a_line" not in failed_names(task.score(task._draw(MAZE, [LONG_WAY]), MAZE))


@pytest.mark.parametrize("name", ["maze_path", "path_around_obstacles"])
def test_generated_problems_flooded_blue_are_no_path(name):
    task = get_task(name)
    for seed in range(3):
        instance = task.generate(seed)
        result = task.score(flooded(instance.first_frame), instance.config)
        assert result.score == 0.0 and "path_is_a_line" in failed_names(result)


def test_obstacle_perturbations_fail_their_check():
    task = get_task("path_around_obstacles")
    instance = task.generate(0)
    wrong = task.perturbations(instance.config, instance.solution)
    assert "path_avoids_obstacles" in failed_names(task.score(wrong["path_hits_obstacle"], instance.config))
    assert "one_blue_component" in failed_names(task.score(wrong["broken_path"], instance.config))
    config = instance.config
    assert len(instance.solution["path"]) - 1 > abs(config["start"][0] - config["goal"][0]) + len(config["grid"]) - 1


def block_config(**changes):
    config = {
        "size": 5,
        "walls": [[0, 4]],
        "blocks": [{"color": "red", "cell": [0, 0]}, {"color": "blue", "cell": [3, 3]}],
        "target": [4, 4],
        "mover": 0,
        "direction": "right",
    }
    return {**config, **changes}


def test_slide_stops_at_wall_block_edge_and_target():
    assert slide(block_config())[-1] == [0, 3]  # wall at (0, 4)
    assert slide(block_config(direction="down"))[-1] == [4, 0]  # grid edge
    blocked = block_config(blocks=[{"color": "red", "cell": [3, 0]}, {"color": "blue", "cell": [3, 3]}])
    assert slide(blocked)[-1] == [3, 2]  # the blue block
    assert slide(block_config(target=[0, 2]))[-1] == [0, 2]  # stops on the target
    assert slide(block_config(direction="left")) == [[0, 0]]  # against the edge already


def test_sliding_block_scorer_names_the_mistake():
    task = get_task("sliding_block")
    config = block_config()
    solution = task.solve(config)
    frames, _ = task.render(config, solution)
    assert len(frames) == solution["distance"] + 1 == 4 and task.score(frames, config).score == 1.0
    wrong = task.perturbations(config, solution)
    assert failed_names(task.score(wrong["wrong_position"], config)) == {"moved_block_at_expected_cell"}
    assert "exactly_one_moved_block" in failed_names(task.score(wrong["extra_block"], config))
    moved_other = task._draw(config, [[0, 3], [2, 3]])  # the right move, but the blue block moved too
    result = task.score(moved_other, config)
    assert failed_names(result) == {"other_blocks_unmoved"} and result.score == 0.0
    assert "red block right" in task.prompt(config)


GRAVITY = {
    "size": 5,
    "filled": [[2, 2], [4, 0]],
    "balls": [
        {"color": "red", "cell": [0, 0]},
        {"color": "yellow", "cell": [0, 1]},
        {"color": "green", "cell": [1, 1]},
        {"color": "blue", "cell": [0, 2]},
    ],
}


def test_drop_rests_on_floor_filled_cells_and_balls():
    assert drop(GRAVITY) == [[3, 0], [3, 1], [4, 1], [1, 2]]
    task = get_task("gravity_drop")
    solution = task.solve(GRAVITY)
    assert solution["falls"] == [3, 3, 3, 1]
    frames, _ = task.render(GRAVITY, solution)
    assert len(frames) == 4 and task.score(frames, GRAVITY).score == 1.0
    assert task.score(frames[0], GRAVITY).score == 0.0


def test_gravity_scorer_names_the_mistake():
    task = get_task("gravity_drop")
    wrong = task.perturbations(GRAVITY, task.solve(GRAVITY))
    assert "balls_supported" in failed_names(task.score(wrong["ball_floating"], GRAVITY))
    assert "balls_stay_in_column" in failed_names(task.score(wrong["wrong_column"], GRAVITY))
    missing = task._draw({**GRAVITY, "balls": GRAVITY["balls"][:3]}, drop(GRAVITY)[:3])
    assert "one_blob_per_ball" in failed_names(task.score(missing, GRAVITY))
    # the yellow and green balls swapped: every ball supported and in its column, two at the wrong cell (soft)
    swapped = task._draw(GRAVITY, [[3, 0], [4, 1], [3, 1], [1, 2]])
    result = task.score(swapped, GRAVITY)
    assert failed_names(result) == {"yellow_ball_at_rest", "green_ball_at_rest"} and result.score == 0.5


@pytest.mark.parametrize("name", ["maze_path", "path_around_obstacles", "sliding_block", "gravity_drop"])
def test_out_of_domain_is_bigger(name):
    task = get_task(name)
    ood = get_task(name, **{**task.params, **task.out_of_domain_params()})
    small, big = task.generate(0).config, ood.generate(0).config
    assert len(big.get("grid", [])) > len(small.get("grid", [])) or big["size"] > small["size"]
    assert np.asarray(ood.generate(0).frames).shape[1:] == (128, 128, 3)

"""Every registered task's scorer is validated: the solver's rendering scores 1, each perturbation scores clearly
lower, blur / noise / JPEG of a correct rendering keep a high score, and degenerate renderings (constant colours,
noise, checkerboards, floods) score no more than the unsolved problem; generation and scoring are deterministic."""

import numpy as np
import pytest

from app.cv import BACKGROUND, PALETTE
from app.tasks.vbvr import TASKS, get_task
from app.tasks.vbvr.validation import (
    CHECKER_CELLS,
    DEGRADED_MIN,
    PERTURBED_MAX,
    ValidationRow,
    degenerate_renderings,
    report,
    validate,
)

NAMES = sorted(TASKS)
SEEDS = range(6)


def test_there_are_at_least_twelve_tasks():
    assert len(NAMES) >= 12, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_scorer_validation(name):
    row = validate(get_task(name), SEEDS)
    assert row.solver >= 0.999, f"the solver's own rendering scored {row.solver}"
    assert len(row.perturbed) >= 2, "a task needs at least two kinds of perturbation"
    for kind, value in row.perturbed.items():
        assert value <= PERTURBED_MAX, f"perturbation {kind} scored {value}"
    assert row.degraded, "no degradation was scored"
    for kind, value in row.degraded.items():
        assert value >= DEGRADED_MIN, f"degradation {kind} scored {value}"
    cheats = {kind: value for kind, value in row.degenerate.items() if value > row.blank}
    assert not cheats, f"degenerate renderings scored above the unsolved problem ({row.blank}): {cheats}"
    assert row.ok


def test_a_degenerate_rendering_above_the_blank_fails_the_row_and_the_report_names_the_worst():
    row = ValidationRow("t", 1.0, {"wrong": 0.1}, {"blur": 0.9}, blank=0.2, degenerate={"flood red": 0.3, "noise": 0.0})
    assert not row.ok
    assert report([row]).splitlines()[-1] == "| t | 1.00 | wrong 0.10 | blur 0.90 | 0.20 | flood red 0.30 | NO |"
    assert ValidationRow("t", 1.0, {"wrong": 0.1}, {"blur": 0.9}, blank=0.2, degenerate={"noise": 0.2}).ok


def test_degenerate_renderings_cover_colours_noise_checkerboards_and_floods():
    problem = np.full((6, 10, 3), BACKGROUND, dtype=np.uint8)
    problem[2:4, 2:4] = (40, 40, 40)  # a dark object that floods keep
    found = degenerate_renderings(problem)
    assert len(found) == len(PALETTE) + 2 + 1 + len(CHECKER_CELLS) * (len(PALETTE) + 1) + len(PALETTE)
    assert all(image.shape == (6, 10, 3) and image.dtype == np.uint8 for image in found.values())
    assert (found["constant white"] == 255).all() and (found["constant red"] == PALETTE["red"]).all()
    board = found["checkerboard 1 blue"]
    assert (board[0, 0] == PALETTE["blue"]).all() and (board[0, 1] == BACKGROUND).all()
    assert (board[1, 1] == PALETTE["blue"]).all()
    big = found["checkerboard 4 all colours"]
    assert (big[:4, :4] == PALETTE["red"]).all() and (big[:4, 4:8] == PALETTE["orange"]).all()
    flood = found["flood green"]
    assert (flood[2:4, 2:4] == 40).all() and (flood[0, 0] == PALETTE["green"]).all()
    assert len(np.unique(found["uniform noise"].reshape(-1, 3), axis=0)) > 50


@pytest.mark.parametrize("name", NAMES)
def test_generation_and_scoring_are_deterministic(name):
    task = get_task(name)
    a, b = task.generate(3), task.generate(3)
    assert a.config == b.config and a.solution == b.solution and a.prompt == b.prompt
    np.testing.assert_array_equal(a.frames, b.frames)
    assert a.key_frame_indices[0] == 0 and a.key_frame_indices[-1] == len(a.frames) - 1
    assert task.score(a.frames, a.config) == task.score(b.last_frame, b.config)


@pytest.mark.parametrize("name", NAMES)
def test_failed_checks_are_reported(name):
    task = get_task(name)
    instance = task.generate(0)
    perturbations = task.perturbations(instance.config, instance.solution)
    assert perturbations
    for kind, image in perturbations.items():
        result = task.score(image, instance.config)
        assert result.score < 1.0, f"perturbation {kind} scored {result.score}"
        assert result.failed, "a score below 1 must name the checks that failed"


@pytest.mark.parametrize("name", NAMES)
def test_out_of_domain_split_generates(name):
    task = get_task(name)
    ood = get_task(name, **{**task.params, **task.out_of_domain_params()}) if task.out_of_domain_params() else task
    instance = ood.generate(0)
    assert ood.score(instance.frames, instance.config).score >= 0.999


def test_scorer_rejects_malformed_renderings():
    task = get_task("object_counting")
    config = task.generate(0).config
    with pytest.raises(ValueError, match="RGB image"):
        task.score(np.zeros((4, 4)), config)


@pytest.mark.parametrize("name", NAMES)
def test_every_task_generates_both_splits_at_its_minimum_image_size(name):
    from app.tasks.vbvr.shards import task_params

    size = get_task(name).min_image_size
    for split in ("in_domain", "out_of_domain"):
        task = get_task(name, **task_params(name, split, size))
        for seed in range(20):
            assert task.generate(seed).first_frame.shape[:2] == (size, size)


def test_an_image_below_the_tasks_minimum_is_a_clear_error():
    with pytest.raises(ValueError, match=r"sorting_by_size: image_size must be >= 128 .*got 64"):
        get_task("sorting_by_size", image_size=64)

import random

import numpy as np
import pytest

from app.tasks.dots.dots import QUESTION, TASK, DotsDataset, make_dots_sample
from app.types import VisualSample


def pixels(sample: VisualSample) -> np.ndarray:
    return np.asarray(sample.images[0], dtype=np.int16)


def centre_x(image: np.ndarray, rgb: tuple[int, int, int]) -> float:
    mask = np.abs(image - np.array(rgb)).sum(axis=-1) < 60  # [H, W]
    assert mask.any(), f"no pixel of colour {rgb}"
    return float(np.nonzero(mask)[1].mean())


def test_sample_fields():
    sample = DotsDataset(num_samples=2, seed=0)[0]
    assert isinstance(sample, VisualSample)
    assert sample.task == TASK and sample.question == QUESTION
    assert len(sample.images) == 1 and sample.images[0].mode == "RGB" and sample.images[0].size == (112, 112)
    assert sample.answer in ("yes", "no")
    assert sample.meta["image_size"] == 112
    red_x, blue_x = sample.meta["red_xy"][0], sample.meta["blue_xy"][0]
    side = "left" if red_x < blue_x else "right"
    assert sample.reasoning == f"red is {side} of blue"
    assert len(sample.reasoning.split()) <= 12


def test_same_seed_same_samples_and_different_seed_differs():
    a, b, c = DotsDataset(8, seed=3), DotsDataset(8, seed=3), DotsDataset(8, seed=4)
    for i in range(8):
        assert np.array_equal(pixels(a[i]), pixels(b[i]))
        assert (a[i].answer, a[i].reasoning, a[i].meta) == (b[i].answer, b[i].reasoning, b[i].meta)
    assert any(not np.array_equal(pixels(a[i]), pixels(c[i])) for i in range(8))


def test_sample_depends_only_on_seed_and_index():
    short, long = DotsDataset(4, seed=1), DotsDataset(100, seed=1)
    for i in range(4):
        assert np.array_equal(pixels(short[i]), pixels(long[i])) and short[i].answer == long[i].answer
    assert np.array_equal(pixels(long[-1]), pixels(long[99]))
    with pytest.raises(IndexError):
        long[100]


def test_answers_are_balanced_exactly():
    dataset = DotsDataset(200, seed=0)
    answers = [dataset.answer_for(i) for i in range(len(dataset))]
    assert answers.count("yes") == answers.count("no") == 100
    assert answers != ["yes", "no"] * 100  # the order within pairs is random


@pytest.mark.parametrize("num_distractors", [0, 3])
def test_red_is_left_iff_answer_yes_and_gap_respected(num_distractors):
    dataset = DotsDataset(40, seed=7, num_distractors=num_distractors)
    for i in range(len(dataset)):
        sample = dataset[i]
        image = pixels(sample)
        red_x, blue_x = centre_x(image, (220, 30, 30)), centre_x(image, (30, 60, 220))
        assert (red_x < blue_x) == (sample.answer == "yes")
        assert abs(sample.meta["red_xy"][0] - sample.meta["blue_xy"][0]) >= 112 // 4
        assert abs(red_x - sample.meta["red_xy"][0]) <= 1  # pixels agree with the metadata


def test_make_dots_sample_options():
    rng = random.Random(0)
    for _ in range(50):
        sample = make_dots_sample(rng, image_size=64, min_gap=30, answer="no")
        red, blue = sample.meta["red_xy"], sample.meta["blue_xy"]
        assert sample.answer == "no" and red[0] - blue[0] >= 30
        assert sample.reasoning == "red is right of blue"
        assert sample.images[0].size == (64, 64)
    with pytest.raises(ValueError, match="min_gap"):
        make_dots_sample(rng, image_size=64, min_gap=64)
    with pytest.raises(ValueError, match="answer"):
        make_dots_sample(rng, answer="maybe")


def test_unlabeled_keeps_the_scene_and_drops_labels():
    labeled, unlabeled = DotsDataset(4, seed=2), DotsDataset(4, seed=2, labeled=False)
    for i in range(4):
        assert unlabeled[i].answer is None and unlabeled[i].reasoning is None
        assert np.array_equal(pixels(labeled[i]), pixels(unlabeled[i]))
        assert unlabeled[i].meta == labeled[i].meta


def test_right_relation_asks_the_other_way_with_the_same_reasoning():
    dataset = DotsDataset(num_samples=40, seed=2, image_size=64, dot_radius=6, relation="right")
    answers = []
    for i in range(len(dataset)):
        sample = dataset[i]
        red_right = sample.meta["red_xy"][0] > sample.meta["blue_xy"][0]
        assert sample.question == "Is the red dot right of the blue dot?"
        assert sample.answer == ("yes" if red_right else "no")
        assert sample.reasoning == f"red is {'right' if red_right else 'left'} of blue"
        answers.append(sample.answer)
    assert answers.count("yes") == 20
    with pytest.raises(ValueError, match="relation must be one of"):
        DotsDataset(num_samples=2, seed=0, relation="above")

"""ColorRegionReward: the rendered target of a prompt scores 1, a wrong colour / position / shape scores less."""

import numpy as np
import pytest
import torch

from app.cv import BACKGROUND, PALETTE
from app.rewards.color_region import (
    ColorRegionReward,
    color_region_checks,
    color_region_reward,
    parse_shape_prompt,
)
from app.tasks.dots.shapes import COLORS, POSITIONS, SHAPES, ShapePromptDataset, render_shape, shape_prompt
from app.tasks.vbvr.validation import degenerate_renderings
from app.types import VisualSample

OPPOSITE = {"left": "right", "right": "left", "top": "bottom", "bottom": "top"}


def _sample(color, shape, position):
    return VisualSample(
        images=[],
        question=f"a {color} {shape} on the {position}",
        task="shape_prompts",
        meta=dict(color=color, shape=shape, position=position),
    )


def test_rendered_targets_score_one_as_tensor_and_uint8():
    samples = list(ShapePromptDataset(32, seed=3))
    arrays = [np.array(s.images[0]) for s in samples]  # writable copies: torch.from_numpy shares the memory
    tensors = [torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in arrays]
    reward = ColorRegionReward()
    assert torch.equal(reward.score(arrays, samples), torch.ones(32))
    assert torch.equal(reward.score(tensors, samples), torch.ones(32))


@pytest.mark.parametrize("position", POSITIONS)
def test_wrong_position_colour_and_shape_score_lower(position):
    image = np.asarray(render_shape("red", "square", position))
    reward = ColorRegionReward()
    right, wrong_place, wrong_colour, wrong_shape = reward.score(
        [image] * 4,
        [
            _sample("red", "square", position),
            _sample("red", "square", OPPOSITE[position]),
            _sample("blue", "square", position),
            _sample("red", "circle", position),
        ],
    )
    assert float(right) == 1.0
    assert float(wrong_place) == pytest.approx(2 / 3)
    assert float(wrong_colour) == 0.0
    assert float(wrong_shape) == pytest.approx(2 / 3)


def test_blank_noise_and_malformed_images_score_low_without_raising():
    blank = np.full((64, 64, 3), 235, dtype=np.uint8)
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    samples = [_sample(c, "circle", "left") for c in COLORS[:3]]
    values = ColorRegionReward().score([blank, noise, np.zeros((5,), dtype=np.uint8)], samples)
    assert values[0] == 0.0 and values[2] == 0.0 and values[1] < 0.5


ALL_PROMPTS = [shape_prompt(c, s, p) for c in COLORS for s in SHAPES for p in POSITIONS]
HALVES = {"left": np.s_[:, :32], "right": np.s_[:, 32:], "top": np.s_[:32], "bottom": np.s_[32:]}


def _best(image):
    """The highest score any of the 32 prompts gives ``image``, and that prompt."""
    values = color_region_reward([image] * len(ALL_PROMPTS), ALL_PROMPTS)
    return float(values.max()), ALL_PROMPTS[int(values.argmax())]


def test_a_canvas_filled_with_the_colour_is_not_a_square_on_the_left():
    red = np.full((64, 64, 3), PALETTE["red"], dtype=np.uint8)
    assert color_region_reward([red], ["a red square on the left"]).tolist() == [0.0]


@pytest.mark.parametrize("size", [64, 128])
def test_constant_noise_checkerboard_and_flooded_canvases_score_like_a_blank_one(size):
    blank = np.full((size, size, 3), BACKGROUND, dtype=np.uint8)
    assert _best(blank)[0] == 0.0
    cheats = {name: _best(image) for name, image in degenerate_renderings(blank).items()}
    assert {name: found for name, found in cheats.items() if found[0] > 0.0} == {}


@pytest.mark.parametrize("color", COLORS)
def test_a_half_of_the_canvas_in_the_colour_is_not_a_shape_in_that_half(color):
    for position, half in HALVES.items():
        image = np.full((64, 64, 3), BACKGROUND, dtype=np.uint8)
        image[half] = PALETTE[color]
        for shape in SHAPES:
            assert color_region_reward([image], [shape_prompt(color, shape, position)]).tolist() == [0.0]


def test_a_lattice_of_squares_is_not_a_square_on_the_left_or_the_top():
    image = np.full((64, 64, 3), BACKGROUND, dtype=np.uint8)
    for y in range(2, 64, 16):
        for x in range(2, 64, 16):
            image[y : y + 12, x : x + 12] = PALETTE["red"]  # 16 equal squares: the first one is top left
    values = color_region_reward([image] * 2, ["a red square on the left", "a red square on the top"])
    assert values.tolist() == [0.0, 0.0]


def test_a_rectangle_is_not_a_square_and_a_bigger_square_still_is():
    bar = np.full((64, 64, 3), BACKGROUND, dtype=np.uint8)
    bar[20:44, 4:12] = PALETTE["blue"]  # 8 x 24: fills its box, three times as tall as wide
    checks = color_region_checks(bar, "blue", "square", "left")
    assert checks == {"color": 1.0, "position": 1.0, "shape": 0.0}
    big = np.full((64, 64, 3), BACKGROUND, dtype=np.uint8)
    big[2:32, 1:31] = PALETTE["blue"]  # 30 x 30: fits in the left half (and the top one)
    assert color_region_checks(big, "blue", "square", "left") == {"color": 1.0, "position": 1.0, "shape": 1.0}


def test_functional_twin_reads_prompt_text():
    image = np.asarray(render_shape("green", "circle", "top"))
    values = color_region_reward(
        [image, image, image], ["a green circle on the top", "a green circle on the bottom", "draw something"]
    )
    assert values.tolist() == pytest.approx([1.0, 2 / 3, 0.0])
    assert parse_shape_prompt("A Blue square on the left") == dict(color="blue", shape="square", position="left")


def test_dataset_is_balanced_and_deterministic():
    a, b = ShapePromptDataset(64, seed=1), ShapePromptDataset(64, seed=1)
    assert [s.question for s in a] == [s.question for s in b]
    assert len({s.question for s in a}) == 32
    assert ShapePromptDataset(4, seed=1, labeled=False)[0].images == []


DEGENERATE = {
    "0x0 numpy": np.zeros((0, 0, 3), dtype=np.uint8),
    "0x0 tensor": torch.zeros(3, 0, 0),
    "empty tensor": torch.zeros(0),
    "video of no frames (tensor)": torch.zeros(0, 3, 8, 8),
    "video of no frames (numpy)": np.zeros((0, 8, 8, 3), dtype=np.uint8),
    "zero-width numpy": np.zeros((8, 0, 3), dtype=np.uint8),
}


def test_degenerate_renderings_score_the_low_end_and_are_counted_and_logged(caplog):
    image = np.asarray(render_shape("red", "square", "left"))
    degenerate = list(DEGENERATE.values())
    reward = ColorRegionReward()
    samples = [_sample("red", "square", "left")] * (len(degenerate) + 1)
    with caplog.at_level("WARNING", logger="app.rewards.color_region"):
        values = reward.score([*degenerate, image], samples)  # no cv2.error
    assert values.tolist() == [reward.value_range[0]] * len(degenerate) + [1.0]  # the good image scores as before
    assert reward.num_malformed == len(degenerate)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == len(degenerate)
    assert messages[0] == (
        "color region reward: completion 0 scored 0.0 (malformed; 1 so far): ValueError: empty rendering of shape "
        "(1, 0, 0, 3) as [T, H, W, 3]: no frames or no pixels"
    )
    assert (
        "completion 2 scored 0.0 (malformed; 3 so far): ValueError: cannot read a rendering of shape (0,)"
        in messages[2]
    )
    assert "empty rendering of shape (0, 8, 8, 3)" in messages[3]
    reward.score([DEGENERATE["0x0 numpy"]], samples[:1])
    assert reward.num_malformed == len(degenerate) + 1  # cumulative
    # The functional form scores them 0 too, and warns.
    assert color_region_reward(degenerate, ["a red square on the left"] * len(degenerate)).tolist() == [0.0] * 6


def test_unreadable_prompt_parts_score_zero_without_counting_the_rendering():
    image = np.asarray(render_shape("red", "square", "left"))
    reward = ColorRegionReward()
    bad = VisualSample(images=[], question="q", task="t", meta=dict(color="red", shape="square", position="middle"))
    assert reward.score([image], [bad]).tolist() == [0.0] and reward.num_malformed == 0


def test_a_text_completion_is_the_kind_it_does_not_score_and_scores_as_malformed():
    reward = ColorRegionReward()
    assert "text" not in reward.completion_kinds  # what a reward server reports in /info
    sample = VisualSample([], "a red square on the left", "shapes")
    assert reward.score(["a red square"], [sample]).tolist() == [0.0] and reward.num_malformed == 1

"""The VLM policy's caps on a video's frames and frame size (``max_video_frames``, ``max_video_pixels``): a longer
clip is sampled uniformly over its length, larger frames are scaled down, a warning names the row, the count and the
setting, and a clip within the caps reaches the processor untouched."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from app.data.video import capped_video
from app.types import Video, VisualSample


def numbered_clip(frames: int, height: int = 56, width: int = 56, fps: float = 4.0) -> Video:
    """Frame ``i`` filled with the value ``i`` (a kept frame says which it was) and a bright square that moves."""
    video = np.zeros((frames, height, width, 3), dtype=np.uint8)
    for i in range(frames):
        video[i] = i
        x = i * (width - 8) // max(frames - 1, 1)
        video[i, height // 2 - 4 : height // 2 + 4, x : x + 8] = 250
    return Video(video, fps=fps)


def policy_warnings(caplog) -> list[str]:
    """The policy's warnings (transformers' own about its processors are not this test's)."""
    return [r.getMessage() for r in caplog.records if r.name == "app.models.vlm" and r.levelno == logging.WARNING]


def row(video: Video) -> VisualSample:
    return VisualSample(images=[], videos=[video], question="Which way does it move?", task="motion_direction")


# ------------------------------------------------------------------------------------------------ capped_video
def test_frames_over_the_cap_are_sampled_uniformly_to_an_even_count_keeping_the_clip_duration():
    clip = numbered_clip(40, fps=4.0)  # 10 s
    capped = capped_video(clip, max_frames=9, max_pixels=56 * 56)
    kept = capped.frames[:, 0, 0, 0].tolist()  # the frame numbers
    assert kept == np.linspace(0, 39, 8).round().astype(int).tolist() == [0, 6, 11, 17, 22, 28, 33, 39]
    assert capped.num_frames == 8 and capped.fps == pytest.approx(8 / 40 * 4.0)  # 8 frames over the same 10 s
    assert np.array_equal(capped.frames, clip.frames[kept])


def test_frames_over_the_pixel_cap_are_scaled_down_keeping_the_aspect():
    clip = numbered_clip(4, height=96, width=128)
    capped = capped_video(clip, max_frames=32, max_pixels=48 * 64)  # a quarter of the pixels: half of each side
    assert capped.frames.shape == (4, 48, 64, 3) and capped.fps == clip.fps
    assert capped.frames[:, 0, 0, 0].tolist() == [0, 1, 2, 3]  # area interpolation of uniform corners keeps them


def test_a_clip_within_the_caps_is_returned_as_it_is():
    clip = numbered_clip(7)  # an odd count within the cap stays as it is (the processor pads the last pair)
    assert capped_video(clip, max_frames=8, max_pixels=56 * 56) is clip


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_frames": 1, "max_pixels": 100}, r"max_frames must be >= 2, got 1"),
        ({"max_frames": 4, "max_pixels": 0}, r"max_pixels must be >= 1, got 0"),
    ],
)
def test_capped_video_refuses_caps_that_keep_nothing(kwargs, message):
    with pytest.raises(ValueError, match=message):
        capped_video(numbered_clip(4), **kwargs)


# ------------------------------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("setting, value", [("max_video_frames", 1), ("max_video_pixels", 0)])
def test_the_policy_refuses_caps_that_keep_nothing_naming_the_setting(setting, value, new_policy):
    with pytest.raises(ValueError, match=rf"{setting} must be >= \d, got {value}"):
        new_policy("tiny-qwen2.5-vl", **{setting: value})


@pytest.mark.parametrize("family", ["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_the_policy_encodes_a_long_clip_as_its_uniform_sample_and_says_so(family, new_policy, caplog):
    policy = new_policy(family, max_video_frames=4)
    long, short = numbered_clip(12), numbered_clip(4)
    samples = [row(short), row(long)]
    with caplog.at_level(logging.WARNING, logger="app.models.vlm"):
        got = policy.encode_prompts(samples).tensors
    assert got["video_grid_thw"][:, 0].tolist() == [2, 2]  # 4 frames each: two temporal patches
    want = policy.encode_prompts([row(short), row(capped_video(long, 4, policy.max_video_pixels))]).tensors
    assert set(got) == set(want)
    for key in got:
        assert torch.equal(got[key], want[key]), key
    warnings = policy_warnings(caplog)
    assert len(warnings) == 1
    assert "row 1 (motion_direction)" in warnings[0] and "12 frames" in warnings[0]
    assert "max_video_frames=4" in warnings[0]
    with caplog.at_level(logging.WARNING, logger="app.models.vlm"):
        policy.encode_prompts(samples)  # capped again, without another warning
    assert len(policy_warnings(caplog)) == 1


def test_the_policy_scales_down_large_frames_and_leaves_clips_within_the_caps_alone(new_policy, caplog):
    capped = new_policy("tiny-qwen2.5-vl", max_video_pixels=56 * 56)
    default = new_policy("tiny-qwen2.5-vl")
    large, small = numbered_clip(4, 112, 112), numbered_clip(4, 56, 56)
    with caplog.at_level(logging.WARNING, logger="app.models.vlm"):
        grids = capped.encode_prompts([row(large), row(small)]).tensors["video_grid_thw"]
    assert grids.tolist() == [[2, 4, 4], [2, 4, 4]]  # 56 x 56 pixels: 4 x 4 patches of 14 (112 x 112 would be 8 x 8)
    assert default.encode_prompts([row(large)]).tensors["video_grid_thw"].tolist() == [[2, 8, 8]]
    warnings = policy_warnings(caplog)
    assert len(warnings) == 1 and "row 0 (motion_direction)" in warnings[0]
    assert "112x112" in warnings[0] and "max_video_pixels=3136" in warnings[0]
    with caplog.at_level(logging.WARNING, logger="app.models.vlm"):
        caplog.clear()
        within = default.encode_prompts([row(small)]).tensors
    assert not policy_warnings(caplog)
    assert within["video_grid_thw"].tolist() == [[2, 4, 4]]


def test_the_processor_bounds_a_clip_by_its_token_budget_as_qwen_vl_utils_does(new_policy):
    """``cap_pixels_per_frame``: a frame's pixels are at most ``0.9 x max_video_tokens x 28^2 x 2 / frames`` (the
    budget's share of a frame pair). With a budget of 64 tokens, 8 frames of 224 x 224 (16 x 16 patches each uncapped)
    get ``0.9 x 64 x 784 x 2 / 8 = 11289`` pixels a frame: 106 x 106, which the processor's resize floors to a
    multiple of 28, 84 x 84 (6 x 6 patches of 14)."""
    policy = new_policy("tiny-qwen2.5-vl")
    clip = numbered_clip(8, 224, 224)
    assert policy.encode_prompts([row(clip)]).tensors["video_grid_thw"].tolist() == [[4, 16, 16]]
    policy.processor.video_processor.max_video_tokens = 64
    assert policy.encode_prompts([row(clip)]).tensors["video_grid_thw"].tolist() == [[4, 6, 6]]

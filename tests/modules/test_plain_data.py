"""Pending rollouts as plain data (app.modules.plain_data): what a checkpoint stores of a generation goes through
``torch.load(weights_only=True)`` and comes back as the same containers, images and tensors; what is not one of the
package's containers is refused by name."""

import io
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from doubles import features_of, toy_draw

from app.modules import VLMGRPOModule
from app.modules.plain_data import from_plain, to_device, to_plain
from app.rewards import AccuracyReward
from app.settings import OptimizerSettings, PipelineSettings, SamplingSettings
from app.types import Generation, PromptInputs, RewardOutput, SampledCompletions, Video, VisualSample

K = 4


def through_a_file(value):
    """``value`` as a checkpoint writes and reads it back (``weights_only=True``)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_pending_rollout_round_trips_through_plain_data(new_policy, samples):
    module = VLMGRPOModule(
        new_policy("tiny-qwen2-vl", lora_r=4),
        rewards=[AccuracyReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8),
        optimizer=OptimizerSettings(learning_rate=1e-2),
        pipeline=PipelineSettings(delay=1),
        eval_max_new_tokens=4,
    )
    generation = module.generate_rollout(samples[:2])
    generation.rewards = module.rewards(generation.outputs, [s for s in samples[:2] for _ in range(K)])
    restored = from_plain(through_a_file(to_plain(generation)))
    assert restored.outputs == generation.outputs and restored.samples[0].question == samples[0].question
    assert list(restored.samples[0].images[0].get_flattened_data()) == list(samples[0].images[0].get_flattened_data())
    assert torch.equal(restored.sampled.old_logprobs, generation.sampled.old_logprobs)
    pixels = [g.sampled.prompt_inputs.tensors["pixel_values"] for g in (restored, generation)]
    assert torch.equal(*pixels)
    assert restored.rewards.total.tolist() == generation.rewards.total.tolist()


def test_a_sample_with_a_video_and_prompt_rows_with_videos_round_trip():
    frames = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
    sample = VisualSample(images=[], videos=[Video(frames, fps=1.5)], question="<video> moves?", task="t")
    prompts = PromptInputs({"input_ids": torch.ones(2, 3, dtype=torch.long)}, [0, 0], [0, 0], videos_per_row=[1, 1])
    restored_sample, restored_prompts = from_plain(through_a_file(to_plain([sample, prompts])))
    video = restored_sample.videos[0]
    assert isinstance(video, Video) and video.fps == 1.5 and np.array_equal(video.frames, frames)
    assert restored_prompts.videos_per_row == [1, 1]


def test_a_toy_draw_comes_back_with_its_features_and_moves_to_a_device():
    features = torch.arange(8.0).reshape(4, 2)
    rewards = RewardOutput(torch.ones(4), {"value": torch.ones(4)})
    draw = toy_draw(features, ["1", "2", "3", "4"], rows_per_prompt=2, old_logprobs=torch.zeros(4, 1))
    generation = Generation([VisualSample([], "p", "toy", meta={"n": 1})], draw, version=3, rewards=rewards)
    restored = from_plain(through_a_file(to_plain(generation)))
    assert isinstance(restored, Generation) and isinstance(restored.sampled, SampledCompletions)
    assert restored.version == 3 and restored.samples[0].meta == {"n": 1} and restored.outputs == ["1", "2", "3", "4"]
    assert torch.equal(features_of(restored.sampled), features)
    moved = to_device(restored, torch.device("meta"))
    assert features_of(moved.sampled).device.type == "meta" and moved.rewards.total.device.type == "meta"


def test_a_completion_batch_stored_with_its_old_field_group_size_loads_as_rows_per_prompt():
    batch = toy_draw(torch.zeros(2, 2), ["a", "b"], rows_per_prompt=2).completions
    stored = to_plain(batch)
    fields = stored["fields"]
    fields["group_size"] = fields.pop("rows_per_prompt")  # what a checkpoint written before the rename holds
    restored = from_plain(through_a_file(stored))
    assert restored.rows_per_prompt == 2 and restored.texts == ["a", "b"]


@dataclass
class Unregistered:
    value: int = 0


def test_a_container_the_codec_does_not_know_is_refused_by_name():
    with pytest.raises(TypeError, match="cannot store a Unregistered of a pending rollout in a checkpoint"):
        to_plain({"sampled": Unregistered()})
    with pytest.raises(TypeError, match="non-string keys"):
        to_plain({1: torch.zeros(1)})

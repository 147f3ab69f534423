"""The scorers as a reward: images and videos in the formats a generator produces, in-process and in a pool."""

import numpy as np
import pytest
import torch

from app.rewards import WeightedReward
from app.rewards.vbvr import VBVRScorerReward, to_uint8_frames
from app.types import VisualSample
from app.vbvr import get_task


def sample_for(instance, params):
    spec = {"task": instance.task, "params": params, "config": instance.config}
    return VisualSample(images=[], question=instance.prompt, task=instance.task, meta={"vbvr": spec})


@pytest.fixture(scope="module")
def batch():
    task = get_task("object_counting")
    params = {"image_size": task.image_size, **task.params}
    instances = [task.generate(seed) for seed in range(4)]
    wrong = task.perturbations(instances[0].config, instances[0].solution)["wrong_count"]
    renderings = [instances[0].last_frame, wrong, instances[1].frames, instances[2].last_frame]
    samples = [sample_for(instances[i], params) for i in (0, 0, 1, 2)]
    return renderings, samples


def test_scores_images_and_videos(batch):
    renderings, samples = batch
    scores = VBVRScorerReward().score(renderings, samples)
    assert scores.tolist() == [1.0, 0.0, 1.0, 1.0]


def test_float_tensors_in_channels_first_layout_score_like_uint8(batch):
    renderings, samples = batch
    as_tensors = [torch.from_numpy(np.asarray(r)).float().div(255).movedim(-1, -3) for r in renderings]
    assert VBVRScorerReward().score(as_tensors, samples).tolist() == [1.0, 0.0, 1.0, 1.0]


def test_process_pool_gives_the_same_scores_asynchronously(batch):
    renderings, samples = batch
    reward = VBVRScorerReward(num_workers=2)
    try:
        future = reward.score_async(renderings, samples)
        assert future.result(timeout=60).tolist() == [1.0, 0.0, 1.0, 1.0]
    finally:
        reward.close()


def test_malformed_generations_score_zero_and_are_counted(batch):
    renderings, samples = batch
    reward = VBVRScorerReward()
    scores = reward.score([np.zeros((5, 5)), renderings[0]], samples[:2])
    assert scores.tolist() == [0.0, 1.0] and reward.num_malformed == 1


def test_samples_without_a_task_spec_are_a_clear_error(batch):
    renderings, _ = batch
    with pytest.raises(ValueError, match="meta\\['vbvr'\\]"):
        VBVRScorerReward().score(renderings[:1], [VisualSample([], "q", "t")])


def test_composes_with_other_rewards_and_accumulates_as_a_metric(batch):
    renderings, samples = batch
    reward = VBVRScorerReward(weight=2.0)
    out = WeightedReward([reward])(renderings, samples)
    assert out.total.tolist() == [2.0, 0.0, 2.0, 2.0]
    reward.update(renderings, samples)
    assert reward.compute().item() == pytest.approx(0.75)


def test_to_uint8_frames_names_an_unreadable_shape():
    with pytest.raises(ValueError, match="shape"):
        to_uint8_frames(np.zeros((2, 2, 2, 2, 3), dtype=np.uint8))
    assert to_uint8_frames(np.zeros((4, 4, 3), dtype=np.uint8)).shape == (1, 4, 4, 3)

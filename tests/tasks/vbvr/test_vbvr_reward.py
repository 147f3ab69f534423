"""The scorers as a reward: images and videos in the formats a generator produces, in-process and in a pool."""

import numpy as np
import pytest
import torch

from app.rewards import WeightedReward
from app.tasks.vbvr import get_task
from app.tasks.vbvr.reward import VBVRScorerReward, to_uint8_frames
from app.types import VisualSample


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


def test_renderings_at_another_size_are_scored_at_the_problems_size_and_another_aspect_is_malformed(batch, caplog):
    """A generator at 2x the problem's size draws the same solution; stretching to another aspect would not."""
    renderings, samples = batch
    double = [np.repeat(np.repeat(np.asarray(r), 2, axis=-3), 2, axis=-2) for r in renderings]
    reward = VBVRScorerReward()
    assert reward.score(double, samples).tolist() == [1.0, 0.0, 1.0, 1.0] and reward.num_malformed == 0
    wide = np.repeat(np.asarray(renderings[0]), 2, axis=-2)  # twice as wide
    assert reward.score([wide], samples[:1]).tolist() == [0.0] and reward.num_malformed == 1
    assert "does not have the problem's aspect ratio" in caplog.text


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


DEGENERATE = {
    "0x0 numpy": np.zeros((0, 0, 3), dtype=np.uint8),
    "0x0 tensor": torch.zeros(3, 0, 0),
    "empty tensor": torch.zeros(0),
    "video of no frames (tensor)": torch.zeros(0, 3, 8, 8),
    "video of no frames (numpy)": np.zeros((0, 8, 8, 3), dtype=np.uint8),
}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_degenerate_renderings_score_the_low_end_and_are_counted(batch, caplog, num_workers):
    renderings, samples = batch
    degenerate = list(DEGENERATE.values())
    reward = VBVRScorerReward(num_workers=num_workers)
    try:
        with caplog.at_level("WARNING", logger="app.tasks.vbvr.reward"):
            scores = reward.score([*degenerate, *renderings], [samples[0]] * len(degenerate) + samples)
    finally:
        reward.close()
    assert scores.tolist() == [reward.value_range[0]] * len(degenerate) + [1.0, 0.0, 1.0, 1.0]  # the rest as before
    assert reward.num_malformed == len(degenerate)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == (
        "vbvr reward: completion 0 scored 0.0 (malformed; 1 so far): empty rendering of shape (1, 0, 0, 3) as "
        "[T, H, W, 3]: no frames or no pixels"
    )
    assert len(messages) == len(degenerate)
    for i, message in enumerate(messages):
        assert message.startswith(f"vbvr reward: completion {i} scored 0.0 (malformed; {i + 1} so far): ")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_rendering_the_scorer_cannot_measure_scores_low_instead_of_failing_the_batch(caplog, num_workers):
    task = get_task("shape_matching")
    params = dict(task.params)  # no image_size: the rendering reaches the scorer at its own size
    instance = task.generate(0)
    sample = sample_for(instance, params)
    tiny = np.zeros((3, 7, 3), dtype=np.uint8)  # the scorer compares against a mask of the task's image size
    reward = VBVRScorerReward(num_workers=num_workers)
    try:
        with caplog.at_level("WARNING", logger="app.tasks.vbvr.reward"):
            scores = reward.score([tiny, instance.last_frame], [sample, sample])
    finally:
        reward.close()
    assert scores.tolist() == [0.0, 1.0] and reward.num_malformed == 1
    assert "completion 0 scored 0.0 (malformed; 1 so far): ValueError: operands could not be broadcast" in caplog.text


def test_a_text_completion_is_the_kind_it_does_not_score_and_scores_as_malformed(batch):
    _, samples = batch
    reward = VBVRScorerReward()
    assert "text" not in reward.completion_kinds  # what a reward server reports in /info
    assert reward.score(["a red circle"], samples[:1]).tolist() == [0.0] and reward.num_malformed == 1

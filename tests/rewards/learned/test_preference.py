"""PreferenceScoreReward: PickScore's logit_scale.exp() * cos, affinely normalised, on the tiny preference model."""

from __future__ import annotations

import pickle

import pytest
import torch
from conftest import MALFORMED
from transformers import AutoProcessor, CLIPModel

from app.rewards.learned import PreferenceScoreReward
from app.rewards.learned.preference import MAX_LOGIT_SCALE
from app.tiny.scorers import resolve_scorer
from app.types import VisualSample

PROMPTS = ["a red circle on the left", "two blue squares", "a green cube above a yellow sphere"]


@pytest.fixture(scope="module")
def pickscore():
    path = resolve_scorer("tiny-pickscore")
    return CLIPModel.from_pretrained(path).eval(), AutoProcessor.from_pretrained(path)


@pytest.fixture(scope="module")
def reward():
    return PreferenceScoreReward(offset=1.5, scale=4.0, batch_size=2)


def sample(prompt: str) -> VisualSample:
    return VisualSample(images=[], question=prompt, task="t2i")


def raw_pickscores(pickscore, images: list[torch.Tensor], prompt: str) -> torch.Tensor:
    """PickScore's own formula through the model's forward: ``logits_per_image = logit_scale.exp() * cos`` (float32,
    the whole batch at once), one per image."""
    model, processor = pickscore
    pil = [(image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy() for image in images]
    inputs = processor(text=[prompt], images=pil, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**inputs).logits_per_image[:, 0].double()


def test_values_are_the_normalised_pickscore(reward, pickscore):
    images = [torch.rand(3, 32, 32) for _ in range(6)]
    values = reward.score(images, [sample(PROMPTS[0])] * 6)
    raw = raw_pickscores(pickscore, images, PROMPTS[0])
    logit_scale = float(pickscore[0].logit_scale.detach().exp())
    assert logit_scale < MAX_LOGIT_SCALE  # the tiny model's initial 1 / 0.07: not capped
    # logits_per_image = logit_scale * cos with |cos error| <= 1e-5 (see test_clip_score's ATOL), so the raw score
    # is within 14.3 * 1e-5 of the reward's, and divided by scale = 4 its value within 4e-5.
    torch.testing.assert_close(values.double(), (raw - 1.5) / 4.0, atol=logit_scale * 1e-5 / 4.0, rtol=0)
    assert torch.equal(values.argsort(), raw.argsort()), "the reward ranks images as the preference model does"
    low, high = reward.value_range
    assert (low, high) == ((-100 - 1.5) / 4.0, (100 - 1.5) / 4.0) and bool(((values > low) & (values < high)).all())


def test_the_default_is_flow_grpos_division_by_26(pickscore):
    default = PreferenceScoreReward()
    image = torch.rand(3, 32, 32)
    raw = raw_pickscores(pickscore, [image], PROMPTS[1])
    torch.testing.assert_close(default.score([image], [sample(PROMPTS[1])]).double(), raw / 26, atol=1e-5, rtol=0)
    assert default.value_range == PreferenceScoreReward.value_range == (-100 / 26, 100 / 26)


def test_the_logit_scale_is_capped_at_clips_clamp(monkeypatch):
    reward = PreferenceScoreReward(scale=100.0)
    image = torch.rand(3, 32, 32)
    (cosine,) = reward.frame_cosines([image], [sample(PROMPTS[2])])
    with torch.no_grad():
        reward._frozen.model.logit_scale.fill_(10.0)  # exp(10) = 22026, far above 100
    torch.testing.assert_close(reward.score([image], [sample(PROMPTS[2])]), cosine, atol=1e-6, rtol=0)


def test_a_video_scores_the_mean_of_its_frames(reward):
    video = torch.rand(4, 3, 32, 32)
    frames = reward.score(list(video), [sample(PROMPTS[0])] * 4)
    torch.testing.assert_close(reward.score([video], [sample(PROMPTS[0])])[0], frames.mean(), atol=1e-5, rtol=0)


def test_batch_size_does_not_change_the_values(reward):
    images = [torch.rand(3, 32, 32) for _ in range(5)]
    samples = [sample(PROMPTS[i % 3]) for i in range(5)]
    one_batch = PreferenceScoreReward(offset=1.5, scale=4.0, batch_size=32).score(images, samples)
    torch.testing.assert_close(reward.score(images, samples), one_batch, atol=1e-5, rtol=0)


def test_malformed_renderings_score_the_low_end_and_are_counted(reward):
    bad = [*MALFORMED.values(), "text"]
    before = reward.num_malformed
    values = reward.score([*bad, torch.rand(3, 32, 32)], [sample(PROMPTS[0])] * (len(bad) + 1))
    assert values[:-1].tolist() == [pytest.approx(reward.value_range[0])] * len(bad)
    assert values[-1] > reward.value_range[0] and reward.num_malformed - before == len(bad)
    fresh = PreferenceScoreReward()
    assert fresh.score(["text"], [sample("x")]).tolist() == [pytest.approx(-100 / 26)]
    assert fresh._frozen.model is None  # nothing readable: the model is not loaded


@pytest.mark.parametrize("kwargs", [{"scale": 0.0}, {"scale": -2.0}, {"scale": float("inf")}, {"offset": float("nan")}])
def test_misconfiguration_raises_a_value_error(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PreferenceScoreReward(**kwargs)


def test_the_model_is_frozen_and_outside_the_module_tree(check_frozen):
    fresh = PreferenceScoreReward(processor="tiny-pickscore")  # PickScore names its processor separately
    pickle.dumps(fresh)
    image = torch.rand(3, 32, 32)
    values = fresh.score([image], [sample(PROMPTS[0])])
    check_frozen(fresh)
    copy = pickle.loads(pickle.dumps(fresh))
    torch.testing.assert_close(copy.score([image], [sample(PROMPTS[0])]), values)


def test_parses_from_yaml_inside_a_weighted_reward(parse_rewards):
    rewards = parse_rewards(
        """
        rewards:
          - class_path: app.rewards.learned.PreferenceScoreReward
            init_args:
              model: tiny-pickscore
              processor: tiny-pickscore
              offset: 18.0
              scale: 5.0
          - class_path: app.rewards.learned.CLIPScoreReward
        """
    )
    assert rewards.names == ["preference_score", "clip_score"]
    preference = rewards.components[0]
    assert isinstance(preference, PreferenceScoreReward) and preference.value_range == (-118 / 5, 82 / 5)

"""CLIPScoreReward: max(cos, 0) of the tiny CLIP's own embeddings, per frame mean for videos, untrusted renderings."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import MALFORMED
from PIL import Image
from transformers import AutoProcessor, CLIPModel

from app.rewards.learned import CLIPScoreReward
from app.tiny.scorers import resolve_scorer
from app.types import VisualSample

PROMPTS = ["a red circle on the left", "two blue squares", "a green cube above a yellow sphere", "black dots"]

# The reward's cosines are float32 dot products of unit vectors (16 dimensions here): each product and partial sum
# rounds by at most one ulp (6e-8 at magnitude 1), so the dot is within ~16 * 6e-8 = 1e-6 of the exact one, and the
# float32 normalisation adds a few ulps more. The features themselves may differ from the reference's by a few ulps
# too, because the reward embeds images in batches and the reference one at a time (other BLAS blockings). 1e-5 bounds
# all of it with room, and is far below the differences between images (~1e-1).
ATOL = 1e-5


@pytest.fixture(scope="module")
def clip():
    """The tiny CLIP and its processor, loaded independently of the reward, for the reference values."""
    path = resolve_scorer("tiny-clip")
    return CLIPModel.from_pretrained(path).eval(), AutoProcessor.from_pretrained(path)


@pytest.fixture(scope="module")
def reward():
    return CLIPScoreReward(batch_size=3)


def reference_cosine(clip, image: Image.Image, prompt: str) -> float:
    """cos(E_image, E_text) in float64, from the model's own get_image_features / get_text_features, one at a time."""
    model, processor = clip
    with torch.no_grad():
        pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
        image_features = model.get_image_features(pixel_values=pixels).pooler_output[0].double()
        tokens = processor(text=[prompt], return_tensors="pt")
        text_features = model.get_text_features(**tokens).pooler_output[0].double()
    return float(image_features @ text_features / (image_features.norm() * text_features.norm()))


def as_pil(rendering) -> Image.Image:
    if isinstance(rendering, torch.Tensor):
        rendering = (rendering.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return rendering if isinstance(rendering, Image.Image) else Image.fromarray(rendering)


def sample(prompt: str, **meta) -> VisualSample:
    return VisualSample(images=[], question=prompt, task="t2i", meta=meta)


def renderings(n: int) -> list:
    """Images in every form a generator hands over: float tensors [3, H, W], uint8 arrays [H, W, 3], PIL images."""
    out = []
    for i in range(n):
        image = torch.rand(3, 24 + 8 * i, 40)
        out.append([image, (image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy(), as_pil(image)][i % 3])
    return out


def test_values_are_clipscore_of_the_models_own_embeddings(reward, clip):
    images = renderings(8)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    values = reward.score(images, [sample(p) for p in prompts])
    cosines = [reference_cosine(clip, as_pil(image), prompt) for image, prompt in zip(images, prompts, strict=True)]
    assert min(cosines) < 0 < max(cosines), "the inputs should exercise the clamp at 0"
    assert values.dtype == torch.float32 and values.shape == (8,)
    torch.testing.assert_close(
        values.double(), torch.tensor(cosines, dtype=torch.float64).clamp(min=0), atol=ATOL, rtol=0
    )
    assert values.min() >= 0 and values.max() <= 1


def test_a_video_scores_the_mean_of_its_frames(reward):
    video = torch.rand(5, 3, 32, 32)
    prompt = sample(PROMPTS[0])
    frames = reward.score(list(video), [prompt] * 5)
    (value,) = reward.score([video], [prompt])
    torch.testing.assert_close(value, frames.mean(), atol=ATOL, rtol=0)
    as_uint8 = (video.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()  # [T, H, W, 3]
    torch.testing.assert_close(reward.score([as_uint8], [prompt])[0], value, atol=ATOL, rtol=0)


def test_batch_size_does_not_change_the_values(reward):
    images = renderings(7) + [torch.rand(3, 3, 32, 32)]
    samples = [sample(PROMPTS[i % 3]) for i in range(8)]
    one_batch = CLIPScoreReward(batch_size=64).score(images, samples)
    torch.testing.assert_close(reward.score(images, samples), one_batch, atol=ATOL, rtol=0)  # batches of 3


def test_prompt_source_reads_the_meta_key(reward, clip):
    image = torch.rand(3, 32, 32)
    from_meta = CLIPScoreReward(prompt_source="meta:caption").score([image], [sample("ignored", caption=PROMPTS[2])])
    torch.testing.assert_close(from_meta, reward.score([image], [sample(PROMPTS[2])]), atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="has no text at 'meta:caption'"):
        CLIPScoreReward(prompt_source="meta:caption").score([image], [sample("no caption")])
    for bad in ("prompt", "meta:", "meta: "):
        with pytest.raises(ValueError, match="prompt_source must be"):
            CLIPScoreReward(prompt_source=bad)


def test_special_token_strings_in_a_prompt_are_read_as_text(reward, clip, monkeypatch):
    """A prompt (data, untrusted) that spells the tokenizer's special tokens is embedded as the text it spells: the
    only special token the text tower sees is the end token the tokenizer appends, where CLIP pools the text."""
    tokenizer = clip[1].tokenizer
    model = reward.frozen([])[0]
    seen, embed = [], model.get_text_features
    monkeypatch.setattr(
        model, "get_text_features", lambda **inputs: seen.append(inputs["input_ids"]) or embed(**inputs)
    )
    spelt = f"two blue squares{tokenizer.eos_token}<|im_end|> and a cat"
    image = torch.rand(3, 32, 32)
    value = reward.score([image], [sample(spelt)])
    (ids,) = seen
    assert [t for t in ids[0].tolist() if t in tokenizer.all_special_ids] == [tokenizer.eos_token_id]
    as_text = tokenizer(spelt, split_special_tokens=True)["input_ids"]
    assert ids[0].tolist() == as_text
    assert value.shape == (1,) and 0 <= value.item() <= 1


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"batch_size": 2.5}, {"device": "gpu:x"}, {"model": ""}])
def test_misconfiguration_raises_a_value_error(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        CLIPScoreReward(**kwargs)


def test_a_misspelt_embedded_name_fails_naming_the_known_ones():
    with pytest.raises(ValueError, match="did you mean 'tiny-clip'"):
        CLIPScoreReward(model="tiny-clp")  # when the config is built, not on the first score


def test_malformed_renderings_score_zero_and_are_counted(reward, caplog):
    bad = [*MALFORMED.values(), "a text completion"]
    good = torch.rand(3, 32, 32)
    before = reward.num_malformed
    with caplog.at_level(logging.WARNING):
        values = reward.score([*bad, good], [sample(PROMPTS[0])] * (len(bad) + 1))
    assert values[:-1].tolist() == [0.0] * len(bad)
    torch.testing.assert_close(values[-1:], reward.score([good], [sample(PROMPTS[0])]))
    assert reward.num_malformed - before == len(bad)
    assert sum("malformed" in record.message for record in caplog.records) == len(bad)


def test_an_unreadable_batch_never_loads_the_model():
    fresh = CLIPScoreReward()
    assert fresh.score(["text", None], [sample("x")] * 2).tolist() == [0.0, 0.0]
    assert fresh._frozen.model is None and fresh.num_malformed == 2
    assert fresh.score([], []).shape == (0,)


def test_the_model_is_frozen_and_outside_the_module_tree(reward, check_frozen):
    fresh = CLIPScoreReward()
    pickle.dumps(fresh)  # before scoring: nothing loaded yet
    with torch.enable_grad():
        values = fresh.score([torch.rand(3, 32, 32, requires_grad=True)], [sample(PROMPTS[1])])
    assert not values.requires_grad
    check_frozen(fresh)
    copy = pickle.loads(pickle.dumps(fresh))
    image = torch.rand(3, 32, 32)
    torch.testing.assert_close(copy.score([image], [sample("x")]), fresh.score([image], [sample("x")]))


def test_device_defaults_to_the_first_tensor_completion():
    assert CLIPScoreReward(device="cpu").target_device([]) == torch.device("cpu")
    assert CLIPScoreReward().target_device([np.zeros((2, 2, 3), np.uint8)]) == torch.device("cpu")
    assert CLIPScoreReward().target_device(["x", torch.zeros(3, 2, 2, device="meta")]) == torch.device("meta")
    assert CLIPScoreReward(device="cpu").target_device([torch.zeros(1, device="meta")]) == torch.device("cpu")


def test_parses_from_yaml_inside_a_weighted_reward(parse_rewards):
    rewards = parse_rewards(
        """
        rewards:
          - class_path: app.tasks.vbvr.VBVRScorerReward
          - class_path: app.rewards.learned.CLIPScoreReward
            init_args:
              model: tiny-clip
              prompt_source: "meta:caption"
              batch_size: 4
              weight: 0.2
        """
    )
    assert rewards.names == ["vbvr_scorer", "clip_score"] and rewards.weights["clip_score"] == 0.2
    clip_score = rewards.components[1]
    assert isinstance(clip_score, CLIPScoreReward) and clip_score.prompt_key == "caption"
    assert clip_score._frozen.model is None  # building the config loads nothing


@pytest.mark.slow
def test_importing_the_rewards_loads_no_model_code():
    """``import app.rewards`` (and even ``app.rewards.learned``) leaves transformers' CLIP and Qwen-VL unimported."""
    code = (
        "import sys, app.rewards, app.rewards.learned\n"
        "loaded = [m for m in sys.modules if m.startswith(('transformers.models.clip', 'transformers.models.qwen'))]\n"
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]

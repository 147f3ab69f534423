"""``VLMPolicy(static_cache=True)``: decoding into a fixed-size KV cache (what lets transformers compile the decoding
step on CUDA) draws the same completions as the growing cache, with and without the shared prefix."""

import pytest
import torch
from transformers import StaticCache

from app.models.shared_prefix import static_cache
from app.settings import SamplingSettings

K = 2


def rollout(policy, prompts, *, static: bool, shared: bool, seed: int, greedy: bool, new_tokens: int = 10):
    policy.static_cache, policy.shared_prefix = static, shared
    torch.manual_seed(seed)
    try:
        return policy.generate(prompts, SamplingSettings(max_new_tokens=new_tokens), greedy, rows_per_prompt=K)
    finally:
        policy.static_cache, policy.shared_prefix = False, True


@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared-prefix", "every-row"])
def test_a_static_cache_draws_the_same_completions_as_the_growing_one(new_policy, new_samples, model, shared):
    policy = new_policy(model, lora_r=4)
    prompts = policy.encode_prompts(new_samples(2, seed=5), rows_per_prompt=K)
    for greedy in (True, False):
        growing = rollout(policy, prompts, static=False, shared=shared, seed=11, greedy=greedy)
        static = rollout(policy, prompts, static=True, shared=shared, seed=11, greedy=greedy)
        assert growing.completion_ids.shape[1] > 1
        assert torch.equal(static.completion_ids, growing.completion_ids), (model, greedy)
        assert torch.equal(static.completion_mask, growing.completion_mask)
        assert static.texts == growing.texts


def test_generate_hands_transformers_a_static_cache_of_prompt_plus_new_tokens(new_policy, new_samples, monkeypatch):
    policy = new_policy("tiny-qwen2-vl", lora_r=None)
    prompts = policy.encode_prompts(new_samples(1, seed=0), rows_per_prompt=K)
    seen = []
    generate = policy.model.generate
    monkeypatch.setattr(policy.model, "generate", lambda **kw: seen.append(kw["cache"]) or generate(**kw))

    rollout(policy, prompts, static=True, shared=True, seed=0, greedy=True, new_tokens=5)

    (cache,) = seen
    assert isinstance(cache, StaticCache)
    prompt_length = prompts.tensors["input_ids"].shape[1]
    assert cache.get_max_length() == prompt_length + 5
    # the shared prefix (the prompt without its last token) plus the generated tokens but the last, for K rows
    assert cache.layers[0].keys.shape[0] == K
    assert int(cache.get_seq_length()) == prompt_length - 1 + 5


def test_static_cache_copies_the_filled_cache_and_leaves_room_after_it(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=None)
    prompts = policy.encode_prompts(new_samples(1, seed=0))
    with torch.no_grad():
        filled = policy.hf_model(**prompts.tensors, use_cache=True).past_key_values
    length = prompts.tensors["input_ids"].shape[1]

    cache = static_cache(policy.hf_model.config, length + 4, filled)

    assert int(cache.get_seq_length()) == length
    for layer, source in zip(cache.layers, filled.layers, strict=True):
        assert torch.equal(layer.keys[:, :, :length], source.keys)
        assert torch.equal(layer.values[:, :, :length], source.values)
        assert not layer.keys[:, :, length:].any()  # the room for new tokens is still empty
    empty = static_cache(policy.hf_model.config, 7)
    assert int(empty.get_seq_length()) == 0 and empty.get_max_length() == 7

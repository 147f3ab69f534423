"""The VLM sampler (app.sampling.vlm_rollout): its micro-batch size is checked when it is built, and stored completions
are re-scored in length-grouped micro-batches re-padded to their own longest prompt and completion. Its draw and the
loss path on a tiny policy are tested through the module in tests/modules/test_vlm_grpo*.py."""

import pytest
import torch
from PIL import Image
from tolerances import TINY_VLM_LOGIT_L1, TINY_VLM_VOCAB, logprob_atol

from app.sampling import VLMSampler
from app.settings import SamplingSettings
from app.types import CompletionBatch, SampledCompletions, VisualSample


def image(width: int, height: int) -> Image.Image:
    return Image.new("RGB", (width, height), (200, 40, 40))


@pytest.mark.parametrize("micro_batch_size", [0, -1])
def test_a_micro_batch_size_below_one_is_refused_with_a_message_naming_it(micro_batch_size):
    with pytest.raises(ValueError, match=rf"^micro_batch_size must be >= 1 or null, got {micro_batch_size}$"):
        VLMSampler(None, SamplingSettings(), micro_batch_size)


@pytest.mark.parametrize("micro_batch_size", [1, None])
def test_a_micro_batch_size_of_one_row_or_none_is_taken(micro_batch_size):
    settings = SamplingSettings(group_size=2)
    sampler = VLMSampler(None, settings, micro_batch_size)
    assert sampler.settings is settings and sampler.micro_batch_size == micro_batch_size


# ------------------------------------------------------------------------------------ re-padded micro-batches
def test_a_micro_batch_is_re_padded_to_its_own_longest_prompt_and_completion(tiny_policy):
    """Rows 0 and 2 taken together (one image each, shorter prompts than row 1's two images; completions of 2 and 3
    tokens of 6): their prompts lose the left padding they share, their completions the columns after the longest;
    the log-probs are the full-width ones at the rollout's length."""
    samples = [
        VisualSample(images=[image(64, 64)], question="Left?", task="t", answer="yes"),
        VisualSample(images=[image(96, 64), image(64, 120)], question="Which is wider?", task="t", answer="1"),
        VisualSample(images=[image(80, 80)], question="Count.", task="t", answer="1"),
    ]
    prompts = tiny_policy.encode_prompts(samples)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    ids = torch.randint(10, 900, mask.shape, generator=torch.Generator().manual_seed(0)).masked_fill(mask == 0, 0)
    batch = CompletionBatch(ids, mask, [""] * 3, torch.zeros(3, dtype=torch.bool), 1)
    sampled = SampledCompletions(prompts, batch, old_logprobs=None, ref_logprobs=None)
    sampler = VLMSampler(tiny_policy, SamplingSettings(group_size=1, temperature=0.9), micro_batch_size=2)
    assert sampler.micro_batches(sampled) == [[0], [1, 2]]  # longest first: the two-image row, then the 80-px one
    micro = sampler.micro_batch(sampled, [0, 2])
    attention = prompts.tensors["attention_mask"]
    assert micro.prompt_inputs.tensors["input_ids"].shape[1] == int(attention[[0, 2]].sum(dim=1).max())
    assert micro.prompt_inputs.tensors["input_ids"].shape[1] < attention.shape[1]
    assert torch.equal(micro.completion_ids, ids[[0, 2], :3]) and micro.width == 3 and micro.length == 6
    assert torch.equal(micro.cut(mask), mask[[0, 2], :3]) and micro.cut(None) is None
    assert micro.pad(torch.ones(2, 3)).tolist() == [[1, 1, 1, 0, 0, 0]] * 2
    with torch.no_grad():
        full = tiny_policy.sequence_logprobs(prompts, ids, mask, 0.9)[[0, 2]]
        got = sampler.logprobs(sampled, [0, 2])
    # the same tokens; the attention sums run over fewer (padding) positions, the other sums as before
    width = attention.shape[1] + 6
    atol = logprob_atol(
        TINY_VLM_VOCAB, sums=[64, 64, 16, width, width, 64, 64, 128] * 2 + [64, 64], logit_l1=TINY_VLM_LOGIT_L1 / 0.9
    )
    m = mask[[0, 2]].bool()
    assert got.shape == (2, 6)
    torch.testing.assert_close(got[m], full[m], atol=atol, rtol=0)


def test_trimming_a_prompt_without_shared_padding_keeps_it(tiny_policy, samples):
    prompts = tiny_policy.encode_prompts(samples[:2])  # same length: no padding column at all
    assert prompts.trimmed() is prompts

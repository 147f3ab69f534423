"""Padding-free (packed) log-prob forwards on the three Qwen-VL families: the rows' real tokens in one row with
per-sequence text positions and each row's own 3-D rotary positions give the padded forward's log-probs and
gradients (up to the rounding of sums taken in another order), with the language model called once on one row.

Tolerances. The packed and the padded forward compute the same sums over the same terms, in other orders where the
batch layout changes them: per layer of the tiny language models (2 layers, hidden 64, MLP 128, heads of 16), the
norm (64 terms), q / k / v and o projections (64), the attention scores (16), the softmax's sum and the weighted sum
over the positions (at most the padded row width S), the MLP (64, 128); then the final norm and the head (64 each).
:func:`tolerances.logprob_atol` carries those to the log-probs. A gradient element sums products over the N x S
positions, each carried back through those sums: two orders are within ``2 gamma_n``, ``n = N * S * 128``, of each other
in norm (under 1e-2 here; a position of another sequence attended to moves log-probs by 1e-2 and gradients by far more).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from PIL import Image
from tolerances import TINY_VLM_LOGIT_L1, TINY_VLM_VOCAB, logprob_atol, sum_error_bound

from app.models.packing import packs
from app.types import VisualSample

FAMILIES = ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"]
K = 2


def image(width: int, height: int, color=(200, 40, 40)) -> Image.Image:
    return Image.new("RGB", (width, height), color)


MIXED = [
    VisualSample(images=[image(64, 64)], question="Is the red dot left of the blue dot?", task="t", answer="yes"),
    VisualSample(
        images=[image(96, 64, (30, 60, 220)), image(64, 120)], question="Which is wider?", task="t", answer="1"
    ),
    VisualSample(images=[image(80, 80, (40, 170, 60))], question="Count.", task="t", answer="1"),
]
"""Rows of unequal prompt lengths and patch counts: one image, two images of other sizes, one image again."""
TEXT_ONLY = [
    VisualSample(images=[], question="Say yes.", task="t", answer="yes"),
    VisualSample(images=[], question="Is a long question about nothing at all answered?", task="t", answer="no"),
]


def completions(policy, prompts, lengths):
    """Fixed completion tokens of the given lengths (right-padded), for ``len(prompts)`` rows."""
    width = max(lengths)
    tokens = torch.randint(10, 900, (len(prompts), width), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return tokens.masked_fill(mask == 0, policy.pad_token_id), mask


def logprobs_and_grads(policy, prompts, ids, mask, padding_free: bool):
    policy.padding_free = padding_free
    policy.model.zero_grad(set_to_none=True)
    logprobs = policy.sequence_logprobs(prompts, ids, mask, 0.8)
    (logprobs * mask).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logprobs.detach(), grads


def language_model_calls(policy):
    """``(batch, position rows)`` of each call of the language model, and the hook's handle."""
    calls = []

    def record(module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        positions = kwargs.get("position_ids")
        calls.append((embeds.shape[0], None if positions is None else positions.shape[0]))

    language_model = policy.hf_model.model.language_model
    return calls, language_model.register_forward_pre_hook(record, with_kwargs=True)


def assert_same(policy, prompts, ids, mask, padded_rows: list[int]):
    """``padded_rows``: the rows of each language-model call of the padded forward."""
    calls, handle = language_model_calls(policy)
    try:
        padded, padded_grads = logprobs_and_grads(policy, prompts, ids, mask, padding_free=False)
        packed, packed_grads = logprobs_and_grads(policy, prompts, ids, mask, padding_free=True)
    finally:
        handle.remove()
        policy.padding_free = None
    assert calls[-1] == (1, 4), "one packed row, with text positions in front of the 3-D ones"
    assert [rows for rows, _ in calls[:-1]] == padded_rows
    width = prompts.tensors["input_ids"].shape[1] + ids.shape[1]
    sums = [64, 64, 16, width, width, 64, 64, 128] * 2 + [64, 64]
    atol = logprob_atol(TINY_VLM_VOCAB, sums=sums, logit_l1=TINY_VLM_LOGIT_L1 / 0.8)
    m = mask.bool()
    torch.testing.assert_close(packed[m], padded[m], atol=atol, rtol=0)
    assert packed_grads.keys() == padded_grads.keys() and padded_grads
    rtol = 2 * sum_error_bound(len(prompts) * width * 128)
    for name, want in padded_grads.items():
        difference = float((packed_grads[name] - want).norm())
        assert difference <= rtol * float(want.norm()) + 1e-12, name


@pytest.mark.parametrize("shared_prefix", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_rows_give_the_padded_log_probs_and_gradients(family, shared_prefix, new_policy):
    torch.manual_seed(0)
    policy = new_policy(family, lora_r=4, shared_prefix=shared_prefix)
    with torch.no_grad():  # B away from 0, so that every adapter gets a gradient
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    prompts = policy.encode_prompts(MIXED, rows_per_prompt=K)  # rows 2b, 2b + 1 from prompt b
    ids, mask = completions(policy, prompts, [7, 2, 5, 1, 9, 3])
    # with shared prefixes, each prompt's tokens once, then every row's completion tokens
    assert_same(policy, prompts, ids, mask, padded_rows=[3, 6] if shared_prefix else [6])


def test_packed_text_only_prompts_use_the_text_positions(new_policy):
    policy = new_policy("tiny-qwen2.5-vl", lora_r=4)
    prompts = policy.encode_prompts(TEXT_ONLY, rows_per_prompt=1)
    assert "pixel_values" not in prompts.tensors
    ids, mask = completions(policy, prompts, [4, 6])
    assert_same(policy, prompts, ids, mask, padded_rows=[2])


def test_packing_defaults_to_variable_length_attention_only(tiny_policy):
    config = tiny_policy.hf_model.config
    assert config._attn_implementation in ("sdpa", "eager")
    assert not packs(tiny_policy.hf_model, None)
    assert packs(tiny_policy.hf_model, True) and not packs(tiny_policy.hf_model, False)

    class FlashConfig:
        _attn_implementation = "flash_attention_2"

    class FlashModel:
        config = FlashConfig()

    assert packs(FlashModel(), None) and not packs(FlashModel(), False)


HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_FLASH_ATTN and torch.cuda.is_available()), reason="needs flash-attn and CUDA")
def test_packed_flash_attention_matches_padded_sdpa_on_cuda():
    """Under flash-attention 2 the default packs (variable-length attention); its log-probs are the padded sdpa ones.
    bf16 weights: the two kernels round differently at bf16's 2^-8, which the log-softmax carries at most once per
    layer's sums; 5e-2 is far under what attention across sequences moves (1e-1 and more, as on CPU)."""
    from app.models import VLMPolicy

    torch.manual_seed(0)
    flash = VLMPolicy("tiny-qwen2.5-vl", dtype="bfloat16", attn_implementation="flash_attention_2").to("cuda")
    assert packs(flash.hf_model, flash.padding_free)
    sdpa = VLMPolicy("tiny-qwen2.5-vl", dtype="bfloat16", attn_implementation="sdpa").to("cuda")
    sdpa.load_state_dict(flash.state_dict())
    prompts = flash.encode_prompts(MIXED, rows_per_prompt=K)
    ids, mask = completions(flash, prompts, [7, 2, 5, 1, 9, 3])
    ids, mask = ids.cuda(), mask.cuda()
    with torch.no_grad():
        packed = flash.sequence_logprobs(prompts, ids, mask)
        padded = sdpa.sequence_logprobs(sdpa.encode_prompts(MIXED, rows_per_prompt=K), ids, mask)
    m = mask.bool()
    torch.testing.assert_close(packed[m], padded[m], atol=5e-2, rtol=0)

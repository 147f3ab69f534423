"""Video rows through the VLM policy on the three tiny Qwen-VL families: the processor's video path, rows that keep
their own videos when taken, repeated and sliced, generation, log-probs that agree across the per-row, shared-prefix
and packed forwards, the videos' time reaching the models that use it, and a GRPO step on video rows.

Tolerance of the log-prob comparisons. The three forwards compute the same sums over the same terms, in other orders
where the batch layout changes them. The vision tower runs on every row's videos or on each prompt's once (a batch of
other size): the patch embedding's sums of at most 3 x 2 x 16^2 = 1536 terms, then per block (2 blocks) and in the
mergers sums of at most 128 terms (norms, projections, attention over at most 64 patches of a frame pair): ``[1536] +
[128] * 24`` as in test_shared_prefix.py. Then per layer of the language model (2 layers, hidden 64, MLP 128, heads of
16) its two norms and four projections (64 terms each), the MLP (64, 64, 128), the attention scores (16) and the
softmax's sum and weighted sum over at most the P + L positions; then the final norm (64).
:func:`tolerances.logprob_atol` carries those sums' rounding to the log-probs of the 1024-token vocabulary.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tolerances import TINY_VLM_LOGIT_L1, TINY_VLM_VOCAB, logprob_atol
from torch.utils.data import DataLoader

from app.models.shared_prefix import position_inputs, repeat_rows, take_rows
from app.models.vlm import prompt_content
from app.modules import VLMGRPOModule
from app.rewards import RewardComponent
from app.settings import GRPOSettings, OptimizerSettings, SamplingSettings
from app.types import VIDEO_INPUTS, Video, VisualSample

FAMILIES = ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"]
K = 2


def moving_dot(frames: int, height: int = 56, width: int = 84, fps: float = 2.0, color=(220, 30, 30)) -> Video:
    """A dot crossing a grey frame from left to right, one step per frame."""
    video = np.full((frames, height, width, 3), 200, dtype=np.uint8)
    for i in range(frames):
        x = 4 + i * (width - 16) // max(frames - 1, 1)
        video[i, height // 2 - 6 : height // 2 + 6, x : x + 12] = color
    return Video(video, fps=fps)


def image(width: int, height: int, color=(40, 170, 60)) -> Image.Image:
    return Image.new("RGB", (width, height), color)


MIXED = [
    VisualSample(images=[], videos=[moving_dot(4)], question="Which way does the dot move?", task="t", answer="right"),
    VisualSample(
        images=[image(64, 64)],
        videos=[moving_dot(2, 56, 56, color=(30, 60, 220))],
        question="In <video> and <image>, which is blue?",
        task="t",
        answer="video",
    ),
    VisualSample(images=[image(80, 64, (200, 40, 40))], question="Count the shapes.", task="t", answer="1"),
]
"""A video row, a row with a video and an image placed by placeholders, and an image row: unequal lengths and
patch counts of both kinds in one batch."""


def completions(policy, rows: int, lengths: list[int]):
    """Fixed completion tokens of the given lengths (right-padded)."""
    width = max(lengths)
    tokens = torch.randint(10, 900, (rows, width), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return tokens.masked_fill(mask == 0, policy.pad_token_id), mask


def language_model_rows(policy):
    """The rows of each call of the language model, and the hook's handle."""
    calls = []
    language_model = policy.hf_model.model.language_model
    hook = language_model.register_forward_pre_hook(
        lambda m, args, kw: calls.append(kw["inputs_embeds"].shape[0]), with_kwargs=True
    )
    return calls, hook


def logprobs(policy, prompts, ids, mask, shared: bool, packed: bool) -> torch.Tensor:
    policy.shared_prefix, policy.padding_free = shared, packed
    try:
        with torch.no_grad():
            return policy.sequence_logprobs(prompts, ids, mask, 0.8)
    finally:
        policy.shared_prefix, policy.padding_free = True, None


# ---------------------------------------------------------------------------------------------------- prompts
def test_prompt_content_places_videos_and_images_where_the_placeholders_are():
    assert prompt_content("In <video> and <image>, which?", 1, 1) == [
        {"type": "text", "text": "In "},
        {"type": "video"},
        {"type": "text", "text": " and "},
        {"type": "image"},
        {"type": "text", "text": ", which?"},
    ]
    assert prompt_content("Which?", 1, 2) == [
        {"type": "image"},
        {"type": "video"},
        {"type": "video"},
        {"type": "text", "text": "Which?"},
    ]
    with pytest.raises(ValueError, match=r"1 <image> and 0 <video> placeholders for 1 images and 1 videos"):
        prompt_content("<image> then?", 1, 1)


def test_video_requires_uint8_rgb_frames_and_a_positive_rate():
    with pytest.raises(ValueError, match=r"uint8 array \[F, H, W, 3\]"):
        Video(np.zeros((2, 8, 8, 3), dtype=np.float32), fps=2.0)
    with pytest.raises(ValueError, match=r"\[F >= 1, H, W, 3\], got \(0, 8, 8, 3\)"):
        Video(np.zeros((0, 8, 8, 3), dtype=np.uint8), fps=2.0)
    with pytest.raises(ValueError, match="fps must be > 0"):
        Video(np.zeros((2, 8, 8, 3), dtype=np.uint8), fps=0.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_encode_prompts_gives_each_row_its_own_videos_through_take_select_and_repeat(family, new_policy):
    policy = new_policy(family)
    prompts = policy.encode_prompts(MIXED, rows_per_prompt=K)
    t = prompts.tensors
    assert prompts.videos_per_row == [1] * K + [1] * K + [0] * K
    assert prompts.images_per_row == [0] * K + [1] * K + [1] * K
    assert t["video_grid_thw"].shape == (2 * K, 3)
    assert t["pixel_values_videos"].shape[0] == int(t["video_grid_thw"].prod(dim=1).sum())
    assert t["video_grid_thw"][0, 0] == 2 and t["video_grid_thw"][K, 0] == 1  # 4 and 2 frames, temporal patch 2
    if family == "tiny-qwen2.5-vl":  # seconds per temporal patch: 2 frames at 2 fps
        assert t["second_per_grid_ts"].tolist() == [1.0] * (2 * K)
    video_token = policy.hf_model.config.video_token_id
    tokens_per_row = (t["input_ids"] == video_token).sum(dim=1)  # merge 2 x 2: a quarter of the patches
    assert tokens_per_row.tolist() == [int(t["video_grid_thw"][r].prod()) // 4 for r in (0, 0, K, K)] + [0] * K
    picked = take_rows(prompts, [2 * K, K, 0])  # an image row, the mixed row, the video row
    assert picked.videos_per_row == [0, 1, 1]
    for row, source in enumerate([2 * K, K, 0]):
        got, want = picked.select(slice(row, row + 1)), prompts.select(slice(source, source + 1))
        for key in VIDEO_INPUTS.keys:
            if key in want.tensors:
                assert torch.equal(got.tensors[key], want.tensors[key]), (row, key)
    assert repeat_rows(picked, 2).videos_per_row == [0, 0, 1, 1, 1, 1]
    images_only = take_rows(prompts, [2 * K]), prompts.select(slice(2 * K, 3 * K))  # nothing for the video tower
    assert all(not set(VIDEO_INPUTS.keys) & set(rows.tensors) for rows in images_only)
    assert picked.trimmed().videos_per_row == [0, 1, 1]


@pytest.mark.parametrize("family", FAMILIES)
def test_video_rows_generate_the_same_completions_with_and_without_the_shared_prefix(family, new_policy):
    policy = new_policy(family)
    prompts = policy.encode_prompts(MIXED, rows_per_prompt=K)
    drawn = []
    for shared in (True, False):
        policy.shared_prefix = shared
        torch.manual_seed(3)
        drawn.append(policy.generate(prompts, SamplingSettings(max_new_tokens=10), rows_per_prompt=K))
    policy.shared_prefix = True
    assert torch.equal(drawn[0].completion_ids, drawn[1].completion_ids)
    generated = drawn[0].completion_ids[drawn[0].completion_mask.bool()]
    assert generated.numel() >= len(prompts)
    assert not torch.isin(generated, torch.tensor(policy.suppressed_token_ids)).any(), "never a vision token"
    video_pad = policy.processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert video_pad in policy.suppressed_token_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_video_log_probs_agree_across_the_per_row_shared_prefix_and_packed_forwards(family, new_policy):
    policy = new_policy(family)
    prompts = policy.encode_prompts(MIXED, rows_per_prompt=K)
    ids, mask = completions(policy, len(prompts), [7, 2, 5, 1, 9, 3])
    calls, hook = language_model_rows(policy)
    try:
        plain = logprobs(policy, prompts, ids, mask, shared=False, packed=False)
        shared = logprobs(policy, prompts, ids, mask, shared=True, packed=False)
        packed = logprobs(policy, prompts, ids, mask, shared=False, packed=True)
        shared_packed = logprobs(policy, prompts, ids, mask, shared=True, packed=True)
    finally:
        hook.remove()
    n = len(prompts)
    # per row; each prompt once, then the completions; one packed row (twice: per row, and with shared features)
    assert calls == [n, n // K, n, 1, 1]
    config = policy.hf_model.config.text_config
    width, head = config.hidden_size, config.hidden_size // config.num_attention_heads
    positions = prompts.tensors["input_ids"].shape[1] + ids.shape[1]
    layer = [width] * 8 + [config.intermediate_size, head, positions, positions]
    sums = [1536] + [128] * 24 + layer * config.num_hidden_layers + [width]  # see the module docstring
    atol = logprob_atol(TINY_VLM_VOCAB, sums=sums, logit_l1=TINY_VLM_LOGIT_L1 / 0.8)
    m = mask.bool()
    for other in (shared, packed, shared_packed):
        torch.testing.assert_close(other[m], plain[m], atol=atol, rtol=0)


def with_video(sample: VisualSample, video: Video) -> VisualSample:
    return VisualSample(images=sample.images, videos=[video], question=sample.question, task=sample.task)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_frames_and_for_qwen2_5_and_qwen3_the_rate_reach_the_model(family, new_policy):
    """Other frames change a video row's log-probs. Another frame rate changes Qwen2.5-VL's time positions (a temporal
    patch of 2 frames at ``fps`` is ``tokens_per_second * 2 / fps`` positions) and Qwen3-VL's written timestamps, so
    their log-probs; Qwen2-VL reads no time, its log-probs stay bit-equal."""
    policy = new_policy(family)
    base = MIXED[0]
    reversed_clip = Video(base.videos[0].frames[::-1].copy(), fps=2.0)
    slower = Video(base.videos[0].frames, fps=1.0)
    rows = [base, with_video(base, reversed_clip), with_video(base, slower)]
    prompts = policy.encode_prompts(rows)
    ids, mask = (t.expand(len(rows), -1) for t in completions(policy, 1, [6]))  # the same completion in each row
    got = logprobs(policy, prompts, ids, mask, shared=False, packed=False)
    assert (got[0] - got[1]).abs().max() > 1e-4
    time_moves = float((got[0] - got[2]).abs().max())
    t = prompts.tensors
    if family == "tiny-qwen2-vl":
        assert time_moves == 0
    elif family == "tiny-qwen2.5-vl":
        positions = policy.hf_model.model.compute_3d_position_ids(**position_inputs(t))  # [3, rows, P]
        video = t["input_ids"] == policy.hf_model.config.video_token_id
        per_second = policy.hf_model.config.vision_config.tokens_per_second
        steps = [int(positions[0, row][video[row]].unique().diff().item()) for row in (0, 2)]
        assert steps == [per_second * 2 // 2, per_second * 2 // 1] and time_moves > 0
    else:
        text = policy.processor.tokenizer.batch_decode(t["input_ids"][[0, 2]])
        assert "<0.2 seconds>" in text[0] and "<1.2 seconds>" in text[0]  # frame pairs at (0 + 0.5) / 2, (1 + 1.5) / 2
        assert "<0.5 seconds>" in text[1] and "<2.5 seconds>" in text[1]
        assert time_moves > 1e-4


class LengthReward(RewardComponent):
    """Completion length / 32: it differs within a group, so advantages are non-zero."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor([len(c) / 32 for c in completions])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_grpo_step_on_video_and_image_rows_moves_every_lora_weight(family, new_policy, fit, params_snapshot):
    torch.manual_seed(0)
    policy = new_policy(family, lora_r=4)
    module = VLMGRPOModule(
        policy,
        rewards=[LengthReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=6),
        grpo=GRPOSettings(micro_batch_size=2),
        optimizer=OptimizerSettings(learning_rate=1e-2),
    )
    before = params_snapshot(policy.model)
    trainer, _ = fit(module, DataLoader(MIXED, batch_size=3, collate_fn=list), max_steps=1)
    after = params_snapshot(policy.model)
    assert trainer.global_step == 1
    lora = {name for name in before if "lora_" in name}
    # LoRA B starts at zero, so a first step moves B everywhere; A only gets a gradient once B is non-zero
    assert lora and not [n for n in lora if "lora_B" in n and torch.equal(before[n], after[n])]
    assert not [n for n in before if n not in lora and not torch.equal(before[n], after[n])]

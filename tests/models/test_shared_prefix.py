"""Shared-prefix rollouts: the prompt is encoded and prefilled once per group and the KV cache expanded to K rows; the
completions are the same, token for token, as with one prefill per row for the same seed. The training forward encodes
each prompt's images and finds its positions once too, and runs every layer on each prompt once, with the same log-probs
and gradients."""

import pytest
import torch
from PIL import Image
from tolerances import TINY_VLM_LOGIT_L1, TINY_VLM_VOCAB, logprob_atol, sum_error_bound

from app.models.shared_prefix import distinct_rows, group_heads, repeat_rows, shared_prompt_features, take_rows
from app.settings import SamplingSettings
from app.types import PromptInputs, VisualSample

K = 3


def image(width: int, height: int, color) -> Image.Image:
    img = Image.new("RGB", (width, height), (230, 230, 230))
    img.paste(color, (width // 4, height // 4, width // 2, height // 2))
    return img


@pytest.fixture(scope="module")
def samples():
    """Rows of unequal lengths and image counts: one image, two images of different sizes, one image again."""
    return [
        VisualSample(images=[image(64, 64, (220, 30, 30))], question="Is the dot red?", task="t", answer="yes"),
        VisualSample(
            images=[image(96, 64, (30, 60, 220)), image(64, 120, (40, 170, 60))],
            question="Which image is wider, the first or the second one?",
            task="t",
            answer="first",
        ),
        VisualSample(images=[image(80, 80, (40, 170, 60))], question="Count.", task="t", answer="1"),
    ]


def rollout(policy, prompts, shared: bool, seed: int, greedy: bool = False, max_new_tokens: int = 12):
    policy.shared_prefix = shared
    torch.manual_seed(seed)
    try:
        return policy.generate(prompts, SamplingSettings(max_new_tokens=max_new_tokens), greedy, rows_per_prompt=K)
    finally:
        policy.shared_prefix = True


def count_vision_images(policy):
    """A forward hook on the vision tower that records how many images each call encodes."""
    calls = []
    visual = policy.hf_model.model.visual
    return calls, visual.register_forward_hook(
        lambda m, args, kw, out: calls.append(kw["grid_thw"].shape[0]), with_kwargs=True
    )


# -------------------------------------------------------------------------------------------------- prompt rows
def test_encode_prompts_runs_the_processor_once_and_equals_the_processor_on_repeated_rows(tiny_policy, samples):
    prompts = tiny_policy.encode_prompts(samples, rows_per_prompt=K)
    texts = [tiny_policy.prompt_text(s) for s in samples for _ in range(K)]
    images = [list(s.images) for s in samples for _ in range(K)]
    expected = tiny_policy.processor(text=texts, images=images, return_tensors="pt", padding=True)
    assert set(prompts.tensors) == set(expected)
    for key, value in expected.items():
        assert torch.equal(prompts.tensors[key], value), key
    assert prompts.images_per_row == [1] * K + [2] * K + [1] * K


def test_take_rows_keeps_each_rows_own_image_patches(tiny_policy, samples):
    prompts = tiny_policy.encode_prompts(samples)
    picked = take_rows(prompts, [2, 1, 1])
    assert picked.images_per_row == [1, 2, 2]
    assert torch.equal(picked.tensors["input_ids"], prompts.tensors["input_ids"][[2, 1, 1]])
    for row, source in enumerate([2, 1, 1]):
        assert torch.equal(
            picked.select(slice(row, row + 1)).tensors["pixel_values"],
            prompts.select(slice(source, source + 1)).tensors["pixel_values"],
        )
    assert torch.equal(repeat_rows(prompts, 1).tensors["pixel_values"], prompts.tensors["pixel_values"])
    none = take_rows(prompts, [])  # no rows: empty per-token tensors, and no images (nothing for the vision tower)
    assert none.images_per_row == [] and none.tensors["input_ids"].shape == (0, prompts.tensors["input_ids"].shape[1])
    assert "pixel_values" not in none.tensors and "image_grid_thw" not in none.tensors


def test_group_heads_only_when_every_group_is_identical(tiny_policy, samples):
    repeated = tiny_policy.encode_prompts(samples, rows_per_prompt=K)
    heads = group_heads(repeated, K)
    assert heads is not None and len(heads) == 3
    assert torch.equal(heads.tensors["pixel_values"], tiny_policy.encode_prompts(samples).tensors["pixel_values"])
    assert group_heads(repeated, 1) is None  # nothing to share
    assert group_heads(repeated, 2) is None  # 9 rows do not split into groups of 2
    assert group_heads(tiny_policy.encode_prompts(samples), 3) is None  # three different prompts
    same_text = [VisualSample(images=[image(64, 64, c)], question="Q?", task="t") for c in ((255, 0, 0), (0, 0, 255))]
    assert group_heads(tiny_policy.encode_prompts(same_text), 2) is None  # same tokens, different pixels


# ------------------------------------------------------------------------------------------------------ sampling
@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_shared_prefix_draws_the_same_completions_for_the_same_seed(new_policy, samples, model, random_seed):
    policy = new_policy(model, lora_r=None).eval()
    prompts = policy.encode_prompts(samples, rows_per_prompt=K)
    calls, handle = count_vision_images(policy)
    try:
        plain = rollout(policy, prompts, shared=False, seed=random_seed)
        assert calls == [4 * K]  # every row's images encoded
        shared = rollout(policy, prompts, shared=True, seed=random_seed)
        assert calls == [4 * K, 4]  # each prompt's images encoded once
    finally:
        handle.remove()
    assert shared.completion_ids.shape[1] > 1
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.equal(shared.completion_mask, plain.completion_mask)
    assert shared.texts == plain.texts
    other = rollout(policy, prompts, shared=True, seed=random_seed + 1)
    assert not torch.equal(other.completion_ids, shared.completion_ids)  # the seed matters: the test can fail


def test_shared_prefix_with_lora_greedy_and_a_second_rollout(tiny_policy, samples):
    """The LoRA policy (PeftModel.generate), greedy decoding, and no state left behind for the next rollout."""
    prompts = tiny_policy.encode_prompts(samples, rows_per_prompt=K)
    plain = rollout(tiny_policy, prompts, shared=False, seed=0, greedy=True)
    first = rollout(tiny_policy, prompts, shared=True, seed=0, greedy=True)
    second = rollout(tiny_policy, prompts, shared=True, seed=0, greedy=True)
    assert torch.equal(first.completion_ids, plain.completion_ids)
    assert torch.equal(second.completion_ids, plain.completion_ids)
    for b in range(3):  # greedy: the K rows of a group agree
        assert all(torch.equal(first.completion_ids[b * K], first.completion_ids[b * K + k]) for k in range(K))


@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_shared_prefix_on_text_only_prompts_after_an_image_rollout(new_policy, samples, model, random_seed):
    """Left-padded prompts without images, after a rollout with images (whose rotary offsets the model keeps)."""
    policy = new_policy(model, lora_r=None).eval()
    policy.generate(
        policy.encode_prompts(samples[:1], rows_per_prompt=K), SamplingSettings(max_new_tokens=2), rows_per_prompt=K
    )
    text = [
        VisualSample(images=[], question="Short?", task="t"),
        VisualSample(
            images=[], question="A much longer question, with many more words in it than the first?", task="t"
        ),
    ]
    prompts = policy.encode_prompts(text, rows_per_prompt=K)
    assert (prompts.tensors["attention_mask"] == 0).any(), "the test needs left padding"
    plain = rollout(policy, prompts, shared=False, seed=random_seed)
    shared = rollout(policy, prompts, shared=True, seed=random_seed)
    assert torch.equal(shared.completion_ids, plain.completion_ids)


def text_prompts(rows: list[list[int]], **extra: torch.Tensor) -> PromptInputs:
    ids = torch.tensor(rows)
    return PromptInputs({"input_ids": ids, "attention_mask": torch.ones_like(ids), **extra}, [0] * len(rows))


def test_group_heads_of_text_prompts_take_the_first_row_of_each_group_at_the_smallest_sizes():
    pairs = text_prompts([[5, 6], [5, 6], [7, 8], [7, 8]])  # groups of 2, prompts of 2 tokens: shareable
    heads = group_heads(pairs, 2)
    assert heads is not None and heads.tensors["input_ids"].tolist() == [[5, 6], [7, 8]]
    assert group_heads(text_prompts([[5], [5]]), 2) is None  # one token: nothing before the token generate starts on
    assert group_heads(text_prompts([[5, 6], [5, 6]], input_features=torch.zeros(2, 3)), 2) is None  # unknown
    ends_in_image = text_prompts([[4, 5, 6], [4, 5, 6]], mm_token_type_ids=torch.tensor([[0, 0, 1], [0, 0, 1]]))
    assert group_heads(ends_in_image, 2) is None  # the last prompt token must be text
    image_inside = text_prompts([[5, 6], [5, 6]], mm_token_type_ids=torch.tensor([[1, 0], [1, 0]]))
    assert group_heads(image_inside, 2) is not None
    assert heads.copies_of == [0, 2]  # rows 0 and 2: the first of each group


# ------------------------------------------------------------------------------------------------ training forward
def test_repeated_rows_know_which_prompt_they_copy(tiny_policy, samples):
    prompts = tiny_policy.encode_prompts(samples, rows_per_prompt=K)
    assert prompts.copies_of == [0] * K + [1] * K + [2] * K
    assert tiny_policy.encode_prompts(samples).copies_of is None
    part = prompts.select(slice(2, 7))  # the last row of prompt 0, prompt 1, the first row of prompt 2
    assert part.copies_of == [0, 1, 1, 1, 2]
    heads, prompt_of_row = distinct_rows(part)
    assert prompt_of_row == [0, 1, 1, 1, 2] and heads.images_per_row == [1, 2, 1]
    assert torch.equal(heads.tensors["input_ids"], prompts.tensors["input_ids"][[0, K, 2 * K]])
    assert torch.equal(take_rows(part, [1, 4]).tensors["input_ids"], heads.tensors["input_ids"][[1, 2]])
    assert take_rows(part, [1, 4]).copies_of == [1, 2]
    assert distinct_rows(take_rows(part, [0, 1, 4])) is None  # no two rows of one prompt: nothing to share
    assert distinct_rows(tiny_policy.encode_prompts(samples)) is None


def completions(policy, prompts, seed: int):
    """Sampled completions cut to unequal lengths (random weights seldom stop early), padding after the cut."""
    torch.manual_seed(seed)
    batch = policy.generate(prompts, SamplingSettings(max_new_tokens=10), rows_per_prompt=K)
    lengths = torch.arange(len(prompts)) % 7 + 4  # [N] 4..10 tokens
    batch.completion_mask = (torch.arange(10)[None, :] < lengths[:, None]).long()
    batch.completion_ids = batch.completion_ids.masked_fill(batch.completion_mask == 0, policy.pad_token_id)
    return batch


def logprobs_and_vision_grads(policy, prompts, batch, shared: bool):
    """:func:`logprobs_and_grads`, with the vision tower's gradients only, in its parameters' order."""
    logprobs, grads = logprobs_and_grads(policy, prompts, batch, shared)
    vision = {id(p) for p in policy.vision_parameters()}
    return logprobs, [grads[name] for name, p in policy.model.named_parameters() if id(p) in vision]


@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_training_forward_encodes_each_prompt_once_with_the_same_logprobs_and_gradients(
    new_policy, samples, model, random_seed
):
    """Multi-image rows of unequal lengths, completions of unequal lengths, a trainable vision tower."""
    policy = new_policy(model, lora_r=None, freeze_vision=False)
    prompts = policy.encode_prompts(samples, rows_per_prompt=K)
    batch = completions(policy, prompts, random_seed)
    calls, handle = count_vision_images(policy)
    try:
        plain, plain_grads = logprobs_and_vision_grads(policy, prompts, batch, shared=False)
        shared, shared_grads = logprobs_and_vision_grads(policy, prompts, batch, shared=True)
    finally:
        handle.remove()
    assert calls == [4 * K, 4]  # every row's images, then each prompt's once
    mask = batch.completion_mask.bool()
    # The two ways differ in the vision tower's batch only (4 images, or 4 K): its sums may round in another order
    # (the patch embedding's 3 x 2 x 16^2 terms at most, then 2 blocks of 9 sums, the merger's 3 and the deepstack
    # merger's 3, of <= 128 terms: norms, projections, attention over <= 64 patches), and the LM carries that on
    atol = logprob_atol(TINY_VLM_VOCAB, sums=[1536] + [128] * 24, logit_l1=TINY_VLM_LOGIT_L1)  # 2.3e-3
    torch.testing.assert_close(shared[mask], plain[mask], rtol=0, atol=atol)
    assert any(g.abs().sum() > 0 for g in plain_grads), "the vision tower should get a gradient"
    # K copies' gradients summed into one encoding, then the weight gradients' sums over the images' patches, in
    # another order than the 4 K rows' sums: rtol 1e-4 = 2 gamma_n for n = 840 terms, more than those sums hold;
    # atol 1e-6 (2e-7 of the largest element) for elements whose terms cancel
    for got, want in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def first_layer_rows(policy):
    """A forward hook on the first decoder layer that records the ``(rows, tokens)`` of each call."""
    calls = []
    layer = policy.hf_model.model.language_model.layers[0]
    return calls, layer.register_forward_hook(
        lambda m, args, kw, out: calls.append(tuple((args[0] if args else kw["hidden_states"]).shape[:2])),
        with_kwargs=True,
    )


def logprobs_and_grads(policy, prompts, batch, shared: bool):
    policy.shared_prefix = shared
    try:
        policy.model.zero_grad()
        logprobs = policy.sequence_logprobs(prompts, batch.completion_ids, batch.completion_mask)
        (logprobs * batch.completion_mask).sum().backward()
    finally:
        policy.shared_prefix = True
    return logprobs.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora_r", [None, 4], ids=["full", "lora"])
@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_training_forward_runs_each_prompt_once_with_the_per_row_logprobs_and_gradients(
    new_policy, samples, model, lora_r, random_seed
):
    """Every layer sees each prompt once and the rows' completions after it; the log-probs and every trained weight's
    gradient are the per-row forward's up to rounding."""
    policy = new_policy(model, lora_r=lora_r)
    prompts = policy.encode_prompts(samples, rows_per_prompt=K)
    batch = completions(policy, prompts, random_seed)
    calls, handle = first_layer_rows(policy)
    try:
        plain, plain_grads = logprobs_and_grads(policy, prompts, batch, shared=False)
        shared, shared_grads = logprobs_and_grads(policy, prompts, batch, shared=True)
    finally:
        handle.remove()
    n, p, length = len(prompts), prompts.tensors["input_ids"].shape[1], batch.completion_ids.shape[1]
    assert calls == [(n, p + length), (n // K, p), (n, length)]  # per row; then each prompt once, the completions
    # The same sums of the same values, in matrices of other shapes (BLAS may block them otherwise) and attention over
    # the cached keys: per layer its two norms, four attention projections, three MLP contractions, the scores and the
    # attention over the P + L positions, then the final norm, each may round in another order
    config = policy.hf_model.config.text_config
    width, head = config.hidden_size, config.hidden_size // config.num_attention_heads
    layer = [width] * 8 + [config.intermediate_size, head, p + length]
    atol = logprob_atol(TINY_VLM_VOCAB, sums=layer * config.num_hidden_layers + [width], logit_l1=TINY_VLM_LOGIT_L1)
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(shared[mask], plain[mask], rtol=0, atol=atol)
    assert set(shared_grads) == set(plain_grads) and plain_grads
    # A weight's gradient sums over the n (P + L) token rows, the K copies of a prompt's first summed into one in the
    # shared way: 2 gamma_m relative for m = n (P + L) terms, and as much of the tensor's largest element for
    # elements whose terms cancel
    bound = 2 * sum_error_bound(n * (p + length))
    for name, want in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], want, rtol=bound, atol=bound * float(want.abs().max()))


@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_shared_positions_equal_transformers_own_for_every_completion_token(new_policy, samples, model, random_seed):
    policy = new_policy(model, lora_r=None)
    prompts = policy.encode_prompts(samples, rows_per_prompt=K).select(slice(1, 3 * K))  # groups cut by a micro-batch
    batch = completions(policy, prompts, random_seed)
    inner = policy.hf_model.model
    t = prompts.tensors
    full = {
        "input_ids": torch.cat([t["input_ids"], batch.completion_ids], dim=1),
        "attention_mask": torch.cat([t["attention_mask"], batch.completion_mask], dim=1),
    }
    if "mm_token_type_ids" in t:
        full["mm_token_type_ids"] = torch.cat([t["mm_token_type_ids"], torch.zeros_like(batch.completion_ids)], 1)
    want = inner.compute_3d_position_ids(
        inputs_embeds=None, image_grid_thw=t["image_grid_thw"], video_grid_thw=None, cache=None, **full
    )
    got = shared_prompt_features(inner, prompts, batch.completion_mask)["position_ids"]
    assert got.shape == want.shape == (3, len(prompts), full["input_ids"].shape[1])
    assert torch.equal(got, want)


def test_text_only_or_distinct_prompts_leave_the_forward_to_the_model(tiny_policy, samples):
    text = [VisualSample(images=[], question="Short?", task="t")]
    prompts = tiny_policy.encode_prompts(text, rows_per_prompt=K)
    mask = torch.ones(K, 2, dtype=torch.long)
    assert shared_prompt_features(tiny_policy.hf_model.model, prompts, mask) is None
    distinct = tiny_policy.encode_prompts(samples)
    assert shared_prompt_features(tiny_policy.hf_model.model, distinct, torch.ones(3, 2, dtype=torch.long)) is None


def test_shared_positions_are_integers_for_any_mask_and_features_come_whatever_the_configs_return_dict(tiny_policy):
    """A float completion mask (as the losses use) gives the same int64 positions as a long one; a model configured
    with ``return_dict=False`` still hands over its image features (they are asked for as an output object)."""
    one = [VisualSample(images=[image(64, 64, (220, 30, 30))], question="Is the dot red?", task="t")]
    prompts = tiny_policy.encode_prompts(one, rows_per_prompt=K)
    inner = tiny_policy.hf_model.model
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    want = shared_prompt_features(inner, prompts, mask)["position_ids"]
    got = shared_prompt_features(inner, prompts, mask.float())["position_ids"]
    assert got.dtype == want.dtype == torch.long and torch.equal(got, want)
    return_dict, inner.config.return_dict = inner.config.return_dict, False
    try:
        out = shared_prompt_features(inner, prompts, mask)
    finally:
        inner.config.return_dict = return_dict
    assert torch.equal(out["position_ids"], want) and len(out["mm_encoder_outputs"]["image"].pooler_output) == K

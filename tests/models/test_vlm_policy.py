"""VLMPolicy on the real tiny models: prompts with several images, sampling, log-probs, LoRA / full fine-tuning,
the reference policy, and export to a Hugging Face folder."""

from contextlib import contextmanager

import pytest
import torch
from PIL import Image
from policy_helpers import perturb, vision_lora_policy, vision_split
from tolerances import TINY_VLM_LOGIT_L1, TINY_VLM_VOCAB, entropy_atol, logprob_atol
from transformers import AutoModelForImageTextToText, AutoProcessor

from app.models import VLMPolicy
from app.settings import LoRASettings, OptimizerSettings, SamplingSettings
from app.tiny.models import resolve_pretrained
from app.types import VisualSample

K = 3
VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


def image(width: int, height: int, color=(220, 30, 30)) -> Image.Image:
    img = Image.new("RGB", (width, height), (230, 230, 230))
    img.paste(color, (width // 4, height // 4, width // 2, height // 2))
    return img


@pytest.fixture(scope="module")
def mixed_samples():
    """Prompts with one image, two images of different sizes, and one image again (rows of unequal patch counts)."""
    return [
        VisualSample(images=[image(64, 64)], question="Is the red dot left of the blue dot?", task="t", answer="yes"),
        VisualSample(
            images=[image(96, 64, (30, 60, 220)), image(64, 120)],
            question="Which image is wider?",
            task="t",
            answer="first",
        ),
        VisualSample(images=[image(80, 80, (40, 170, 60))], question="Count the dots.", task="t", answer="1"),
    ]


@contextmanager
def biased_logits(policy: VLMPolicy, bias: dict[int, float]):
    """Add ``bias[token]`` to the model's output logits (a forward hook on the real lm_head)."""

    def hook(module, args, output):
        output = output.clone()
        for token, value in bias.items():
            output[..., token] += value
        return output

    handle = policy.hf_model.lm_head.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def reference_logprobs_full_forward(hf_model, prompt_inputs, completion_ids, completion_mask, temperature=1.0):
    """Log-probs from one plain forward of the HF model over prompt + completion: the full [N, P+L, V] logits."""
    logits = reference_logits_full_forward(hf_model, prompt_inputs, completion_ids, completion_mask, temperature)
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)


def reference_logits_full_forward(hf_model, prompt_inputs, completion_ids, completion_mask, temperature=1.0):
    """The tempered logits ``[N, L, V]`` that predict the completion tokens, from one plain forward of the HF model."""
    prompt = prompt_inputs.tensors
    inputs = dict(prompt)
    inputs["input_ids"] = torch.cat([prompt["input_ids"], completion_ids], dim=1)
    inputs["attention_mask"] = torch.cat([prompt["attention_mask"], completion_mask], dim=1)
    inputs["mm_token_type_ids"] = torch.cat([prompt["mm_token_type_ids"], torch.zeros_like(completion_ids)], dim=1)
    logits = hf_model(**inputs).logits.float() / temperature  # [N, P+L, V]
    length = completion_ids.shape[1]
    return logits[:, -length - 1 : -1]  # [N, L, V] predicting the completion tokens


@pytest.fixture(scope="module")
def rollout(tiny_policy, mixed_samples):
    """B=3 prompts x K=3 completions of up to 10 tokens, with EOS made likely so some rows end early."""
    prompts = tiny_policy.encode_prompts(mixed_samples, rows_per_prompt=K)
    eos = tiny_policy.processor.tokenizer.eos_token_id
    torch.manual_seed(0)
    with biased_logits(tiny_policy, {eos: 4.5}):
        sampling = SamplingSettings(group_size=K, max_new_tokens=10)
        completions = tiny_policy.generate(prompts, sampling, rows_per_prompt=K)
    return prompts, completions


# ------------------------------------------------------------------------------------------------------- prompts
def test_encode_prompts_repeats_rows_group_major_with_all_images(tiny_policy, mixed_samples):
    prompts = tiny_policy.encode_prompts(mixed_samples, rows_per_prompt=K)
    t = prompts.tensors
    assert len(prompts) == 3 * K
    assert prompts.images_per_row == [1] * K + [2] * K + [1] * K
    assert t["image_grid_thw"].shape == (4 * K, 3)
    assert t["pixel_values"].shape[0] == int(t["image_grid_thw"].prod(dim=1).sum())
    for b in range(3):  # the K rows of a group are identical
        for k in range(1, K):
            assert torch.equal(t["input_ids"][b * K], t["input_ids"][b * K + k])
    assert (t["attention_mask"][:, -1] == 1).all(), "prompts are left-padded"
    image_pad = tiny_policy.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merged = (t["image_grid_thw"].prod(dim=1) // 4).tolist()  # merge 2x2: image tokens per image
    per_row = [(row == image_pad).sum().item() for row in t["input_ids"]]
    expected, i = [], 0
    for n in prompts.images_per_row:
        expected.append(sum(merged[i : i + n]))
        i += n
    assert per_row == expected


def test_prompt_text_holds_one_image_slot_per_image_and_the_instruction(tiny_policy, mixed_samples):
    text = tiny_policy.prompt_text(mixed_samples[1])
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    assert text.endswith("<|im_start|>assistant\n")
    assert mixed_samples[1].question + tiny_policy.instruction in text


def test_image_placeholders_put_each_image_where_the_question_says(tiny_policy, mixed_samples):
    import dataclasses

    two = mixed_samples[1]
    sample = dataclasses.replace(two, question="Compare <image> with <image>: which has more dots?")
    text = tiny_policy.prompt_text(sample)

    slot = "<|vision_start|><|image_pad|><|vision_end|>"
    assert f"Compare {slot} with {slot}: which has more dots?{tiny_policy.instruction}" in text
    assert "<image>" not in text
    inputs = tiny_policy.encode_prompts([sample])  # the processor expands each slot to its image's tokens
    assert inputs.images_per_row == [2]


def test_placeholders_that_do_not_match_the_images_are_refused(tiny_policy, mixed_samples):
    import dataclasses

    sample = dataclasses.replace(mixed_samples[1], question="Only <image> here")
    with pytest.raises(ValueError, match="1 <image> and 0 <video> placeholders for 2 images and 0 videos"):
        tiny_policy.prompt_text(sample)


# ------------------------------------------------------------------------------------------------------ sampling
def test_generate_gives_n_completions_with_masks_up_to_the_first_eos(tiny_policy, rollout):
    prompts, c = rollout
    n, length = c.completion_ids.shape
    assert n == 3 * K and length <= 10 and c.rows_per_prompt == K
    assert c.completion_mask.shape == (n, length) and c.truncated.shape == (n,) and len(c.texts) == n
    eos_ids = torch.tensor(tiny_policy.eos_token_ids)
    for row, mask, truncated in zip(c.completion_ids, c.completion_mask, c.truncated, strict=True):
        is_eos = torch.isin(row, eos_ids)
        if truncated:
            assert length == 10 and not is_eos.any() and mask.all()
        else:
            first = int(is_eos.int().argmax())
            assert mask[: first + 1].all() and not mask[first + 1 :].any()
            assert (row[first + 1 :] == tiny_policy.pad_token_id).all()
    assert c.truncated.any() and (~c.truncated).any(), "the EOS bias should give both kinds of rows"
    assert c.texts == tiny_policy.processor.batch_decode(c.completion_ids, skip_special_tokens=True)


def test_generate_never_emits_vision_tokens(tiny_policy, mixed_samples):
    tokenizer = tiny_policy.processor.tokenizer
    vision_ids = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
    assert sorted(tiny_policy.suppressed_token_ids) == sorted(vision_ids)
    prompts = tiny_policy.encode_prompts(mixed_samples[:2], rows_per_prompt=2)
    torch.manual_seed(0)
    with biased_logits(tiny_policy, {i: 30.0 for i in vision_ids}):  # unsuppressed, they would be all it samples
        c = tiny_policy.generate(prompts, SamplingSettings(max_new_tokens=6), rows_per_prompt=2)
    assert c.completion_ids.shape == (4, 6)
    assert not torch.isin(c.completion_ids, torch.tensor(vision_ids)).any()
    # and the sampled completions go through the next forward (no "image features and image tokens do not match")
    tiny_policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)


def test_greedy_generation_is_deterministic(tiny_policy, mixed_samples):
    prompts = tiny_policy.encode_prompts(mixed_samples[:2])
    a = tiny_policy.generate(prompts, SamplingSettings(max_new_tokens=5), greedy=True)
    b = tiny_policy.generate(prompts, SamplingSettings(max_new_tokens=5), greedy=True)
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_encode_targets_masks_target_tokens_plus_one_eos(tiny_policy):
    tokenizer = tiny_policy.processor.tokenizer
    targets = ["<think>red x=3</think><answer>yes</answer>", "<think></think><answer>no</answer>"]
    c = tiny_policy.encode_targets(targets)
    lengths = [len(tokenizer(t, add_special_tokens=False).input_ids) for t in targets]
    assert c.completion_mask.sum(dim=1).tolist() == [n + 1 for n in lengths]
    for row, n in zip(c.completion_ids, lengths, strict=True):
        assert row[n].item() == tokenizer.eos_token_id
    assert c.texts == targets and not c.truncated.any()


# ----------------------------------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sequence_logprobs_equal_a_plain_full_forward(tiny_policy, rollout, temperature):
    prompts, c = rollout
    with torch.no_grad():
        ours = tiny_policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask, temperature)
        ref = reference_logprobs_full_forward(
            tiny_policy.hf_model, prompts, c.completion_ids, c.completion_mask, temperature
        )
    assert ours.dtype == torch.float32 and ours.shape == c.completion_ids.shape
    mask = c.completion_mask.bool()
    torch.testing.assert_close(ours[mask], ref[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_beside_the_logprobs_is_the_full_forward_s_and_changes_nothing_else(tiny_policy, rollout, temperature):
    prompts, c = rollout
    logprobs, entropy = tiny_policy.sequence_logprobs_and_entropy(
        prompts, c.completion_ids, c.completion_mask, temperature
    )
    alone = tiny_policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask, temperature)
    assert torch.equal(logprobs, alone) and logprobs.requires_grad and not entropy.requires_grad
    with torch.no_grad():
        logits = reference_logits_full_forward(
            tiny_policy.hf_model, prompts, c.completion_ids, c.completion_mask, temperature
        )
        want = -(torch.log_softmax(logits, dim=-1).exp() * torch.log_softmax(logits, dim=-1)).sum(dim=-1)  # [N, L]
    mask = c.completion_mask.bool()
    # the same forward; only the head's 64-term dot products may sum in another order (chunk vs whole batch)
    logit_max = TINY_VLM_LOGIT_L1 / temperature
    atol = entropy_atol(TINY_VLM_VOCAB, logit_max, sums=[64], logit_l1=logit_max)
    torch.testing.assert_close(entropy[mask], want[mask], atol=atol, rtol=0)  # 5e-4 at T = 1 (a wrong T: 1e-2 off)


def test_sequence_logprobs_in_small_chunks_match(tiny_policy, rollout):
    prompts, c = rollout
    with torch.no_grad():
        whole = tiny_policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
        tiny_policy.logprob_chunk_size = 7
        try:
            chunked = tiny_policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
        finally:
            tiny_policy.logprob_chunk_size = 1024
    # Chunks split the LM head's rows: its 64-term dot products and the log-sum-exp over the vocabulary may sum in
    # another order (a kernel picked by the chunk's size), nothing upstream differs
    atol = logprob_atol(TINY_VLM_VOCAB, sums=[64], logit_l1=TINY_VLM_LOGIT_L1)  # 1.5e-4
    torch.testing.assert_close(chunked, whole, atol=atol, rtol=0)


@pytest.mark.parametrize("rows", [slice(0, 4), slice(2, 7), slice(4, 6), slice(6, 9), slice(0, 9)])
def test_select_of_multi_image_rows_gives_the_same_logprobs(tiny_policy, rollout, rows):
    prompts, c = rollout
    with torch.no_grad():
        full = tiny_policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
        part = tiny_policy.sequence_logprobs(prompts.select(rows), c.completion_ids[rows], c.completion_mask[rows])
    sub = prompts.select(rows)
    assert len(sub) == rows.stop - rows.start
    assert sub.tensors["image_grid_thw"].shape[0] == sum(sub.images_per_row)
    mask = c.completion_mask[rows].bool()
    torch.testing.assert_close(part[mask], full[rows][mask], atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------- trainable params
def test_lora_trains_only_adapters_of_the_language_model(new_policy):
    policy = new_policy("tiny-qwen2.5-vl", lora_r=4)  # Qwen2.5-VL's vision MLP also has gate/up/down_proj
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert all("language_model" in n for n in trainable)
    assert not any("visual" in n for n in trainable)
    lora_modules = [n for n, m in policy.model.named_modules() if hasattr(m, "lora_A")]
    assert lora_modules and all("language_model" in n for n in lora_modules)
    assert {n.rsplit(".", 1)[-1] for n in lora_modules} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert not any(p.requires_grad for p in policy.vision_parameters())
    assert {id(p) for p in policy.trainable_parameters()} == {
        id(p) for n, p in policy.model.named_parameters() if n in trainable
    }


def test_lora_with_unfrozen_vision_still_trains_only_the_adapters(new_policy, caplog):
    """``freeze_vision`` is about the vision tower's base weights: under LoRA they stay frozen either way (and the
    setting that would have no effect is reported)."""
    with caplog.at_level("WARNING", logger="app.models.vlm"):
        policy = new_policy("tiny-qwen2-vl", lora_r=4, freeze_vision=False)
    assert not any(p.requires_grad for p in policy.vision_parameters())
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert "freeze_vision" in caplog.text


@pytest.mark.parametrize("freeze_vision", [True, False])
def test_full_fine_tuning_trains_everything_but_a_frozen_vision_tower(new_policy, freeze_vision):
    policy = new_policy("tiny-qwen2-vl", lora_r=None, freeze_vision=freeze_vision)
    vision = {id(p) for p in policy.vision_parameters()}
    assert vision
    for name, p in policy.model.named_parameters():
        expected = not (freeze_vision and id(p) in vision)
        assert p.requires_grad == expected, name
    assert not policy.uses_lora and policy.hf_model is policy.model


def test_lora_and_sampling_settings_reject_bad_values():
    for bad in (dict(r=0), dict(alpha=0), dict(dropout=1.0)):
        with pytest.raises(ValueError):
            LoRASettings(**bad)
    for bad in (dict(group_size=0), dict(temperature=0.0), dict(top_p=0.0), dict(max_new_tokens=0)):
        with pytest.raises(ValueError):
            SamplingSettings(**bad)
    with pytest.raises(ValueError, match="dtype"):
        VLMPolicy("tiny-qwen2-vl", dtype="float8")


# --------------------------------------------------------------------------------------------------- reference
def test_lora_reference_is_the_untrained_policy_and_differs_after_an_update(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    prompts = policy.encode_prompts(new_samples(2), rows_per_prompt=2)
    c = policy.generate(prompts, SamplingSettings(max_new_tokens=6), rows_per_prompt=2)
    mask = c.completion_mask.bool()
    with torch.no_grad():
        before = policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
    ref = policy.reference_logprobs(prompts, c.completion_ids, c.completion_mask)
    torch.testing.assert_close(ref[mask], before[mask], atol=1e-6, rtol=0)  # lora_B starts at zero
    perturb([p for n, p in policy.model.named_parameters() if "lora_B" in n])
    with torch.no_grad():
        after = policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
    ref_after = policy.reference_logprobs(prompts, c.completion_ids, c.completion_mask)
    assert (after - before)[mask].abs().max() > 1e-3
    torch.testing.assert_close(ref_after[mask], before[mask], atol=1e-6, rtol=0)
    assert policy.frozen_reference is None, "LoRA needs no copy of the model"


def test_full_fine_tuning_reference_needs_enable_reference_and_stays_frozen(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=None)
    prompts = policy.encode_prompts(new_samples(2))
    c = policy.generate(prompts, SamplingSettings(max_new_tokens=5))
    with pytest.raises(RuntimeError, match="enable_reference"):
        policy.reference_logprobs(prompts, c.completion_ids, c.completion_mask)
    policy.enable_reference()
    assert not any(p.requires_grad for p in policy.frozen_reference.parameters())
    assert not {id(p) for p in policy.frozen_reference.parameters()} & {id(p) for p in policy.trainable_parameters()}
    with torch.no_grad():
        before = policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
    perturb(policy.trainable_parameters(), scale=0.02)
    ref = policy.reference_logprobs(prompts, c.completion_ids, c.completion_mask)
    mask = c.completion_mask.bool()
    torch.testing.assert_close(ref[mask], before[mask], atol=1e-6, rtol=0)
    with torch.no_grad():
        after = policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
    assert (after - before)[mask].abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------------ export
def test_export_loads_with_from_pretrained_and_gives_identical_logprobs(new_policy, mixed_samples, tmp_path):
    from peft import PeftModel

    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    perturb([p for n, p in policy.model.named_parameters() if "lora_B" in n])  # a "trained" adapter
    policy.eval()
    prompts = policy.encode_prompts(mixed_samples, rows_per_prompt=2)
    c = policy.generate(prompts, SamplingSettings(max_new_tokens=6), rows_per_prompt=2)
    mask = c.completion_mask.bool()
    with torch.no_grad():
        expected = policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)

    out = policy.export(tmp_path / "policy")
    assert (out / "config.json").exists() and (out / "adapter" / "adapter_config.json").exists()
    merged = AutoModelForImageTextToText.from_pretrained(out).eval()
    processor = AutoProcessor.from_pretrained(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    texts = [policy.prompt_text(s) for s in mixed_samples for _ in range(2)]
    images = [s.images for s in mixed_samples for _ in range(2)]
    reloaded_inputs = processor(text=texts, images=images, return_tensors="pt", padding=True)
    assert torch.equal(reloaded_inputs["input_ids"], prompts.tensors["input_ids"])
    with torch.no_grad():
        got = reference_logprobs_full_forward(merged, prompts, c.completion_ids, c.completion_mask)
    assert (got - expected)[mask].abs().max() < 1e-5

    base = AutoModelForImageTextToText.from_pretrained(resolve_pretrained("tiny-qwen2-vl"))
    adapted = PeftModel.from_pretrained(base, out / "adapter").eval()
    with torch.no_grad():
        got_adapter = policy.sequence_logprobs(
            prompts, c.completion_ids, c.completion_mask, hf_model=adapted.get_base_model()
        )
    assert (got_adapter - expected)[mask].abs().max() < 1e-5

    # the exported folder is a valid `policy.model` (GRPO starts from the SFT stage's export)
    restarted = VLMPolicy(str(out), lora=None).eval()
    with torch.no_grad():
        got_policy = restarted.sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
    assert (got_policy - expected)[mask].abs().max() < 1e-5


def test_full_fine_tuning_export_has_no_adapter(new_policy, new_samples, tmp_path):
    policy = new_policy("tiny-qwen2-vl", lora_r=None)
    perturb(policy.trainable_parameters(), scale=0.02)
    out = policy.export(tmp_path / "full")
    assert not (out / "adapter").exists()
    prompts = policy.encode_prompts(new_samples(2))
    c = policy.encode_targets(["<think>a</think><answer>yes</answer>", "<answer>no</answer>"])
    reloaded = AutoModelForImageTextToText.from_pretrained(out).eval()
    with torch.no_grad():
        expected = policy.eval().sequence_logprobs(prompts, c.completion_ids, c.completion_mask)
        got = policy.sequence_logprobs(prompts, c.completion_ids, c.completion_mask, hf_model=reloaded)
    mask = c.completion_mask.bool()
    assert (got - expected)[mask].abs().max() < 1e-5


# ------------------------------------------------------------------------------------------- vision-tower LoRA


@pytest.mark.parametrize("freeze_vision", [True, False])
def test_lora_targets_in_the_vision_tower_train_their_adapters_and_only_those(freeze_vision):
    policy = vision_lora_policy(freeze_vision=freeze_vision)
    adapters, base = vision_split(policy)
    adapted = {n.rsplit(".", 1)[-1] for n, m in policy.model.named_modules() if hasattr(m, "lora_A") and "visual" in n}
    assert adapted == {"qkv", "proj", "gate_proj", "up_proj", "down_proj"}
    assert adapters and all(p.requires_grad for p in adapters.values())
    assert base and not any(p.requires_grad for p in base.values()), "the vision base weights stay frozen"
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in policy.model.named_parameters() if "lora_" in n}
    assert any("language_model" in n for n in trainable)


def test_one_sft_step_moves_the_vision_adapters_and_leaves_every_base_weight_bit_identical(new_samples):
    from app.modules import VLMSFTModule

    torch.manual_seed(0)
    policy = vision_lora_policy()
    module = VLMSFTModule(policy, optimizer=OptimizerSettings(learning_rate=1e-2))
    optimizer = module.configure_optimizers()["optimizer"]
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    loss = module.training_step(new_samples(2), 0)  # outside a trainer, self.log only warns
    loss.backward()
    optimizer.step()
    adapters, base = vision_split(policy)
    moved = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    vision_b = {n for n in adapters if "lora_B" in n}
    assert vision_b and vision_b <= moved, "every vision lora_B should move (they start at zero)"
    assert not moved - {n for n in before if "lora_" in n}, "no base weight may move"
    assert base and not moved & set(base)


def test_the_shared_prompt_encoding_gives_the_vision_adapters_the_per_row_gradients(new_samples):
    policy = vision_lora_policy()
    prompts = policy.encode_prompts(new_samples(2), rows_per_prompt=K)  # rows repeat: the shared path encodes once
    targets = policy.encode_targets(["<think>a</think><answer>yes</answer>", "<answer>no</answer>"] * K)
    adapters, _ = vision_split(policy)
    grads = {}
    for shared in (False, True):
        policy.shared_prefix = shared
        policy.model.zero_grad()
        logprobs = policy.sequence_logprobs(prompts, targets.completion_ids, targets.completion_mask)
        (logprobs * targets.completion_mask).sum().backward()
        grads[shared] = {n: p.grad.clone() for n, p in adapters.items() if "lora_B" in n}
    policy.shared_prefix = True
    assert all(g.abs().sum() > 0 for g in grads[False].values()), "every vision lora_B should get a gradient"
    for name, want in grads[False].items():
        torch.testing.assert_close(grads[True][name], want, rtol=1e-4, atol=1e-6)


def test_full_fine_tuning_with_unfrozen_vision_trains_the_whole_tower_in_its_own_group(new_samples):
    from app.modules import VLMSFTModule

    policy = VLMPolicy("tiny-qwen2-vl", lora=None, freeze_vision=False, vision_learning_rate=1e-5)
    vision = {id(p) for p in policy.vision_parameters()}
    assert vision and all(p.requires_grad for p in policy.vision_parameters())
    groups = (
        VLMSFTModule(policy, optimizer=OptimizerSettings(learning_rate=1e-3))
        .configure_optimizers()["optimizer"]
        .param_groups
    )
    assert [g["lr"] for g in groups] == [1e-3, 1e-5]
    assert {id(p) for p in groups[1]["params"]} == vision
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in policy.model.parameters()}


def test_vision_learning_rate_puts_the_vision_adapters_in_their_own_warmed_up_group_kept_by_lean_checkpoints():
    from app.modules import VLMSFTModule
    from app.modules.checkpoints import omit_frozen_parameters, restore_frozen_parameters

    policy = vision_lora_policy(vision_learning_rate=1e-5)
    module = VLMSFTModule(policy, optimizer=OptimizerSettings(learning_rate=1e-3, warmup_steps=3))
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    groups = optimizer.param_groups
    adapters, _ = vision_split(policy)
    assert len(groups) == 2 and {id(p) for p in groups[1]["params"]} == {id(p) for p in adapters.values()}
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in policy.trainable_parameters()} - {
        id(p) for p in adapters.values()
    }
    assert [g["lr"] for g in groups] == pytest.approx([1e-3 / 4, 1e-5 / 4])  # warm-up from 1 / (3 + 1)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert [g["lr"] for g in groups] == pytest.approx([1e-3, 1e-5])

    checkpoint = {"state_dict": module.state_dict()}
    omit_frozen_parameters(module, checkpoint, [optimizer])
    kept = {k for k in checkpoint["state_dict"] if k in dict(module.named_parameters())}
    assert kept == {n for n, p in module.named_parameters() if p.requires_grad}
    assert any(".visual." in k for k in kept) and any(".language_model." in k for k in kept)
    restore_frozen_parameters(module, checkpoint)
    module.load_state_dict(checkpoint["state_dict"], strict=True)

    single = VLMSFTModule(vision_lora_policy(), optimizer=OptimizerSettings(learning_rate=1e-3)).configure_optimizers()[
        "optimizer"
    ]
    assert len(single.param_groups) == 1  # without vision_learning_rate: one group, as before


def test_lora_targets_that_match_no_module_are_an_error_naming_the_pattern():
    from app.errors import ConfigError

    with pytest.raises(ConfigError, match=r"qkv_proj.*tiny-qwen2-vl(.|\n)*visual\.blocks\.0\.attn\.qkv"):
        VLMPolicy("tiny-qwen2-vl", lora=LoRASettings(r=2, alpha=4, target_modules=r".*visual.*\.qkv_proj"))
    with pytest.raises(ConfigError, match="'q_proj_typo'"):  # a list: each name must match a module
        VLMPolicy("tiny-qwen2-vl", lora=LoRASettings(r=2, alpha=4, target_modules=["q_proj", "q_proj_typo"]))
    policy = VLMPolicy("tiny-qwen2-vl", lora=LoRASettings(r=2, alpha=4, target_modules=["qkv"]))  # PEFT's suffixes
    assert {n for n, m in policy.model.named_modules() if hasattr(m, "lora_A")} == {
        f"base_model.model.model.visual.blocks.{i}.attn.qkv" for i in range(2)
    }


def test_the_vision_adapters_shard_with_the_vision_tower():
    policy = vision_lora_policy()
    adapters, _ = vision_split(policy)
    (tower,) = [unit for unit in policy.sharding_plan().units if unit is policy.hf_model.model.visual]
    assert {id(p) for p in adapters.values()} <= {id(p) for p in tower.parameters()}


def test_export_with_vision_adapters_loads_with_from_pretrained_and_gives_the_policy_s_logprobs(
    mixed_samples, tmp_path
):
    from export_checks import assert_export_matches_policy

    policy = vision_lora_policy("tiny-qwen2-vl")
    adapters, _ = vision_split(policy)
    perturb([p for n, p in adapters.items() if "lora_B" in n], scale=0.2)  # only the vision adapters "trained"
    out = policy.export(tmp_path / "policy")
    assert_export_matches_policy(policy, out, mixed_samples[:2], min_change=1e-4)

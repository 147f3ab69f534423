"""VLMSFTModule on a tiny policy: the loss covers assistant tokens only, it decreases, and only LoRA weights move.
Also the greedy evaluation shared with GRPO (VLMModule)."""

import dataclasses

import pytest
import torch
from torch.utils.data import DataLoader

from app.data import collate_visual_samples
from app.modules import VLMSFTModule
from app.modules.sft import sft_target
from app.settings import OptimizerSettings


def fixed_batch_loader(samples, steps: int) -> DataLoader:
    """The same batch ``steps`` times."""
    return DataLoader(samples * steps, batch_size=len(samples), shuffle=False, collate_fn=collate_visual_samples)


def manual_sft_loss(policy, samples) -> torch.Tensor:
    """Mean NLL of the target tokens (and the closing EOS) from one plain forward of the HF model."""
    tokenizer = policy.processor.tokenizer
    losses, count = [], 0
    for sample in samples:
        prompt = policy.encode_prompts([sample]).tensors
        target = tokenizer(sft_target(sample), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        target = torch.tensor([target])
        inputs = dict(prompt)
        inputs["input_ids"] = torch.cat([prompt["input_ids"], target], dim=1)
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        inputs["mm_token_type_ids"] = torch.cat([prompt["mm_token_type_ids"], torch.zeros_like(target)], dim=1)
        logits = policy.hf_model(**inputs).logits[:, -target.shape[1] - 1 : -1].float()  # [1, T, V]
        losses.append(torch.nn.functional.cross_entropy(logits[0], target[0], reduction="sum"))
        count += target.shape[1]
    return torch.stack(losses).sum() / count


def test_sft_target_wraps_reasoning_and_answer(new_samples):
    sample = new_samples(1)[0]
    assert sft_target(sample) == f"<think>{sample.reasoning}</think><answer>{sample.answer}</answer>"
    with pytest.raises(ValueError, match="labeled"):
        sft_target(dataclasses.replace(sample, answer=None))


def test_sft_loss_is_the_nll_of_the_assistant_tokens_only(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    samples = new_samples(2)
    module = VLMSFTModule(policy)
    with torch.no_grad():
        loss = module.training_step(samples, 0)  # outside a trainer, self.log only warns
        expected = manual_sft_loss(policy, samples)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=0)

    # a longer question changes the prompt, not the number of loss tokens
    longer = [dataclasses.replace(s, question=s.question + " Look carefully at both dots.") for s in samples]
    targets = policy.encode_targets([sft_target(s) for s in samples])
    targets_longer = policy.encode_targets([sft_target(s) for s in longer])
    assert torch.equal(targets.completion_mask, targets_longer.completion_mask)
    tokenizer = policy.processor.tokenizer
    counts = [len(tokenizer(sft_target(s), add_special_tokens=False).input_ids) + 1 for s in samples]
    assert targets.completion_mask.sum(dim=1).tolist() == counts


def test_sft_fit_decreases_the_loss_and_moves_only_lora_weights(new_policy, new_samples, fit, params_snapshot):
    torch.manual_seed(0)
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    module = VLMSFTModule(policy, optimizer=OptimizerSettings(learning_rate=1e-2))
    before = params_snapshot(policy.model)
    trainer, recorder = fit(module, fixed_batch_loader(new_samples(2), 20), max_steps=20)
    after = params_snapshot(policy.model)
    assert trainer.global_step == 20
    losses = recorder.metric("train/loss/sft")
    assert len(losses) == 20 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.5, losses
    assert sum(losses[-5:]) < sum(losses[5:10]) < sum(losses[:5]), losses
    vision = {n for n, p in policy.model.named_parameters() if ".visual." in n}
    lora = {n for n in before if "lora_" in n}
    assert vision and lora
    unchanged_lora = [n for n in lora if torch.equal(before[n], after[n])]
    assert not unchanged_lora, unchanged_lora
    moved_frozen = [n for n in before if n not in lora and not torch.equal(before[n], after[n])]
    assert not moved_frozen, moved_frozen


def test_full_fine_tuning_sft_with_frozen_vision_moves_the_language_model_only(
    new_policy, new_samples, fit, params_snapshot
):
    policy = new_policy("tiny-qwen2-vl", lora_r=None, freeze_vision=True)
    module = VLMSFTModule(policy, optimizer=OptimizerSettings(learning_rate=1e-3))
    before = params_snapshot(policy.model)
    fit(module, fixed_batch_loader(new_samples(2), 2), max_steps=2)
    after = params_snapshot(policy.model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert not {n for n in changed if ".visual." in n}
    assert {n for n in before if "language_model.layers" in n} <= changed


def test_validation_logs_accuracy_and_format_per_task(new_policy, new_datamodule):
    import lightning as L

    module = VLMSFTModule(new_policy("tiny-qwen2-vl", lora_r=4), eval_max_new_tokens=4)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (results,) = trainer.validate(module, datamodule=new_datamodule(), verbose=False)
    for key in ("val/acc", "val/acc/dots_left_of", "val/format", "val/format/dots_left_of"):
        assert key in results and 0.0 <= results[key] <= 1.0
    assert list(module.eval_results) == ["val@step0"]
    assert module.eval_results["val@step0"]["val/acc"] == results["val/acc"]


def test_a_policy_without_trainable_parameters_is_rejected(new_policy):
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    for p in policy.model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="^the policy has no trainable parameters: set a LoRA adapter"):
        VLMSFTModule(policy).configure_optimizers()


def test_modules_train_in_train_mode_so_gradient_checkpointing_is_active(new_policy, new_samples, fit):
    """``gradient_checkpointing=True`` must recompute the decoder layers in backward during fit.

    ``from_pretrained`` returns the HF model in eval mode and Lightning >= 2.2 keeps submodules' modes at fit start, so
    a policy left in eval mode trains without checkpointing (and without the model's own dropout).
    """
    policy = new_policy("tiny-qwen2-vl", lora_r=4, gradient_checkpointing=True)
    calls, modes = [], []
    mlp = policy.hf_model.model.language_model.layers[0].mlp
    forward = mlp.forward  # count calls of forward itself: module hooks do not run again in the recompute

    def counting_forward(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return forward(*args, **kwargs)

    mlp.forward = counting_forward

    class Probe(VLMSFTModule):
        def training_step(self, batch, batch_idx):
            modes.append(policy.hf_model.training)
            return super().training_step(batch, batch_idx)

    try:
        fit(Probe(policy), fixed_batch_loader(new_samples(2), 1), max_steps=1)
    finally:
        del mlp.forward
    assert modes == [True], "the policy's HF model is in eval mode during training_step"
    assert len(calls) == 2, f"decoder layer ran {len(calls)} time(s) for one forward+backward; 2 = recomputed"


def test_predict_step_returns_greedy_completions_per_sample(tiny_policy, samples):
    module = VLMSFTModule(tiny_policy, eval_max_new_tokens=6)
    rows = module.predict_step(samples, 0)
    assert [r["question"] for r in rows] == [s.question for s in samples]
    assert [r["answer"] for r in rows] == [s.answer for s in samples]
    again = module.predict_step(samples, 0)
    assert [r["completion"] for r in rows] == [r["completion"] for r in again]  # greedy: deterministic

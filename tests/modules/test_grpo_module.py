"""VLMGRPOModule on a tiny policy: short fits with every option, micro-batching, logging and resuming."""

from contextlib import contextmanager

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from app.algorithms import group_advantages
from app.models import SamplingSettings
from app.modules import VLMGRPOModule
from app.rewards import RewardComponent

K = 4


class LengthReward(RewardComponent):
    """Completion length in characters / 32: differs within a group, so advantages are non-zero."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor([len(c) / 32 for c in completions])


class FlatForYesReward(RewardComponent):
    """Constant for "yes" prompts (a zero-std group), the length for the others."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor(
            [1.0 if s.answer == "yes" else len(c) / 32 for c, s in zip(completions, samples, strict=True)]
        )


def grpo_module(policy, rewards=None, max_new_tokens: int = 8, **kwargs) -> VLMGRPOModule:
    kwargs.setdefault("learning_rate", 1e-2)
    return VLMGRPOModule(
        policy,
        rewards=rewards or [LengthReward()],
        sampling=SamplingSettings(num_generations=K, max_new_tokens=max_new_tokens),
        eval_max_new_tokens=4,
        **kwargs,
    )


@contextmanager
def likely_eos(policy, bias: float = 4.5):
    """Make the end-of-turn token likely (a forward hook on the real lm_head), so some completions end early."""
    eos = policy.processor.tokenizer.eos_token_id

    def hook(module, args, output):
        output = output.clone()
        output[..., eos] += bias
        return output

    heads = [policy.hf_model.lm_head] + ([policy.reference.lm_head] if policy.reference is not None else [])
    handles = [head.register_forward_hook(hook) for head in heads]  # a full fine-tuning reference gets it too
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def perturb_lora_b(policy, scale: float = 0.05) -> None:
    """Give the adapter a non-zero update, so every LoRA weight gets a gradient."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=generator) * scale)


# -------------------------------------------------------------------------------------------- two-step LoRA fit
@pytest.fixture(scope="module")
def lora_fit(new_policy, new_datamodule, fit, params_snapshot):
    torch.manual_seed(0)
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    module = grpo_module(policy)
    before = params_snapshot(policy.model)
    trainer, recorder = fit(module, new_datamodule(), max_steps=2)
    return module, trainer, recorder, before, params_snapshot(policy.model)


def test_two_step_fit_moves_every_lora_weight_and_nothing_else(lora_fit):
    module, trainer, _, before, after = lora_fit
    assert trainer.global_step == 2
    lora = {n for n in before if "lora_" in n}
    vision = {n for n in before if ".visual." in n}
    assert lora and vision
    unchanged = sorted(n for n in lora if torch.equal(before[n], after[n]))
    assert not unchanged, unchanged
    moved = sorted(n for n in before if n not in lora and not torch.equal(before[n], after[n]))
    assert not moved, moved  # no vision weight, no base language-model weight


def test_on_policy_ratio_is_exactly_one_and_metrics_are_logged(lora_fit):
    _, _, recorder, _, _ = lora_fit
    assert [s["global_step"] for s in recorder.steps] == [1, 2]
    assert recorder.metric("train/ratio_mean") == [1.0, 1.0]
    assert recorder.metric("train/clip_fraction") == [0.0, 0.0]
    assert recorder.metric("train/kl") == [0.0, 0.0]
    metrics = recorder.steps[-1]["metrics"]
    for key in (
        "train/reward/total",
        "train/reward/length",
        "train/loss/policy",
        "train/frac_zero_std",
        "train/completion_length",
        "train/frac_truncated",
        "train/nonfinite_rewards",
        "train/grad_norm",
    ):
        assert key in metrics, key
    assert 0 < metrics["train/completion_length"] <= 8
    assert metrics["train/grad_norm"] > 0


def test_training_step_returns_completion_records(lora_fit):
    _, _, recorder, _, _ = lora_fit
    outputs = recorder.steps[0]["outputs"]
    records = outputs["records"]
    assert len(records) == 2 * K  # min(records_per_step=16, B*K)
    assert {r.task for r in records} == {"dots_left_of"}
    assert all(r.step == recorder.steps[0]["global_step"] and set(r.components) == {"length"} for r in records)
    group = [r.reward for r in records[:K]]
    assert abs(sum(r.advantage for r in records[:K])) < 1e-4 and max(group) > min(group)


# ------------------------------------------------------------------------------------------------------ rollout
def test_rollout_advantages_follow_the_scale_option(new_policy, samples):
    samples = samples[:2]
    for scale in ("group", "batch", "none"):
        module = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4), advantage_scale=scale)
        torch.manual_seed(0)
        rollout = module.rollout(samples)
        assert rollout.advantages.shape == (2 * K,)
        expected = group_advantages(rollout.rewards.total, K, scale=scale)
        torch.testing.assert_close(rollout.advantages, expected)
        assert rollout.advantages.abs().sum() > 0
        assert rollout.old_logprobs is None and rollout.ref_logprobs is None
        assert torch.equal(rollout.loss_mask, rollout.completions.completion_mask)


def test_drop_zero_std_groups_masks_the_flat_groups_only(new_policy, new_samples):
    samples = new_samples(2)
    assert sorted(s.answer for s in samples) == ["no", "yes"]
    module = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4), rewards=[FlatForYesReward()], drop_zero_std_groups=True)
    torch.manual_seed(0)
    rollout = module.rollout(samples)
    for b, sample in enumerate(samples):
        rows = slice(b * K, (b + 1) * K)
        if sample.answer == "yes":
            assert not rollout.loss_mask[rows].any()
            assert not rollout.advantages[rows].any()
        else:
            assert torch.equal(rollout.loss_mask[rows], rollout.completions.completion_mask[rows])


def test_mask_truncated_leaves_truncated_completions_out_of_the_loss(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    module = grpo_module(policy, mask_truncated=True)
    torch.manual_seed(0)
    with likely_eos(policy):
        rollout = module.rollout(new_samples(2))
    truncated = rollout.completions.truncated
    assert truncated.any() and (~truncated).any()
    assert not rollout.loss_mask[truncated].any()
    assert torch.equal(rollout.loss_mask[~truncated], rollout.completions.completion_mask[~truncated])


def test_rollout_keeps_old_and_reference_logprobs_when_needed(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    module = grpo_module(policy, beta=0.04, num_iterations=2, micro_batch_size=3)
    torch.manual_seed(0)
    rollout = module.rollout(new_samples(2))
    c = rollout.completions
    assert rollout.old_logprobs.shape == rollout.ref_logprobs.shape == c.completion_ids.shape
    with torch.no_grad():
        current = policy.sequence_logprobs(rollout.prompt_inputs, c.completion_ids, c.completion_mask)
    mask = c.completion_mask.bool()
    torch.testing.assert_close(rollout.old_logprobs[mask], current[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(rollout.ref_logprobs[mask], current[mask], atol=1e-5, rtol=0)  # lora_B is still 0


def test_invalid_options_are_rejected(new_policy):
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    with pytest.raises(ValueError, match="num_iterations"):
        grpo_module(policy, num_iterations=0)
    with pytest.raises(ValueError, match="micro_batch_size"):
        grpo_module(policy, micro_batch_size=0)


# ------------------------------------------------------------------------------------------------------ options
OPTIONS = {
    "beta": dict(beta=0.01),
    "num_iterations": dict(num_iterations=2),
    "drop_zero_std_groups": dict(drop_zero_std_groups=True),
    "mask_truncated": dict(mask_truncated=True),
    "micro_batch": dict(micro_batch_size=3),
    "advantage_none": dict(advantage_scale="none"),
    "advantage_batch": dict(advantage_scale="batch"),
    "sequence_mean": dict(loss_aggregation="sequence_mean"),
    "constant": dict(loss_aggregation="constant"),
    "full_fine_tuning_beta": dict(beta=0.01, lora_r=None),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_grpo_option_runs_and_logs(name, new_policy, new_datamodule, fit):
    options = dict(OPTIONS[name])
    lora_r = options.pop("lora_r", 4)
    torch.manual_seed(0)
    policy = new_policy("tiny-qwen2-vl", lora_r=lora_r)
    module = grpo_module(policy, **options)
    with likely_eos(policy):  # completions of unequal lengths, some truncated, some not
        trainer, recorder = fit(module, new_datamodule(), max_steps=2)
    assert trainer.global_step == 2
    iterations = options.get("num_iterations", 1)
    assert len(recorder.steps) == 2 // iterations
    for step in recorder.steps:
        metrics = step["metrics"]
        for key in ("train/loss/policy", "train/kl", "train/clip_fraction", "train/ratio_mean", "train/reward/total"):
            assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key
        assert metrics["train/kl"] >= 0
        assert 0 <= metrics["train/clip_fraction"] <= 1
        if iterations == 1:
            assert metrics["train/ratio_mean"] == 1.0
    if "beta" in options:
        assert recorder.steps[-1]["metrics"]["train/kl"] > 0, "the second step's policy differs from the reference"


def test_lr_warmup_counts_optimizer_steps(new_policy, new_datamodule, fit):
    """``warmup_steps`` is documented "in optimizer steps"; with num_iterations = 2 a rollout makes two of them."""
    torch.manual_seed(0)
    module = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4), num_iterations=2, warmup_steps=10)
    trainer, _ = fit(module, new_datamodule(), max_steps=4)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert trainer.global_step == 4
    assert scheduler.last_epoch == trainer.global_step


# ------------------------------------------------------------------------------------------------ micro-batches
class GradRecorder:
    """Stands in for the optimizer in ``_update``: keeps the accumulated gradients instead of stepping."""

    def __init__(self, parameters):
        self.parameters = list(parameters)
        self.grads = None

    def step(self):
        self.grads = [p.grad.detach().clone() for p in self.parameters]

    def zero_grad(self, set_to_none=True):
        for p in self.parameters:
            p.grad = None


class MicroBatchProbe(VLMGRPOModule):
    """One rollout, then one ``_update`` per micro-batch size, keeping gradients and logged sums."""

    sizes = (None, 3, 1)

    def training_step(self, batch, batch_idx):
        rollout = self.rollout(batch)
        self.results = {}
        for size in self.sizes:
            self.hparams.micro_batch_size = size
            recorder = GradRecorder(self.policy.trainable_parameters())
            stats = self._update(rollout, recorder)
            self.results[size] = (recorder.grads, {k: float(v) for k, v in stats.items()})
        self.rollout_batch = rollout
        return None


@pytest.mark.parametrize(
    "options",
    [
        dict(loss_aggregation="token_mean"),
        dict(loss_aggregation="sequence_mean", mask_truncated=True),
        dict(loss_aggregation="constant", beta=0.05),
    ],
    ids=["token_mean", "sequence_mean", "constant_kl"],
)
def test_micro_batching_gives_the_same_gradients(options, new_policy, new_datamodule, fit):
    torch.manual_seed(0)
    policy = new_policy("tiny-qwen2-vl", lora_r=4)  # LoRA dropout 0, and the tiny models have no other dropout
    perturb_lora_b(policy)
    module = MicroBatchProbe(
        policy,
        rewards=[LengthReward()],
        sampling=SamplingSettings(num_generations=K, max_new_tokens=8),
        gradient_clip_val=0.0,
        **options,
    )
    with likely_eos(policy):  # unequal completion lengths, so the normalisers matter
        fit(module, new_datamodule(), max_epochs=1, max_steps=-1, limit_train_batches=1)
    mask = module.rollout_batch.loss_mask
    assert mask.sum(dim=1).unique().numel() > 1, "completions should differ in length"
    full_grads, full_stats = module.results[None]
    assert any(g.abs().sum() > 0 for g in full_grads)
    for size in MicroBatchProbe.sizes[1:]:
        grads, stats = module.results[size]
        for g, ref in zip(grads, full_grads, strict=True):
            torch.testing.assert_close(g, ref, atol=1e-6, rtol=1e-4)
        for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
            assert stats[key] == pytest.approx(full_stats[key], abs=1e-6, rel=1e-4), key


# ------------------------------------------------------------------------------------------------------- resume
def test_resume_from_a_step_checkpoint_matches_an_uninterrupted_run(
    new_policy, new_datamodule, fit, params_snapshot, tmp_path
):
    """Fit 2 steps saving every step, resume to 3; an uninterrupted 3-step run with the same seed must agree."""
    import lightning as L

    def fresh():
        L.seed_everything(0)
        module = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4))
        return module, new_datamodule(train_size=16)

    module, data = fresh()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    fit(module, data, max_steps=2, callbacks=[checkpoints], enable_checkpointing=True)
    step2 = tmp_path / "epoch=0-step=2.ckpt"
    assert step2.exists(), sorted(p.name for p in tmp_path.iterdir())

    resumed, data = fresh()
    # weights_only=False: see test_checkpoint_resumes_with_the_default_weights_only_loading for the default
    trainer_a, rec_a = fit(resumed, data, max_steps=3, ckpt_path=str(step2), weights_only=False)
    straight, data = fresh()
    trainer_b, rec_b = fit(straight, data, max_steps=3)

    assert trainer_a.global_step == trainer_b.global_step == 3
    assert [s["global_step"] for s in rec_a.steps] == [3]
    third_a, third_b = rec_a.steps[-1], rec_b.steps[-1]
    questions_a = [r.question + str(r.answer) for r in third_a["outputs"]["records"]]
    questions_b = [r.question + str(r.answer) for r in third_b["outputs"]["records"]]
    texts_a = [r.completion for r in third_a["outputs"]["records"]]
    texts_b = [r.completion for r in third_b["outputs"]["records"]]
    assert questions_a == questions_b, "the third step saw a different batch (data order not resumed)"
    assert texts_a == texts_b, "the third step sampled different completions (RNG state not resumed)"
    assert third_a["metrics"]["train/loss/policy"] == pytest.approx(third_b["metrics"]["train/loss/policy"], abs=1e-6)
    params_a, params_b = params_snapshot(resumed.policy.model), params_snapshot(straight.policy.model)
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], atol=1e-6, rtol=0, msg=name)


def test_checkpoint_resumes_with_the_default_weights_only_loading(new_policy, new_datamodule, fit, tmp_path):
    """``trainer.fit(ckpt_path=...)`` loads with ``weights_only=True`` by default (torch >= 2.6): the checkpoint must
    hold only plain types (no ``SamplingSettings`` object in the saved hyper-parameters)."""
    torch.manual_seed(0)
    module = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4))
    trainer, _ = fit(module, new_datamodule(), max_steps=1)
    trainer.save_checkpoint(tmp_path / "step1.ckpt")
    checkpoint = torch.load(tmp_path / "step1.ckpt", weights_only=False)
    assert not isinstance(checkpoint["hyper_parameters"].get("sampling"), SamplingSettings)
    torch.load(tmp_path / "step1.ckpt", weights_only=True)
    resumed = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4))
    trainer, _ = fit(resumed, new_datamodule(), max_steps=2, ckpt_path=str(tmp_path / "step1.ckpt"))
    assert trainer.global_step == 2

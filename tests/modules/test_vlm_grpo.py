"""VLMGRPOModule on a tiny policy: short fits with every option, micro-batching, logging and resuming. Its loss path
called directly on a hand-made rollout is in test_vlm_grpo_losses.py, the fused loss in test_vlm_grpo_fused.py."""

import dataclasses
import random
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from tolerances import TINY_VLM_LOGIT_L1, TINY_VLM_VOCAB, assert_close_training, entropy_atol
from torch.utils.data import DataLoader

from app.algorithms import group_advantages
from app.models import VLMPolicy
from app.modules import VLMGRPOModule
from app.modules.checkpoints import OMITTED
from app.rewards import RewardComponent
from app.settings import (
    GRPOSettings,
    LoRASettings,
    OptimizerSettings,
    PipelineSettings,
    SamplingSettings,
    VLMLossSettings,
)
from app.types import CompletionRecord

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


GRPO_FIELDS = {field.name for field in dataclasses.fields(GRPOSettings)}
OPTIMIZER_FIELDS = {field.name for field in dataclasses.fields(OptimizerSettings)}
LOSS_FIELDS = {field.name for field in dataclasses.fields(VLMLossSettings)}


def module_options(**options) -> dict:
    """Module arguments from flat ``options``: :class:`GRPOSettings` fields go into ``grpo``, :class:`VLMLossSettings`
    fields into ``loss``, :class:`OptimizerSettings` fields into ``optimizer``, the module's own arguments stay as they
    are."""
    grpo = {name: options.pop(name) for name in GRPO_FIELDS & options.keys()}
    loss = {name: options.pop(name) for name in LOSS_FIELDS & options.keys()}
    optimizer = {name: options.pop(name) for name in OPTIMIZER_FIELDS & options.keys()}
    return {
        **options,
        "grpo": GRPOSettings(**grpo),
        "loss": VLMLossSettings(**loss),
        "optimizer": OptimizerSettings(**optimizer),
    }


def grpo_module(policy, rewards=None, max_new_tokens: int = 8, temperature: float = 1.0, **options) -> VLMGRPOModule:
    """A VLM GRPO module of K completions per prompt at learning rate 1e-2; ``options`` as in :func:`module_options`."""
    return VLMGRPOModule(
        policy,
        rewards=rewards or [LengthReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=max_new_tokens, temperature=temperature),
        eval_max_new_tokens=4,
        **module_options(learning_rate=1e-2, **options),
    )


@contextmanager
def likely_eos(policy, bias: float = 5.0):
    """Make the end-of-turn token likely (a forward hook on the real lm_head), so some completions end early."""
    eos = policy.processor.tokenizer.eos_token_id

    def hook(module, args, output):
        output = output.clone()
        output[..., eos] += bias
        return output

    heads = [policy.hf_model.lm_head] + (
        [policy.frozen_reference.lm_head] if policy.frozen_reference is not None else []
    )
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
    records = recorder.steps[-1]["outputs"]["records"]  # all N = 2 K rows of the step
    lengths = [len(r.completion) / 32 for r in records]
    assert [r.reward for r in records] == pytest.approx(lengths, abs=1e-6)
    for key in ("train/reward/total", "train/reward/length"):
        assert metrics[key] == pytest.approx(sum(lengths) / len(lengths), abs=1e-6), key


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
        assert rollout.sampled.old_logprobs is None and rollout.sampled.ref_logprobs is None
        assert torch.equal(rollout.loss_mask, rollout.sampled.completions.completion_mask)


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
            assert torch.equal(rollout.loss_mask[rows], rollout.sampled.completions.completion_mask[rows])


def test_mask_truncated_leaves_truncated_completions_out_of_the_loss(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    module = grpo_module(policy, mask_truncated=True)
    torch.manual_seed(0)
    with likely_eos(policy):
        rollout = module.rollout(new_samples(2))
    completions = rollout.sampled.completions
    truncated = completions.truncated
    assert truncated.any() and (~truncated).any()
    assert not rollout.loss_mask[truncated].any()
    assert torch.equal(rollout.loss_mask[~truncated], completions.completion_mask[~truncated])


def test_rollout_keeps_old_and_reference_logprobs_when_needed(new_policy, new_samples, monkeypatch):
    """Both at the sampling temperature (the policy the completions were drawn from), whatever the micro-batches,
    and each computed micro_batch_size rows at a time."""
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    module = grpo_module(policy, beta=0.04, num_iterations=2, micro_batch_size=3, temperature=0.7)
    rows_per_call = []
    sequence_logprobs = policy.sequence_logprobs

    def recorded(prompt_inputs, completion_ids, *args, **kwargs):
        rows_per_call.append(len(completion_ids))
        return sequence_logprobs(prompt_inputs, completion_ids, *args, **kwargs)

    monkeypatch.setattr(policy, "sequence_logprobs", recorded)
    torch.manual_seed(0)
    rollout = module.rollout(new_samples(2))
    monkeypatch.undo()
    assert rows_per_call == [3, 3, 2] * 2  # 2 prompts * K = 8 rows, for the old then the reference log-probs
    sampled = rollout.sampled
    c = sampled.completions
    assert sampled.old_logprobs.shape == sampled.ref_logprobs.shape == c.completion_ids.shape
    with torch.no_grad():
        current = policy.sequence_logprobs(sampled.prompt_inputs, c.completion_ids, c.completion_mask, 0.7)
        at_one = policy.sequence_logprobs(sampled.prompt_inputs, c.completion_ids, c.completion_mask, 1.0)
    mask = c.completion_mask.bool()
    assert (current - at_one)[mask].abs().max() > 1e-2  # the temperature matters
    torch.testing.assert_close(sampled.old_logprobs[mask], current[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(sampled.ref_logprobs[mask], current[mask], atol=1e-5, rtol=0)  # lora_B is still 0


# ------------------------------------------------------------------------------------------------------ options
# Each option's effect, checked against the objective written out independently in float64 on the tensors the module
# recorded: a probe keeps, for every optimizer update, the rollout, the weights and log-probs the update starts from,
# the statistics it returns and the gradient it accumulates, and the reference objective's values and gradients on
# the same log-probs.
AGGREGATIONS = ("token_mean", "sequence_mean", "constant")
SCALES = ("group", "batch", "none")
EPS = 0.2  # the module's default eps_low = eps_high
BETA = 0.01
CLIP = 0.05  # a gradient-norm clip that binds on the tiny model


def reference_advantages(rewards: torch.Tensor, scale: str) -> torch.Tensor:
    """Group advantages in float64 (app/algorithms/advantages.py): reward minus its group's mean, divided by the
    population std of the group (``group``) or of the whole batch (``batch``) plus 1e-4, or not divided (``none``);
    exactly 0 for a group whose rewards are all equal."""
    r = rewards.double().view(-1, K)  # [B, K]
    centred = r - r.mean(dim=1, keepdim=True)
    if scale == "group":
        centred = centred / (centred.pow(2).mean(dim=1, keepdim=True).sqrt() + 1e-4)
    elif scale == "batch":
        centred = centred / ((r - r.mean()).pow(2).mean().sqrt() + 1e-4)
    flat = (r.amax(dim=1, keepdim=True) - r.amin(dim=1, keepdim=True)) <= 1e-6  # [B, 1]
    return torch.where(flat, torch.zeros_like(centred), centred).flatten()  # [N]


def flat_rows(rewards: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: rows of groups whose K rewards are all equal."""
    r = rewards.view(-1, K)
    return (r.amax(dim=1) - r.amin(dim=1) <= 1e-6).repeat_interleave(K)


def reference_loss(
    logprobs, old, ref, advantages, mask, aggregation, beta, max_length, eps=(EPS, EPS)
) -> dict[str, torch.Tensor]:
    """The GRPO objective in float64 (docs/algorithms.md, "GRPO"): per token ``-min(r A, clip(r, 1 - eps_low, 1 +
    eps_high) A) + beta k3`` with ``r = exp(logp - old)`` and ``k3 = exp(ref - logp) - (ref - logp) - 1``, aggregated
    over the tokens of ``mask``: ``token_mean`` (over tokens), ``sequence_mean`` (per completion, then over completions
    with a token) or ``constant`` (sum / (N * max_length)). Clip fraction and mean ratio are plain means over the masked
    tokens."""
    lp, old, adv = logprobs.double(), old.double(), advantages.double()[:, None]  # [N, L], [N, L], [N, 1]
    m = mask.bool()
    assert m.any(), "no token in the loss"
    ratio = torch.exp(lp - old)
    eps_low, eps_high = eps
    surrogate = -torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    d = torch.zeros_like(lp) if ref is None else ref.double() - lp
    k3 = torch.exp(d) - d - 1

    def agg(x):
        if aggregation == "token_mean":
            return x[m].sum() / m.sum()
        if aggregation == "sequence_mean":
            return torch.stack([row[keep].mean() for row, keep in zip(x, m, strict=True) if keep.any()]).mean()
        assert aggregation == "constant"
        return x[m].sum() / (x.shape[0] * max_length)

    clipped = ((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - eps_low))  # [N, L]
    return {
        "loss": agg(surrogate + beta * k3),
        "policy_loss": agg(surrogate),
        "kl": agg(k3),
        "clip_fraction": clipped[m].double().mean(),
        "ratio_mean": ratio[m].mean(),
    }


class _GradSpy:
    """Stands in for the optimizer in ``_update``: keeps the accumulated gradients, then steps the real optimizer."""

    def __init__(self, optimizer, parameters):
        self.optimizer, self.parameters, self.grads = optimizer, parameters, None

    def step(self):
        self.grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in self.parameters]
        self.optimizer.step()

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)


class UpdateProbe(VLMGRPOModule):
    """Records every optimizer update (see above). The reference objective is evaluated with the module's own
    aggregation and beta, with each other aggregation, without the KL term (``no_kl``) and, when ``keep_rows`` is set
    (``Rollout -> [N] bool``), on those rows alone with their full completion masks (``kept_rows``)."""

    keep_rows = None

    def on_train_start(self):
        self.updates, self.batches = [], []

    def training_step(self, batch, batch_idx):
        self.batches.append(batch)
        return super().training_step(batch, batch_idx)

    def _update(self, rollouts, optimizer, scale=1.0):
        (rollout,) = rollouts  # no dynamic sampling here: one rollout per update
        grpo, loss, sampled, agg = self.grpo, self.loss, rollout.sampled, self.loss.aggregation
        c = sampled.completions
        named = [(n, p) for n, p in self.policy.model.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        assert [id(p) for p in params] == [id(p) for p in self.policy.trainable_parameters()]
        logprobs, entropy = self.policy.sequence_logprobs_and_entropy(
            sampled.prompt_inputs, c.completion_ids, c.completion_mask, self.sampling.temperature
        )  # [N, L] with gradient, [N, L]
        old = sampled.old_logprobs if sampled.old_logprobs is not None else logprobs.detach()
        every, eps = torch.ones(len(c.texts), dtype=torch.bool), (loss.eps_low, loss.eps_high)
        variants = {a: (every, rollout.loss_mask, a, grpo.beta, eps) for a in AGGREGATIONS}
        variants["no_kl"] = (every, rollout.loss_mask, agg, 0.0, eps)
        variants["eps_low_default"] = (every, rollout.loss_mask, agg, grpo.beta, (EPS, loss.eps_high))
        variants["eps_high_default"] = (every, rollout.loss_mask, agg, grpo.beta, (loss.eps_low, EPS))
        if self.keep_rows is not None:
            variants["kept_rows"] = (self.keep_rows(rollout), c.completion_mask, agg, grpo.beta, eps)
        reference, reference_grads = {}, {}
        for name, (rows, mask, aggregation, beta, clip) in variants.items():
            ref = sampled.ref_logprobs[rows] if sampled.ref_logprobs is not None else None
            values = reference_loss(
                logprobs[rows],
                old[rows],
                ref,
                rollout.advantages[rows],
                mask[rows],
                aggregation,
                beta,
                self.sampling.max_new_tokens,
                clip,
            )
            grads = torch.autograd.grad(values["loss"], params, retain_graph=True, allow_unused=True)
            reference[name] = {k: float(v.detach()) for k, v in values.items()}
            reference_grads[name] = [
                torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)
            ]
        before = {n: p.detach().clone() for n, p in named}
        spy = _GradSpy(optimizer, params)
        stats = super()._update(rollouts, spy, scale)
        self.updates.append(
            dict(
                rollout=rollout,
                logprobs=logprobs.detach(),
                before=before,
                stats={k: float(v) for k, v in stats.items() if k != "entropy"},
                entropy=float(entropy[rollout.loss_mask.bool()].mean()),
                grads=spy.grads,
                reference=reference,
                reference_grads=reference_grads,
                grads_freed=all(p.grad is None for p in params),
            )
        )
        return stats


OPTIONS = {
    "token_mean": dict(),
    "beta": dict(beta=BETA),
    "num_iterations": dict(num_iterations=2),
    "drop_zero_std_groups": dict(drop_zero_std_groups=True),
    "mask_truncated": dict(mask_truncated=True),
    "micro_batch": dict(micro_batch_size=3),
    "advantage_none": dict(advantage_scale="none"),
    "advantage_batch": dict(advantage_scale="batch"),
    "sequence_mean": dict(aggregation="sequence_mean"),
    # max_new_tokens longer than any completion: the constant normaliser is N * max_new_tokens, not N * L
    "constant": dict(aggregation="constant", max_new_tokens=64),
    "full_fine_tuning_beta": dict(beta=BETA, lora_r=None),
    # a second update whose ratio moves, sampled at another temperature, clipped asymmetrically; few records
    "iterations_mixed": dict(
        num_iterations=2, temperature=0.7, gradient_clip_val=CLIP, records_per_step=5, eps_low=0.05, eps_high=0.5
    ),
}


class RecordingLogger(Logger):
    """Keeps what the trainer hands its loggers: one ``{key: float}`` per logging step."""

    def __init__(self):
        super().__init__()
        self.logged: list[dict[str, float]] = []

    @property
    def name(self):
        return "recording"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.logged.append({k: float(v) for k, v in metrics.items()})


@pytest.fixture(scope="module")
def option_run(new_policy, new_datamodule, new_samples, fit, params_snapshot):
    """``option_run(name)``: a 2-optimizer-step fit of :class:`UpdateProbe` with ``OPTIONS[name]`` (cached)."""
    runs = {}

    def run(name):
        if name in runs:
            return runs[name]
        options = dict(OPTIONS[name])
        lora_r = options.pop("lora_r", 4)
        temperature = options.pop("temperature", 1.0)
        max_new_tokens = options.pop("max_new_tokens", 8)
        options.setdefault("gradient_clip_val", 0.0)  # unclipped, the recorded gradient is the one the optimizer uses
        torch.manual_seed(0)
        policy = new_policy("tiny-qwen2-vl", lora_r=lora_r)
        flat_for_yes = name == "drop_zero_std_groups"
        module = UpdateProbe(
            policy,
            rewards=[FlatForYesReward() if flat_for_yes else LengthReward()],
            sampling=SamplingSettings(group_size=K, max_new_tokens=max_new_tokens, temperature=temperature),
            eval_max_new_tokens=4,
            **module_options(learning_rate=1e-2, **options),
        )
        if flat_for_yes:
            module.keep_rows = lambda rollout: ~flat_rows(rollout.rewards.total)
        elif name == "mask_truncated":
            module.keep_rows = lambda rollout: ~rollout.sampled.completions.truncated
        # one "yes" and one "no" prompt per batch for the flat-group run, the dots data module otherwise
        data = DataLoader(new_samples(2) * 2, batch_size=2, collate_fn=list) if flat_for_yes else new_datamodule()
        frozen_reference = params_snapshot(policy.frozen_reference) if policy.frozen_reference is not None else None
        before = params_snapshot(policy.model)
        with likely_eos(policy):  # completions of unequal lengths, some truncated, some not
            logger = RecordingLogger()
            trainer, recorder = fit(module, data, max_steps=2, logger=logger, log_every_n_steps=1)
        runs[name] = SimpleNamespace(
            module=module,
            policy=policy,
            trainer=trainer,
            recorder=recorder,
            updates=module.updates,
            before=before,
            after=params_snapshot(policy.model),
            frozen_reference=frozen_reference,
            logged=logger.logged,
        )
        return runs[name]

    return run


def rollouts_of(run) -> list:
    """The distinct rollouts of a run's updates, in order (one per training step)."""
    seen = {}
    for update in run.updates:
        seen.setdefault(id(update["rollout"]), update["rollout"])
    return list(seen.values())


def assert_grads_close(got, want, **tolerance):
    tolerance = tolerance or dict(rtol=1e-4, atol=1e-6)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w.double(), **tolerance)


def max_grad_difference(a, b) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_update_matches_the_reference_objective_and_is_what_gets_logged(name, option_run):
    run = option_run(name)
    module, grpo = run.module, run.module.grpo
    iterations = grpo.num_iterations
    assert run.trainer.global_step == 2 and len(run.updates) == 2
    rollouts = rollouts_of(run)
    assert len(rollouts) == len(run.recorder.steps) == len(run.logged) == 2 // iterations
    for rollout, step, logged, batch in zip(rollouts, run.recorder.steps, run.logged, run.module.batches, strict=True):
        c, grouped = rollout.sampled.completions, [s for s in batch for _ in range(K)]  # row b * K + k: prompt b
        # rewards, advantages and the loss mask, from their definitions
        expected_rewards = [
            1.0 if name == "drop_zero_std_groups" and s.answer == "yes" else len(text) / 32
            for text, s in zip(c.texts, grouped, strict=True)
        ]
        assert rollout.rewards.total.tolist() == pytest.approx(expected_rewards, abs=1e-6)
        torch.testing.assert_close(
            rollout.advantages.double(),
            reference_advantages(rollout.rewards.total, grpo.advantage_scale),
            rtol=1e-5,
            atol=1e-6,
        )
        left_out = torch.zeros(len(c.texts), dtype=torch.bool)
        if grpo.drop_zero_std_groups:
            left_out |= flat_rows(rollout.rewards.total)
        if module.loss.mask_truncated:
            left_out |= c.truncated
        assert torch.equal(rollout.loss_mask, c.completion_mask * ~left_out[:, None])
        # the rollout's first update starts from the sampling policy (at the sampling temperature): its ratio is 1
        updates = [u for u in run.updates if u["rollout"] is rollout]
        assert len(updates) == iterations
        if rollout.sampled.old_logprobs is not None:
            mask = c.completion_mask.bool()
            old = rollout.sampled.old_logprobs
            torch.testing.assert_close(old[mask], updates[0]["logprobs"][mask], atol=1e-5, rtol=0)
        assert updates[0]["stats"]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert updates[0]["stats"]["clip_fraction"] == 0
        # what is logged is the rollout's and its last update's, each figure recomputed here
        metrics, last = step["metrics"], updates[-1]["stats"]
        assert float(step["outputs"]["loss"]) == pytest.approx(last["loss"], rel=1e-6, abs=1e-9)
        reward_mean = sum(expected_rewards) / len(expected_rewards)
        expected_logged = {
            "train/reward/total": reward_mean,
            f"train/reward/{run.module.rewards.names[0]}": reward_mean,  # one component, of weight 1
            "train/loss/policy": last["policy_loss"],
            "train/kl": last["kl"],
            "train/clip_fraction": last["clip_fraction"],
            "train/ratio_mean": last["ratio_mean"],
            "train/frac_zero_std": float(flat_rows(rollout.rewards.total).double().mean()),
            "train/completion_length": float(c.completion_mask.sum(dim=1).double().mean()),
            "train/frac_truncated": float(c.truncated.double().mean()),
            "train/nonfinite_rewards": 0.0,
            "train/skipped_updates": 0.0,
            "train/skipped_groups": 0.0,
            "train/empty_updates": 0.0,
            "train/policy_lag": 0.0,  # delay 0: every rollout trained by the policy that sampled it
            "epoch": 0.0,
        }
        if grpo.gradient_clip_val > 0:
            expected_logged["train/grad_norm"] = last["grad_norm"]
        logged = dict(logged)
        # the entropy over the loss's tokens, from the update's micro-batches, against the whole batch's at once (the
        # head's 64-term sums may round in another order); one task, so its own figure is the same
        logit_max = TINY_VLM_LOGIT_L1 / module.sampling.temperature
        atol = entropy_atol(TINY_VLM_VOCAB, logit_max, sums=[64], logit_l1=logit_max)
        task = rollout.samples[0].task
        assert logged.pop(f"train/entropy/{task}") == logged["train/entropy"]
        assert logged.pop("train/entropy") == pytest.approx(updates[-1]["entropy"], abs=atol, rel=0)
        assert logged.pop("train/reward_wait_s") >= 0  # seconds, whatever they were
        assert logged.keys() == expected_logged.keys()  # the progress bar's "reward" is not a logger metric
        for key, value in expected_logged.items():
            assert logged[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
        assert metrics["reward"] == pytest.approx(reward_mean, rel=1e-6)
        # the first records_per_step rows, each with its prompt, completion, reward and advantage
        records, limit = step["outputs"]["records"], min(module.records_per_step, len(c.texts))
        component = run.module.rewards.names[0]
        expected_records = [
            CompletionRecord(
                step=step["global_step"],
                task=s.task,
                question=s.question,
                completion=text,
                answer=s.answer,
                reward=pytest.approx(reward, abs=1e-6),
                advantage=pytest.approx(float(advantage), abs=1e-6),
                components={component: pytest.approx(reward, abs=1e-6)},
            )
            for s, text, reward, advantage in zip(grouped, c.texts, expected_rewards, rollout.advantages, strict=True)
        ][:limit]
        assert records == expected_records
        for key, stat in [
            ("loss/policy", "policy_loss"),
            ("kl", "kl"),
            ("clip_fraction", "clip_fraction"),
            ("ratio_mean", "ratio_mean"),
        ]:
            assert metrics[f"train/{key}"] == pytest.approx(last[stat], rel=1e-6, abs=1e-9), key
        assert metrics["train/reward/total"] == pytest.approx(sum(expected_rewards) / len(expected_rewards), abs=1e-6)
        assert metrics["train/frac_zero_std"] == pytest.approx(float(flat_rows(rollout.rewards.total).float().mean()))
        assert metrics["train/frac_truncated"] == pytest.approx(float(c.truncated.float().mean()))
        assert metrics["train/completion_length"] == pytest.approx(float(c.completion_mask.sum(dim=1).float().mean()))
    assert run.trainer.progress_bar_metrics == pytest.approx({"reward": reward_mean}, rel=1e-6)  # the last step's
    for update in run.updates:
        expected = update["reference"][module.loss.aggregation]
        for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
            assert update["stats"][key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
        want = update["reference_grads"][module.loss.aggregation]
        if grpo.gradient_clip_val > 0:  # scaled to norm gradient_clip_val where it was longer (torch's clip_grad_norm_)
            norm = float(torch.stack([g.double().norm() for g in want]).norm())
            assert update["stats"]["grad_norm"] == pytest.approx(norm, rel=1e-4)
            want = [g * min(1.0, grpo.gradient_clip_val / (norm + 1e-6)) for g in want]
        else:
            assert "grad_norm" not in update["stats"]
        assert_grads_close(update["grads"], want)
        assert any(g.abs().sum() > 0 for g in update["grads"])
        assert update["grads_freed"], "the gradients should be freed (set to None) after the step"
    if (module.loss.eps_low, module.loss.eps_high) != (EPS, EPS):  # each clip bound changes this run's objective
        for variant in ("eps_low_default", "eps_high_default"):
            losses = [
                (u["reference"][module.loss.aggregation]["loss"], u["reference"][variant]["loss"]) for u in run.updates
            ]
            assert any(abs(own - other) > 1e-3 * abs(own) + 1e-5 for own, other in losses), variant
    if grpo.gradient_clip_val > 0:
        assert any(u["stats"]["grad_norm"] > grpo.gradient_clip_val for u in run.updates), "the clip should bind"


def test_beta_adds_beta_times_the_k3_kl_to_the_adapter_free_reference(option_run):
    run = option_run("beta")
    first, second = run.updates
    assert first["stats"]["kl"] == pytest.approx(0.0, abs=1e-7)  # lora_B starts at 0: the policy is the reference
    assert second["stats"]["kl"] > 1e-6  # one step later it is not
    for update in run.updates:
        stats, without_kl = update["stats"], update["reference"]["no_kl"]
        assert stats["loss"] - stats["policy_loss"] == pytest.approx(BETA * stats["kl"], rel=1e-4, abs=1e-7)
        assert stats["loss"] - without_kl["loss"] == pytest.approx(BETA * stats["kl"], rel=1e-3, abs=1e-7)
        # the reference log-probs are those of the model with its adapter disabled (which training never moves)
        rollout = update["rollout"]
        sampled = rollout.sampled
        c, mask = sampled.completions, sampled.completions.completion_mask.bool()
        with torch.no_grad(), likely_eos(run.policy):
            adapter_free = run.policy.reference_logprobs(sampled.prompt_inputs, c.completion_ids, c.completion_mask)
        torch.testing.assert_close(sampled.ref_logprobs[mask], adapter_free[mask], atol=1e-5, rtol=0)
    sampled = second["rollout"].sampled
    mask = sampled.completions.completion_mask.bool()
    assert (sampled.ref_logprobs - second["logprobs"])[mask].abs().max() > 1e-4  # not the policy's own
    # the KL term reaches the gradient: the second update's is the full objective's, not the surrogate's alone
    grads, reference = second["grads"], second["reference_grads"]
    assert max_grad_difference(grads, reference["no_kl"]) > 10 * max_grad_difference(grads, reference["token_mean"])


def test_num_iterations_two_reuses_the_rollout_and_its_ratio_moves(option_run):
    run = option_run("num_iterations")
    first, second = run.updates
    assert len(run.recorder.steps) == 1 and first["rollout"] is second["rollout"]
    rollout = first["rollout"]
    mask, old = rollout.loss_mask.bool(), rollout.sampled.old_logprobs
    # "old" log-probs: the sampling policy's, which the first update starts from
    torch.testing.assert_close(old[mask], first["logprobs"][mask], atol=1e-5, rtol=0)
    assert first["stats"]["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and first["stats"]["clip_fraction"] == 0
    # the second update starts from the stepped weights: the ratio moves, and is clipped where it left [0.8, 1.2]
    ratio = torch.exp(second["logprobs"].double() - old.double())  # [N, L]
    adv = rollout.advantages.double()[:, None].expand_as(ratio)
    clipped = ((adv > 0) & (ratio > 1 + EPS)) | ((adv < 0) & (ratio < 1 - EPS))
    assert abs(float(ratio[mask].mean()) - 1) > 1e-3
    assert second["stats"]["ratio_mean"] == pytest.approx(float(ratio[mask].mean()), rel=1e-5)
    assert second["stats"]["clip_fraction"] == pytest.approx(float(clipped[mask].double().mean()), abs=1e-6)
    assert clipped[mask].any() and not clipped[mask].all(), "some tokens should be clipped, not all"
    metrics = run.recorder.steps[0]["metrics"]
    assert metrics["train/ratio_mean"] == pytest.approx(second["stats"]["ratio_mean"], rel=1e-6)
    assert metrics["train/clip_fraction"] == pytest.approx(second["stats"]["clip_fraction"], rel=1e-6)


class FirstUpdateProbe(VLMGRPOModule):
    """Keeps the statistics of every update, and the log-probs each update starts from re-scored with gradients."""

    def on_train_start(self):
        self.updates = []

    def _update(self, rollouts, optimizer, scale=1.0):
        (rollout,) = rollouts
        sampled = rollout.sampled
        logprobs, _ = self.sampler.logprobs_and_entropy(sampled, list(range(len(sampled.completions.texts))))
        stats = super()._update(rollouts, optimizer, scale)
        self.updates.append(dict(rollout=rollout, logprobs=logprobs.detach(), stats=scalars(stats)))
        return stats


@pytest.mark.parametrize("dropout", [0.05, 0.3])
@pytest.mark.parametrize(
    "options",
    [dict(num_iterations=2), dict(pipeline=PipelineSettings(delay=1, workers="inline"))],
    ids=["iter2", "delay1"],
)
def test_the_first_update_of_stored_logprobs_has_ratio_exactly_one_under_lora_dropout(
    dropout, options, new_datamodule, fit
):
    """Every log-prob pass whose result enters the ratio sees the same network: with LoRA dropout (and a non-zero
    adapter, so the dropout reaches the output) the stored log-probs and the first update's agree bit for bit."""
    torch.manual_seed(0)
    policy = VLMPolicy("tiny-qwen2-vl", lora=LoRASettings(r=4, alpha=8, dropout=dropout))
    perturb_lora_b(policy, scale=0.5)
    module = FirstUpdateProbe(
        policy,
        rewards=[LengthReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8),
        **module_options(learning_rate=1e-2, **options),
    )
    steps = 2 if "pipeline" in options else 1  # a delayed pipeline's first step only primes it
    fit(module, new_datamodule(), max_steps=steps)
    first = module.updates[0]
    mask, old = first["rollout"].loss_mask.bool(), first["rollout"].sampled.old_logprobs
    assert mask.any() and old is not None
    assert torch.equal(first["logprobs"][mask], old[mask])
    assert first["stats"]["ratio_mean"] == 1.0 and first["stats"]["clip_fraction"] == 0.0


@pytest.mark.parametrize("name", ["drop_zero_std_groups", "mask_truncated"])
def test_rows_left_out_carry_no_loss_and_no_gradient(name, option_run):
    """With the option, the update (loss, statistics, gradient) equals the objective on the other rows alone."""
    run = option_run(name)
    left_out_somewhere = False
    for update in run.updates:
        rollout = update["rollout"]
        c = rollout.sampled.completions
        left_out = flat_rows(rollout.rewards.total) if name == "drop_zero_std_groups" else c.truncated
        assert (~left_out).any()
        left_out_somewhere |= bool(left_out.any())
        assert not rollout.loss_mask[left_out].any()
        assert (c.completion_mask[left_out].sum(dim=1) > 0).all()  # tokens that would count without the option
        alone = update["reference"]["kept_rows"]
        for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
            assert update["stats"][key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
        assert_grads_close(update["grads"], update["reference_grads"]["kept_rows"])
    assert left_out_somewhere, "the run should have had rows to leave out"


def test_micro_batches_make_the_same_updates_as_the_full_batch(option_run):
    full, micro = option_run("token_mean"), option_run("micro_batch")
    assert micro.module.grpo.micro_batch_size == 3 and full.module.grpo.micro_batch_size is None
    assert micro.module.hparams["grpo"]["micro_batch_size"] == 3  # and so it is recorded
    # Micro-batches sum the gradients in another order. From the same weights (the first update) that is float32
    # rounding: rtol 1e-4 (840 eps) and atol 1e-7 (about 1e-6 of the largest element, for elements whose terms
    # cancel) are far above the rounding of sums over the 8 rows' tokens. Adam's normalisation turns the rounding of
    # near-zero gradient elements into up to 2 lr per step, so the weights are checked against AdamW's bounds
    # (tests/tolerances.py); the second update starts from weights that differ that way, so its gradients are
    # checked against the objective at its own weights (test_every_update_matches_the_reference_objective_...).
    lr, trainable = full.module.optimizer_settings.learning_rate, full.updates[0]["before"].keys()
    initial = {n: full.before[n] for n in trainable}
    first_full, first_micro = full.updates[0], micro.updates[0]
    assert all(torch.equal(first_micro["before"][n], initial[n]) for n in trainable)
    assert_grads_close(first_micro["grads"], first_full["grads"], rtol=1e-4, atol=1e-7)
    for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
        assert first_micro["stats"][key] == pytest.approx(first_full["stats"][key], rel=1e-4, abs=1e-7), key
    for step, (a, b) in enumerate(zip(full.updates, micro.updates, strict=True)):
        assert a["rollout"].sampled.outputs == b["rollout"].sampled.outputs  # the same seed, the same samples
        if step:  # the second update starts from the first one's result
            assert_close_training(b["before"], a["before"], lr=lr, steps=step, initial=initial)
    after = {n: micro.after[n] for n in trainable}
    assert_close_training(after, {n: full.after[n] for n in trainable}, lr=lr, steps=len(full.updates), initial=initial)
    assert all(torch.equal(micro.after[n], full.after[n]) for n in full.after if n not in trainable)  # frozen


@pytest.mark.parametrize("name", ["token_mean", "advantage_batch", "advantage_none"])
def test_the_advantage_scale_option_picks_its_formula(name, option_run):
    run = option_run(name)
    scale = run.module.grpo.advantage_scale
    assert scale == {"token_mean": "group", "advantage_batch": "batch", "advantage_none": "none"}[name]
    for rollout in rollouts_of(run):
        expected = {s: reference_advantages(rollout.rewards.total, s) for s in SCALES}
        torch.testing.assert_close(rollout.advantages.double(), expected[scale], rtol=1e-5, atol=1e-6)
        others = [s for s in SCALES if s != scale]
        assert all((expected[s] - expected[scale]).abs().max() > 1e-3 for s in others), "the scales should differ"


@pytest.mark.parametrize("name", ["token_mean", "sequence_mean", "constant"])
def test_the_loss_aggregation_option_picks_its_normaliser(name, option_run):
    """The gradient is the chosen aggregation's, and clearly not another's (completions of unequal lengths)."""
    run = option_run(name)
    aggregation = run.module.loss.aggregation
    assert aggregation == name
    for update in run.updates:
        assert update["rollout"].loss_mask.sum(dim=1).unique().numel() > 1, "completions should differ in length"
        if name == "constant":  # max_new_tokens, not the longest completion, is the normaliser's length
            length = update["rollout"].sampled.completions.completion_ids.shape[1]
            assert length < run.module.sampling.max_new_tokens
        grads, reference = update["grads"], update["reference_grads"]
        own = max_grad_difference(grads, reference[aggregation])
        assert all(max_grad_difference(grads, reference[other]) > 100 * own for other in AGGREGATIONS if other != name)


def test_full_fine_tuning_with_beta_keeps_the_reference_copy_frozen_while_the_policy_moves(option_run):
    run = option_run("full_fine_tuning_beta")
    policy, reference = run.policy, run.policy.frozen_reference
    assert reference is not None and run.frozen_reference
    assert not {id(p) for p in reference.parameters()} & {id(p) for p in policy.model.parameters()}
    assert not any(p.requires_grad for p in reference.parameters())
    for name, value in reference.named_parameters():
        assert torch.equal(value, run.frozen_reference[name]), name
    moved = [n for n in run.before if not torch.equal(run.before[n], run.after[n])]
    assert any(".visual." not in n for n in moved) and not any(".visual." in n for n in moved)
    first, second = run.updates
    assert first["stats"]["kl"] == pytest.approx(0.0, abs=1e-7) and second["stats"]["kl"] > 1e-6
    for update in run.updates:  # the reference log-probs are the frozen copy's, before and after the steps
        rollout = update["rollout"]
        sampled = rollout.sampled
        c, mask = sampled.completions, sampled.completions.completion_mask.bool()
        with torch.no_grad(), likely_eos(policy):
            frozen = policy.reference_logprobs(sampled.prompt_inputs, c.completion_ids, c.completion_mask)
        torch.testing.assert_close(sampled.ref_logprobs[mask], frozen[mask], atol=1e-5, rtol=0)


def test_lr_warmup_counts_optimizer_steps(new_policy, new_datamodule, fit):
    """``warmup_steps`` is documented "in optimizer steps"; with num_iterations = 2 a rollout makes two of them."""
    torch.manual_seed(0)
    module = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4), num_iterations=2, warmup_steps=10)
    trainer, _ = fit(module, new_datamodule(), max_steps=4)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert trainer.global_step == 4
    assert scheduler.last_epoch == trainer.global_step


# ------------------------------------------------------------------------------------------------ micro-batches
def scalars(stats: dict) -> dict[str, float]:
    """An update's statistics as floats (the entropy tally as its mean over every token)."""
    return {k: float(v.mean() if k == "entropy" else v) for k, v in stats.items()}


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
    """One rollout, then one ``_update`` per micro-batch size, keeping gradients, logged sums and the number of rows
    of each forward pass."""

    sizes = (None, 3, 1)

    def training_step(self, batch, batch_idx):
        rollout = self.rollout(batch)
        self.results = {}
        forward = self.policy.sequence_logprobs_and_entropy

        def counting_forward(prompt_inputs, completion_ids, *args, **kwargs):
            rows.append(completion_ids.shape[0])
            return forward(prompt_inputs, completion_ids, *args, **kwargs)

        self.policy.sequence_logprobs_and_entropy = counting_forward
        try:
            for size in self.sizes:
                self.grpo = dataclasses.replace(self.grpo, micro_batch_size=size)
                self.sampler.micro_batch_size = size  # the sampler cuts the micro-batches (built from grpo)
                recorder, rows = GradRecorder(self.policy.trainable_parameters()), []
                stats = self._update([rollout], recorder)
                self.results[size] = (recorder.grads, scalars(stats), rows)
        finally:
            del self.policy.sequence_logprobs_and_entropy
        self.rollout_batch = rollout
        return None


@pytest.mark.parametrize(
    "options",
    [
        dict(aggregation="token_mean"),
        dict(aggregation="sequence_mean", mask_truncated=True),
        dict(aggregation="constant", beta=0.05),
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
        sampling=SamplingSettings(group_size=K, max_new_tokens=8),
        **module_options(gradient_clip_val=0.0, **options),
    )
    with likely_eos(policy):  # unequal completion lengths, so the normalisers matter
        fit(module, new_datamodule(), max_epochs=1, max_steps=-1, limit_train_batches=1)
    mask = module.rollout_batch.loss_mask
    assert mask.sum(dim=1).unique().numel() > 1, "completions should differ in length"
    full_grads, full_stats, full_rows = module.results[None]
    assert full_rows == [2 * K] and any(g.abs().sum() > 0 for g in full_grads)
    assert module.results[3][2] == [3, 3, 2] and module.results[1][2] == [1] * 2 * K  # the rollout, split
    for size in MicroBatchProbe.sizes[1:]:
        grads, stats, _ = module.results[size]
        for g, ref in zip(grads, full_grads, strict=True):
            torch.testing.assert_close(g, ref, atol=1e-6, rtol=1e-4)
        for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean", "entropy"):
            assert stats[key] == pytest.approx(full_stats[key], abs=1e-6, rel=1e-4), key


class SparseMaskProbe(VLMGRPOModule):
    """One rollout, then one ``_update`` whose loss keeps a single completion (``sequence_mean``) and one whose loss
    keeps a single token of it (``token_mean``)."""

    def training_step(self, batch, batch_idx):
        rollout = self.rollout(batch)
        row = int(rollout.advantages.abs().argmax())
        one_row, one_token = torch.zeros_like(rollout.loss_mask), torch.zeros_like(rollout.loss_mask)
        one_row[row] = rollout.loss_mask[row]
        one_token[row, 0] = 1
        self.advantage, self.results = float(rollout.advantages[row]), {}
        for aggregation, mask in (("sequence_mean", one_row), ("token_mean", one_token)):
            self.loss = dataclasses.replace(self.loss, aggregation=aggregation)
            recorder = GradRecorder(self.policy.trainable_parameters())
            stats = self._update([dataclasses.replace(rollout, loss_mask=mask)], recorder)
            self.results[aggregation] = scalars(stats)
        return None


def test_a_loss_over_one_completion_or_one_token_is_minus_its_advantage(new_policy, new_datamodule, fit):
    """The normalisers count what the mask keeps, down to a single completion or token: on-policy (ratio 1) the loss is
    then minus that completion's advantage, whatever the micro-batches."""
    torch.manual_seed(0)
    module = SparseMaskProbe(
        new_policy("tiny-qwen2-vl", lora_r=4),
        rewards=[LengthReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8),
        grpo=GRPOSettings(micro_batch_size=3, gradient_clip_val=0.0),
    )
    fit(module, new_datamodule(), max_epochs=1, max_steps=-1, limit_train_batches=1)
    assert abs(module.advantage) > 0.1
    assert set(module.results) == {"sequence_mean", "token_mean"}
    for aggregation, stats in module.results.items():
        for key in ("loss", "policy_loss"):
            assert stats[key] == pytest.approx(-module.advantage, rel=1e-5), (aggregation, key)
        assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and stats["clip_fraction"] == 0


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
    scramble_global_generators()  # only the checkpoint can bring back the states the run had at step 2
    # weights_only=False: see test_checkpoint_resumes_with_the_default_weights_only_loading for the default
    trainer_a, rec_a = fit(resumed, data, max_steps=3, ckpt_path=str(step2), weights_only=False)
    states_a = global_generator_states()
    straight, data = fresh()
    trainer_b, rec_b = fit(straight, data, max_steps=3)
    states_b = global_generator_states()

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
    assert_same_optimizer_state(trainer_a.optimizers[0], trainer_b.optimizers[0], steps=3)
    assert_same_generator_states(states_a, states_b)


def scramble_global_generators(seed: int = 12345) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def global_generator_states() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def assert_same_generator_states(a: dict, b: dict) -> None:
    assert torch.equal(a["torch"], b["torch"]), "torch generator state differs from the uninterrupted run's"
    assert a["python"] == b["python"], "python random state differs from the uninterrupted run's"
    assert all(np.array_equal(x, y) for x, y in zip(a["numpy"], b["numpy"], strict=True)), "numpy state differs"


def assert_same_optimizer_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer, steps: int) -> None:
    """Same hyper-parameters (learning rate included) and the same AdamW moments and step count per parameter."""
    state_a, state_b = a.state_dict(), b.state_dict()
    groups_a = [{k: v for k, v in g.items() if k != "params"} for g in state_a["param_groups"]]
    groups_b = [{k: v for k, v in g.items() if k != "params"} for g in state_b["param_groups"]]
    assert groups_a == groups_b
    assert state_a["state"].keys() == state_b["state"].keys() and state_a["state"]
    for index, moments in state_a["state"].items():
        assert float(moments["step"]) == float(state_b["state"][index]["step"]) == steps
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(moments[key], state_b["state"][index][key], atol=1e-7, rtol=1e-5, msg=key)


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
    # lean: the trained adapter is saved, the frozen model (vision tower, base weights) is left out and named
    parameters = dict(module.named_parameters())
    saved, omitted = set(checkpoint["state_dict"]), set(checkpoint[OMITTED])
    trainable = {n for n, p in parameters.items() if p.requires_grad}
    assert trainable and {k for k in saved if k in parameters} == trainable
    assert not saved & omitted and saved | omitted == set(module.state_dict())
    assert any(".visual." in k for k in omitted) and any("base_layer" in k for k in omitted)
    resumed = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4))
    trainer, _ = fit(resumed, new_datamodule(), max_steps=2, ckpt_path=str(tmp_path / "step1.ckpt"))
    assert trainer.global_step == 2

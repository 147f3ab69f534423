"""``VLMGRPOModule(loss=VLMLossSettings(fused_linear=True))``: liger-kernel's fused linear GRPO loss inside the
policy's forward gives the loss, statistics and gradients of the chunked log-prob path on a tiny model, for every
aggregation, with stored old log-probs (ratio != 1) and with a reference (beta > 0); the fused loss takes the module's
settings; the statistics it lacks are not logged; without liger-kernel, or with LoRA on the output head, the option is
a short error."""

import dataclasses
import importlib.util

import pytest
import torch

from app.algorithms.fused_linear import FusedLinearGRPOLoss
from app.errors import ConfigError
from app.models import VLMPolicy
from app.modules import VLMGRPOModule
from app.rewards import RewardComponent
from app.settings import GRPOSettings, LoRASettings, SamplingSettings, VLMLossSettings

pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed (extra 'gpu')")

K = 4
AGGREGATIONS = ("token_mean", "sequence_mean", "constant")
STATS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")


class LengthReward(RewardComponent):
    """Completion length in characters / 32: differs within a group, so advantages are non-zero."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor([len(c) / 32 for c in completions])


def grpo_module(policy, fused: bool, aggregation="token_mean", **grpo) -> VLMGRPOModule:
    """Micro-batches of 3, clip range (0.1, 0.15); ``grpo`` sets the other :class:`GRPOSettings` fields."""
    return VLMGRPOModule(
        policy,
        rewards=[LengthReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8, temperature=0.7),
        grpo=GRPOSettings(micro_batch_size=3, **grpo),
        loss=VLMLossSettings(
            eps_low=0.1, eps_high=0.15, aggregation=aggregation, fused_linear=fused, fused_compiled=False
        ),
    )


def perturbed_rollout(policy, samples):
    """A rollout with stored old and reference log-probs, one group left out of the loss; then the trainable weights
    move, so that the ratio is not 1 and the clip acts."""
    torch.manual_seed(0)
    rollout = grpo_module(policy, fused=False, beta=0.05, num_iterations=2).rollout(samples)
    rollout.loss_mask[:K] = 0  # a dropped group: empty rows, which sequence_mean does not count
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return rollout


@pytest.fixture(scope="module")
def lora_case(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=4)
    return policy, perturbed_rollout(policy, new_samples(2))


@pytest.fixture(scope="module")
def full_case(new_policy, new_samples):
    policy = new_policy("tiny-qwen2-vl", lora_r=None)
    policy.enable_reference()  # before the weights move: the reference is the starting point
    return policy, perturbed_rollout(policy, new_samples(2))


def update(module, rollout):
    """The share-weighted statistics of one update and the accumulated gradients of the trainable parameters."""
    parameters = module.policy.trainable_parameters()
    for parameter in parameters:
        parameter.grad = None
    stats = {}
    for out, share in module.weighted_losses(rollout):
        (out.loss * share).backward()
        for name, value in out.statistics().items():
            stats[name] = stats.get(name, 0.0) + value * share
    return stats, [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in parameters]


def check_same_update(policy, rollout, aggregation, beta, with_old):
    kwargs = dict(aggregation=aggregation, beta=beta, num_iterations=2 if with_old else 1)
    sampled = dataclasses.replace(
        rollout.sampled,
        old_logprobs=rollout.sampled.old_logprobs if with_old else None,
        ref_logprobs=rollout.sampled.ref_logprobs if beta > 0 else None,
    )
    rollout = dataclasses.replace(rollout, sampled=sampled)
    expected, expected_grads = update(grpo_module(policy, fused=False, **kwargs), rollout)
    fused = grpo_module(policy, fused=True, **kwargs)
    actual, grads = update(fused, rollout)
    # Liger returns no ratio, nor (under sequence_mean) a per-row KL: those statistics are absent, not NaN
    lacks = ({"ratio_mean"} if with_old else set()) | (
        {"kl", "policy_loss"} if aggregation == "sequence_mean" and beta > 0 else set()
    )
    assert set(STATS) - set(actual) == lacks
    for name in set(STATS) - lacks:
        torch.testing.assert_close(actual[name], expected[name].float(), atol=1e-6, rtol=1e-4, msg=name)
    if with_old:
        assert expected["clip_fraction"] > 0 and expected["ratio_mean"] != 1
    assert any(g.abs().sum() > 0 for g in expected_grads)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta, with_old", [(0.0, False), (0.0, True), (0.05, False), (0.05, True)])
def test_fused_loss_matches_the_chunked_path_with_lora(lora_case, aggregation, beta, with_old):
    check_same_update(*lora_case, aggregation, beta, with_old)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_fused_loss_matches_the_chunked_path_in_full_fine_tuning(full_case, aggregation):
    """Full fine-tuning trains the output head too: its gradient comes out of the fused loss itself."""
    policy, rollout = full_case
    assert policy.hf_model.lm_head.weight.requires_grad
    check_same_update(policy, rollout, aggregation, beta=0.05, with_old=True)


@pytest.mark.parametrize("compiled", [True, False, None])
def test_the_fused_loss_takes_the_module_settings(tiny_policy, compiled):
    """The clip range, beta and aggregation of the module, ``constant``'s L_max = max_new_tokens (not the length of the
    longest completion), and ``fused_compiled``, None meaning compiled on CUDA only."""
    module = VLMGRPOModule(
        tiny_policy,
        rewards=[LengthReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8),
        grpo=GRPOSettings(beta=0.05),
        loss=VLMLossSettings(
            eps_low=0.1, eps_high=0.15, aggregation="constant", fused_linear=True, fused_compiled=compiled
        ),
    )
    assert module.fused_loss == FusedLinearGRPOLoss(
        eps_low=0.1,
        eps_high=0.15,
        beta=0.05,
        aggregation="constant",
        max_length=8,
        compiled=torch.cuda.is_available() if compiled is None else compiled,
    )


def test_statistics_liger_does_not_return_are_not_logged(new_policy, new_datamodule, fit):
    module = grpo_module(new_policy("tiny-qwen2-vl", lora_r=4), fused=True, beta=0.05, num_iterations=2)
    _, recorder = fit(module, new_datamodule(train_size=2, batch_size=2), max_steps=1)
    metrics = recorder.steps[0]["metrics"]
    assert "train/ratio_mean" not in metrics
    assert {"train/kl", "train/clip_fraction", "train/loss/policy"} <= set(metrics)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("train/"))


def test_without_liger_the_option_is_a_short_error(tiny_policy, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"loss.fused_linear needs liger-kernel \(pip install -e '.\[gpu\]'"):
        grpo_module(tiny_policy, fused=True)
    grpo_module(tiny_policy, fused=False)  # the default needs nothing


def test_lora_on_the_output_head_is_refused():
    policy = VLMPolicy("tiny-qwen2-vl", lora=LoRASettings(r=4, alpha=8, dropout=0.0, target_modules=r".*lm_head"))
    with pytest.raises(ConfigError, match=r"needs a plain nn.Linear output head, got peft\..*Linear \(LoRA on lm_head"):
        grpo_module(policy, fused=True)

"""FlowGRPOModule with GRPO-Guard's ratio normalisation (loss.ratio_normalization) and DanceGRPO's advantage clamp
(loss.advantage_clip): what the module hands the loss, and short fits on the stand-in policy."""

import dataclasses

import pytest
import torch
from doubles import RednessReward, StandInPolicy
from prompt_samples import prompt_loader, prompts

from app.modules.flow_grpo import FlowGRPOModule
from app.settings import FlowGRPOLossSettings, FlowGRPOSamplingSettings, GRPOSettings, OptimizerSettings

K, T = 4, 4


def module(**loss) -> FlowGRPOModule:
    grpo = {key: loss.pop(key) for key in ("num_iterations", "micro_batch_size", "beta") if key in loss}
    return FlowGRPOModule(
        StandInPolicy(),
        [RednessReward()],
        FlowGRPOSamplingSettings(group_size=K, num_steps=T, sampler="sde", eta=0.7),
        grpo=GRPOSettings(**grpo),
        loss=FlowGRPOLossSettings(**loss),
        optimizer=OptimizerSettings(learning_rate=1e-2),
        seed=4,
    )


def part_gradients(flow: FlowGRPOModule, rollout) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per part of ``weighted_losses``: (its share, the gradient of its loss over the trainable parameters)."""
    parameters = list(flow.policy.trainable_parameters())
    out = []
    for part, share in flow.weighted_losses(rollout):
        grads = torch.autograd.grad(part.loss, parameters)
        out.append((torch.as_tensor(share), torch.cat([g.flatten() for g in grads])))
    return out


def test_on_policy_each_step_s_gradient_is_flow_grpo_s_times_its_std_over_dt():
    """num_iterations 1: r_hat = 1 and the bias has no gradient at mu = mu_old, so GRPO-Guard's gradient of a step is
    d/dtheta[-A exp(std (logp - sg logp))] / dt = std / dt times Flow-GRPO's. Same float32 forward on both sides, a
    product with one more factor: 1e-5 is some 100 float32 ulps, taken relative to the largest gradient entry (an entry
    that is a sum of rows of opposite signs cancels to far below the rounding of its terms)."""
    guard, plain = module(ratio_normalization=True, micro_batch_size=3), module(micro_batch_size=3)
    rollout = guard.rollout(prompts(1))
    sampled = rollout.sampled
    stds = [
        float(guard.sampler.step(sampled.latents[:1, j], sampled.latents[:1, j], float(sampled.sigmas[i]),
                                 float(sampled.sigmas[i + 1]), noise=torch.zeros_like(sampled.latents[:1, j])).std[0])
        for j, i in enumerate(sampled.step_indices)
    ]  # fmt: skip
    dts = [float(sampled.sigmas[i]) - float(sampled.sigmas[i + 1]) for i in sampled.step_indices]
    guarded, reference = part_gradients(guard, rollout), part_gradients(plain, rollout)
    assert len(guarded) == len(reference) == 2 * len(sampled.step_indices)  # 3 + 1 rows per step
    for n, ((share, grad), (plain_share, plain_grad)) in enumerate(zip(guarded, reference, strict=True)):
        j = n // 2
        assert torch.equal(share, plain_share)
        expected = plain_grad * (stds[j] / dts[j])
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    outs = [out for out, _ in guard.weighted_losses(rollout)]
    assert all(float(out.ratio_mean) == 1.0 and float(out.clip_fraction) == 0.0 for out in outs)


def test_two_step_fit_with_ratio_normalization_moves_the_weights(fit):
    flow = module(ratio_normalization=True, eps_low=2e-6, eps_high=2e-6)
    before = [p.detach().clone() for p in flow.policy.trainable_parameters()]
    trainer, recorder = fit(flow, prompt_loader(), max_steps=2)
    assert trainer.global_step == 2
    assert all(not torch.equal(b, p) for b, p in zip(before, flow.policy.trainable_parameters(), strict=True))
    assert recorder.metric("train/ratio_mean") == [1.0, 1.0]
    assert all(torch.isfinite(torch.tensor(recorder.metric("train/loss/policy"))))


def test_several_iterations_clip_the_normalised_ratio_and_forget_the_kept_means(fit):
    """num_iterations 2: the second update's r_hat moves off 1 (so it can clip), measured against the means the first
    update kept, which are dropped once the step is done."""
    flow = module(ratio_normalization=True, num_iterations=2, eps_low=1e-9, eps_high=1e-9)
    _, recorder = fit(flow, prompt_loader(2), max_steps=1)
    metrics = recorder.steps[0]["metrics"]
    assert metrics["train/ratio_mean"] != 1.0
    assert metrics["train/clip_fraction"] > 0
    assert flow._old_means == {}


def test_the_first_of_several_updates_starts_from_ratio_exactly_one():
    flow = module(ratio_normalization=True, num_iterations=2)
    rollout = flow.rollout(prompts(1))
    outs = [out for out, _ in flow.weighted_losses(rollout)]
    assert all(float(out.ratio_mean) == 1.0 for out in outs)  # stored log-probs and kept means: the current ones
    assert len(flow._old_means) == len(rollout.sampled.step_indices)


def test_a_delayed_pipeline_is_refused_naming_the_option():
    with pytest.raises(ValueError, match=r"loss.ratio_normalization .* pipeline.delay: 0"):
        FlowGRPOModule(
            StandInPolicy(),
            [RednessReward()],
            FlowGRPOSamplingSettings(group_size=K, num_steps=T),
            loss=FlowGRPOLossSettings(ratio_normalization=True),
            pipeline={"delay": 1, "workers": "inline"},
        )


@pytest.mark.parametrize("guard", [False, True])
def test_advantage_clip_clamps_the_advantages_the_loss_sees(guard):
    clipped, plain = module(advantage_clip=0.5, ratio_normalization=guard), module(ratio_normalization=guard)
    rollout = clipped.rollout(prompts(1))
    rollout = dataclasses.replace(rollout, advantages=torch.tensor([2.0, -3.0, 0.25, -0.5]))
    clamped = dataclasses.replace(rollout, advantages=torch.tensor([0.5, -0.5, 0.25, -0.5]))
    got = [out.loss for out, _ in clipped.weighted_losses(rollout)]
    expected = [out.loss for out, _ in plain.weighted_losses(clamped)]
    assert torch.equal(torch.stack(got), torch.stack(expected))


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_a_non_positive_advantage_clip_is_refused(value):
    with pytest.raises(ValueError, match="loss.advantage_clip must be > 0 or null"):
        FlowGRPOLossSettings(advantage_clip=value)


def test_tiny_sd3_two_step_fit_with_ratio_normalization_and_two_iterations(fit):
    """The embedded tiny SD3 with LoRA: GRPO-Guard trains its adapter, the first update of each rollout at ratio 1,
    the second against the kept means."""
    from app.models.flow import FlowPolicy
    from app.settings import LoRASettings

    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    flow = FlowGRPOModule(
        policy,
        [RednessReward()],
        FlowGRPOSamplingSettings(group_size=2, num_steps=3, sampler="sde", eta=0.7),
        grpo=GRPOSettings(num_iterations=2),
        loss=FlowGRPOLossSettings(ratio_normalization=True, eps_low=2e-6, eps_high=2e-6),
        optimizer=OptimizerSettings(learning_rate=1e-3),
    )
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    trainer, recorder = fit(flow, prompt_loader(2, batch_size=1), max_steps=2)
    assert trainer.global_step == 2
    moved = [n for n, p in policy.named_parameters() if p.requires_grad and not torch.equal(before[n], p)]
    assert moved and all("lora" in n for n in moved)
    assert all(torch.isfinite(torch.tensor(recorder.metric("train/loss/policy"))))
    assert flow._old_means == {}

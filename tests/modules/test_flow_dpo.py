"""FlowDPOModule: the pairs a rollout gives, what the loss sees, the refused options, and short fits on the stand-in
policy."""

import dataclasses

import pytest
import torch
from doubles import RednessReward, StandInPolicy
from prompt_samples import prompt_loader, prompts

from app.modules import FlowDPOModule
from app.modules.flow_dpo import preference_pairs
from app.settings import FlowDPOSettings, FlowSamplingSettings, GRPOSettings, OptimizerSettings

K, T = 4, 4


def dpo_module(dpo=None, **grpo) -> FlowDPOModule:
    return FlowDPOModule(
        StandInPolicy(),
        [RednessReward()],
        FlowSamplingSettings(group_size=K, num_steps=T),
        dpo=dpo or FlowDPOSettings(beta=50.0),
        grpo=GRPOSettings(**grpo),
        optimizer=OptimizerSettings(learning_rate=1e-2),
        seed=1,
    )


def test_each_group_pairs_its_best_and_worst_kept_samples():
    advantages = torch.tensor([0.5, -1.0, 1.5, 0.0, 0.2, 0.2, 0.2, 0.2, 2.0, -2.0, 1.0, 0.0])
    keep = torch.tensor([True, True, True, True, True, True, True, True, False, True, True, False])
    preferred, dispreferred = preference_pairs(advantages, keep, 4)
    assert preferred.tolist() == [2, 10]  # group 1 is all ties; group 2's best and worst are left out
    assert dispreferred.tolist() == [1, 9]


def test_the_loss_is_diffusion_dpo_on_the_pairs_and_its_shares_sum_to_one():
    module = dpo_module(micro_batch_size=2)  # one pair per forward
    rollout = module.rollout(prompts(3))
    preferred, _ = module.pairs(rollout)
    parts = list(module.weighted_losses(rollout))
    assert len(parts) == T * len(preferred)  # timestep_fraction 1: every level of the schedule, one part per pair
    assert sum(float(share) for _, share in parts) == pytest.approx(1.0)
    module.policy.lora_B.data.zero_()  # the adapter adds nothing: policy == reference, margin 0, loss log 2 per pair
    for out, _ in module.weighted_losses(rollout):
        torch.testing.assert_close(out.loss.detach(), torch.tensor(2.0).log(), rtol=1e-6, atol=0)


def total_loss(module: FlowDPOModule, rollout, state: torch.Tensor) -> torch.Tensor:
    """The rollout's weighted loss with the training noise drawn from generator state ``state``."""
    module.generator.set_state(state)
    return sum(share * out.loss for out, share in module.weighted_losses(rollout))


def test_a_small_step_down_the_gradient_lowers_the_loss_on_the_same_pairs_and_noise():
    """Lower loss = the policy's error drops on the preferred samples relative to the dispreferred ones, against the
    reference (the margin); same pairs, levels and noise before and after the step."""
    module = dpo_module()
    rollout = module.rollout(prompts(2))
    state = module.generator.get_state()
    before = total_loss(module, rollout, state)
    parameters = list(module.policy.trainable_parameters())
    grads = torch.autograd.grad(before, parameters)
    with torch.no_grad():
        for p, g in zip(parameters, grads, strict=True):
            p -= 1e-3 * g / torch.cat([g.flatten() for g in grads]).norm()
        after = total_loss(module, rollout, state)
    assert float(after) < float(before.detach())


def test_two_step_fit_moves_the_adapter(fit):
    module = dpo_module()
    before = [p.detach().clone() for p in module.policy.trainable_parameters()]
    trainer, recorder = fit(module, prompt_loader(), max_steps=2)
    assert trainer.global_step == 2
    assert all(not torch.equal(b, p) for b, p in zip(before, module.policy.trainable_parameters(), strict=True))
    assert recorder.metric("train/dpo/pairs") == [2.0, 2.0]  # 2 prompts a step, each group one pair
    assert all(value > 0 for value in recorder.metric("train/loss/policy"))


def test_a_rollout_without_pairs_makes_no_update(fit):
    """All rewards equal: no pair, loss mass 0 on every rank, the update left out (the weights stay)."""

    class Flat(RednessReward):
        def score(self, outputs, samples, **kwargs):
            return [0.5] * len(outputs)

    module = FlowDPOModule(
        StandInPolicy(), [Flat()], FlowSamplingSettings(group_size=K, num_steps=T), dpo=FlowDPOSettings(beta=1.0)
    )
    rollout = module.rollout(prompts(1))
    assert float(module.loss_mass(rollout)) == 0.0
    ((out, share),) = list(module.weighted_losses(rollout))
    assert float(share) == 0.0 and float(out.loss.detach()) == 0.0
    before = [p.detach().clone() for p in module.policy.trainable_parameters()]
    fit(module, prompt_loader(2), max_steps=1)
    assert all(torch.equal(b, p) for b, p in zip(before, module.policy.trainable_parameters(), strict=True))
    assert module.empty_updates == 1


@pytest.mark.parametrize(
    ("sampling", "grpo", "message"),
    [
        ({"group_size": 1}, {}, "sampling.group_size must be >= 2"),
        ({}, {"group_ranks": 2}, "grpo.group_ranks must be 1"),
        ({"guidance_scale": 2.0}, {}, "sampling.guidance_scale to 1"),
        ({"shared_initial_noise": True}, {}, "shared_initial_noise: false"),
    ],
)
def test_options_dpo_cannot_train_with_are_refused_naming_them(sampling, grpo, message):
    with pytest.raises(ValueError, match=message):
        FlowDPOModule(StandInPolicy(), [RednessReward()], FlowSamplingSettings(**sampling), grpo=GRPOSettings(**grpo))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"beta": 0.0}, "dpo.beta"), ({"solver": "heun"}, "dpo.solver"), ({"timestep_fraction": 0.0}, "timestep")],
)
def test_bad_dpo_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlowDPOSettings(**kwargs)


def test_hyper_parameters_record_the_dpo_block():
    module = dpo_module()
    assert module.hparams["dpo"] == dataclasses.asdict(FlowDPOSettings(beta=50.0))


def test_tiny_sd3_two_step_fit(fit):
    """The embedded tiny SD3 with LoRA: online DPO trains its adapter, the reference being the adapter off."""
    from app.models.flow import FlowPolicy
    from app.settings import LoRASettings

    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    module = FlowDPOModule(
        policy,
        [RednessReward()],
        FlowSamplingSettings(group_size=2, num_steps=3),
        dpo=FlowDPOSettings(beta=50.0),
        optimizer=OptimizerSettings(learning_rate=1e-3),
    )
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    trainer, recorder = fit(module, prompt_loader(2, batch_size=1), max_steps=2)
    assert trainer.global_step == 2
    moved = [n for n, p in policy.named_parameters() if p.requires_grad and not torch.equal(before[n], p)]
    assert moved and all("lora" in n for n in moved)
    assert recorder.metric("train/dpo/pairs") == [1.0, 1.0]

"""FlowGRPOModule: step selection, log-prob bookkeeping, short fits on a stand-in policy and on the tiny SD3 policy."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from doubles import RednessReward, StandInPolicy
from prompt_samples import prompt_loader, prompts

from app.algorithms import group_advantages
from app.modules.checkpoints import RANK_STATES, derived_seed, saved_rank_state, seed_rng_states
from app.modules.flow_grpo import FlowGRPOModule
from app.sampling.flow import flow_sigmas
from app.settings import (
    FlowGRPOLossSettings,
    FlowGRPOSamplingSettings,
    GRPOSettings,
    OptimizerSettings,
    PipelineSettings,
)

K = 4
T = 4


SAMPLING_FIELDS = {field.name for field in dataclasses.fields(FlowGRPOSamplingSettings)} - {"group_size", "num_steps"}
GRPO_FIELDS = {field.name for field in dataclasses.fields(GRPOSettings)}
LOSS_FIELDS = {field.name for field in dataclasses.fields(FlowGRPOLossSettings)}
OPTIMIZER_FIELDS = {field.name for field in dataclasses.fields(OptimizerSettings)}


def flow_module(policy=None, **options) -> FlowGRPOModule:
    """A module on the stand-in policy with K trajectories of T steps at learning rate 1e-2; sampling, GRPO, loss and
    optimizer settings may be passed flat (gathered into their blocks), the module's own arguments as they are."""
    options.setdefault("learning_rate", 1e-2)

    def block(fields):
        return {key: options.pop(key) for key in fields & options.keys()}

    sampling = FlowGRPOSamplingSettings(group_size=K, num_steps=T, **block(SAMPLING_FIELDS))
    grpo, optimizer = GRPOSettings(**block(GRPO_FIELDS)), OptimizerSettings(**block(OPTIMIZER_FIELDS))
    loss = FlowGRPOLossSettings(**block(LOSS_FIELDS))
    policy = policy if policy is not None else StandInPolicy()
    return FlowGRPOModule(policy, [RednessReward()], sampling, grpo=grpo, loss=loss, optimizer=optimizer, **options)


def trained_sigmas(module: FlowGRPOModule) -> list[list[float]]:
    """Record, per training step, the sigmas at which the velocity is evaluated with gradients (the trained steps)."""
    seen: list[list[float]] = []
    velocity = module.policy.velocity

    def spy(latents, sigma, conditioning):
        if torch.is_grad_enabled():
            seen[-1].append(float(sigma[0]))
        return velocity(latents, sigma, conditioning)

    module.policy.velocity = spy
    original = module.training_step

    def step(batch, batch_idx):
        seen.append([])
        return original(batch, batch_idx)

    module.training_step = step
    return seen


# ---------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "kwargs",
    [
        {"eta": 0.0},
        {"sampler": "cps", "eta": 1.5},
        {"timestep_fraction": 0.0},
        {"sde_window": (3, 4)},
        {"micro_batch_size": 0},
    ],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        flow_module(**kwargs)


def test_one_denoising_step_is_refused_with_a_message_naming_it():
    with pytest.raises(ValueError, match=r"flow-GRPO needs num_steps >= 2 \(the last step is never trained\), got 1"):
        FlowGRPOModule(StandInPolicy(), [RednessReward()], FlowGRPOSamplingSettings(num_steps=1))


def test_the_defaults_are_the_documented_ones():
    """records_per_step 16, the flow learning rate 5e-6 (what the optimizer runs at), seed 0 (the rollout
    generator's seed on rank 0) and Flow-GRPO's clip range 1e-4 each way."""
    module = FlowGRPOModule(StandInPolicy(), [RednessReward()])
    assert module.records_per_step == module.hparams["records_per_step"] == 16
    assert module.hparams["loss"] == {
        "eps_low": 1e-4,
        "eps_high": 1e-4,
        "ratio_normalization": False,
        "advantage_clip": None,
    }
    assert module.hparams["seed"] == 0 and module.hparams["optimizer"]["learning_rate"] == 5e-6
    (group,) = module.configure_optimizers()["optimizer"].param_groups
    assert group["lr"] == 5e-6
    assert torch.equal(module.generator.get_state(), torch.Generator().manual_seed(0).get_state())


def test_settings_blocks_given_as_hyper_parameter_dicts_are_built_into_settings():
    """A resumed run hands the module its blocks as saved in the hyper-parameters: plain dicts."""
    module = FlowGRPOModule(
        StandInPolicy(),
        [RednessReward()],
        sampling={"group_size": 2, "num_steps": 3},
        grpo={"micro_batch_size": 3},
        optimizer={"learning_rate": 0.5},
        pipeline={"delay": 1, "workers": "inline"},
    )
    assert module.sampling == FlowGRPOSamplingSettings(group_size=2, num_steps=3)
    assert module.grpo.micro_batch_size == 3 and module.optimizer_settings.learning_rate == 0.5
    assert module.pipeline == PipelineSettings(delay=1, workers="inline")


def test_the_optimizer_settings_given_set_the_rate():
    module = flow_module(learning_rate=0.25)
    (group,) = module.configure_optimizers()["optimizer"].param_groups
    assert module.optimizer_settings.learning_rate == 0.25 and group["lr"] == 0.25


def test_the_sampler_runs_its_forward_passes_without_gradients_in_micro_batches():
    """grpo.micro_batch_size 3: the rollout of one prompt's K = 4 trajectories runs each velocity pass on 3 + 1 rows."""
    module = flow_module(micro_batch_size=3)
    rows = []
    velocity = module.policy.velocity

    def spy(latents, sigma, conditioning):
        rows.append(len(latents))
        return velocity(latents, sigma, conditioning)

    module.policy.velocity = spy
    module.rollout(prompts(1))
    assert rows == [3, 1] * T
    assert module.sampler.micro_batch_size == 3


class BluenessReward(RednessReward):
    """Mean blue channel of the decoded image."""

    def score(self, completions, samples):
        return torch.stack([image[2].float().mean() for image in completions]).cpu()


def test_validation_scores_the_eval_rewards_when_given():
    module = flow_module(seed=1, eval_rewards=[BluenessReward()])
    images = module.generate(prompts(), batch_idx=0)
    logged = {}
    module.log = lambda key, value, **kwargs: logged.__setitem__(key, float(value))
    module.validation_step(prompts(), 0)
    assert set(logged) == {"val/reward/total", "val/reward/blueness"}
    assert logged["val/reward/blueness"] == pytest.approx(float(images[:, 2].mean()))
    assert [c.name for c in module.rewards.components] == ["redness"]  # training still scores the rewards


# ----------------------------------------------------------------------------------------------------- rollout
@pytest.mark.parametrize("sampler", ["cps", "sde"])
def test_rescoring_a_stored_transition_reproduces_its_log_prob_exactly(sampler):
    module = flow_module(sampler=sampler)
    rollout = module.rollout(prompts())
    trajectory = rollout.sampled
    n = 2 * K
    assert trajectory.step_indices == [0, 1, 2]
    assert trajectory.latents.shape == trajectory.next_latents.shape == (n, 3, 4, 8, 8)
    assert trajectory.old_logprobs.shape == (n, 3) and trajectory.old_logprobs.dtype == torch.float32
    assert trajectory.images.shape == (n, 3, 16, 16) and trajectory.ref_logprobs is None
    torch.testing.assert_close(rollout.advantages, group_advantages(rollout.rewards.total, K))
    sigmas = trajectory.sigmas
    for j, i in enumerate(trajectory.step_indices):
        x = trajectory.latents[:, j]
        v = module.sampler.velocity(x, sigmas[i], trajectory.conditioning)
        out = module.sampler.step(
            x, v, float(sigmas[i]), float(sigmas[i + 1]), prev_sample=trajectory.next_latents[:, j]
        )
        assert torch.equal(out.log_prob, trajectory.old_logprobs[:, j])  # ratio exactly 1
    # consecutive stored steps chain: x_{t+1} of step i is x_t of step i + 1
    assert torch.equal(trajectory.next_latents[:, 0], trajectory.latents[:, 1])


def test_rollouts_are_reproducible_from_the_seed():
    first, second = flow_module(seed=3).rollout(prompts()), flow_module(seed=3).rollout(prompts())
    assert torch.equal(first.sampled.next_latents, second.sampled.next_latents)
    assert not torch.equal(first.sampled.next_latents, flow_module(seed=4).rollout(prompts()).sampled.next_latents)


def test_beta_scores_the_transitions_under_the_reference():
    trajectory = flow_module(beta=0.01).rollout(prompts()).sampled
    assert trajectory.ref_logprobs.shape == trajectory.old_logprobs.shape
    assert not torch.equal(trajectory.ref_logprobs, trajectory.old_logprobs)  # the adapter was off


# -------------------------------------------------------------------------------------------------------- fits
def test_two_step_fit_moves_every_adapter_weight_with_ratio_one(fit):
    module = flow_module()
    before = [p.detach().clone() for p in module.policy.trainable_parameters()]
    frozen = module.policy.base.weight.detach().clone()
    seen = trained_sigmas(module)
    trainer, recorder = fit(module, prompt_loader(), max_steps=2)
    assert trainer.global_step == 2
    assert all(not torch.equal(b, p) for b, p in zip(before, module.policy.trainable_parameters(), strict=True))
    assert torch.equal(frozen, module.policy.base.weight)
    assert recorder.metric("train/ratio_mean") == [1.0, 1.0]
    assert recorder.metric("train/clip_fraction") == [0.0, 0.0]
    assert recorder.metric("train/kl") == [0.0, 0.0]
    sigmas = flow_sigmas(T, shift=3.0)
    assert seen == [[float(s) for s in sigmas[:3]]] * 2  # steps 0..T-2, never the step onto 0
    metrics = recorder.steps[-1]["metrics"]
    for key in (
        "train/reward/total",
        "train/reward/redness",
        "train/loss/policy",
        "train/frac_zero_std",
        "train/grad_norm",
        "train/num_trained_steps",
    ):
        assert key in metrics, key
    records = recorder.steps[0]["outputs"]["records"]
    assert len(records) == 2 * K and {r.completion for r in records} == {"<image>"}
    assert abs(sum(r.advantage for r in records[:K])) < 1e-4


@pytest.mark.parametrize("kwargs", [{}, {"beta": 0.05, "num_iterations": 2, "drop_zero_std_groups": True}])
def test_micro_batches_reproduce_the_full_batch_update(fit, kwargs):
    """8 trajectories in micro-batches of 3 (3 + 3 + 2): the same rollout, losses and weights as all 8 at once."""
    full, micro = flow_module(seed=5, **kwargs), flow_module(seed=5, micro_batch_size=3, **kwargs)
    _, full_log = fit(full, prompt_loader(2), max_steps=1)
    _, micro_log = fit(micro, prompt_loader(2), max_steps=1)
    for key in ("train/reward/total", "train/loss/policy", "train/kl", "train/grad_norm"):
        assert micro_log.metric(key) == pytest.approx(full_log.metric(key), rel=1e-5, abs=1e-7), key
    for a, b in zip(full.policy.trainable_parameters(), micro.policy.trainable_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert not torch.equal(full.policy.lora_A, StandInPolicy().lora_A)  # the update did happen


def test_sde_window_trains_only_its_steps(fit):
    module = flow_module(sde_window=(1, 3))
    seen = trained_sigmas(module)
    _, recorder = fit(module, prompt_loader(2), max_steps=1)
    sigmas = flow_sigmas(T, shift=3.0)
    assert seen == [[float(sigmas[1]), float(sigmas[2])]]
    assert recorder.metric("train/num_trained_steps") == [2.0]


def test_a_moving_window_trains_later_steps_as_training_goes_on(fit):
    module = flow_module(sde_window=(0, 1), window_stride=1, window_every_n_steps=1)
    seen = trained_sigmas(module)
    _, recorder = fit(module, prompt_loader(6), max_steps=3)
    sigmas = flow_sigmas(T, shift=3.0)
    windows = [module.sampling.window_at(step) for step in range(3)]
    assert seen == [[float(sigmas[start])] for start, _ in windows]
    assert recorder.metric("train/first_trained_step") == [float(start) for start, _ in windows]
    assert len({start for start, _ in windows}) > 1  # it moved


def test_noise_std_weighting_weighs_each_trained_step_by_its_transition_s_noise(fit):
    from app.sampling.flow import cps_step

    module = flow_module(step_weighting="noise_std")
    rollout = module.rollout(prompts())
    sampled = rollout.sampled
    stds = [
        float(
            cps_step(
                torch.zeros(1, 1),
                torch.zeros(1, 1),
                float(sampled.sigmas[i]),
                float(sampled.sigmas[i + 1]),
                0.7,
                noise=torch.zeros(1, 1),
            ).std[0]
        )
        for i in sampled.step_indices
    ]  # fmt: skip
    weights = module.sampler.step_weights(sampled.sigmas, sampled.step_indices)
    assert (
        weights == pytest.approx([s / sum(stds) for s in stds]) and weights[0] > weights[-1]
    )  # noisy steps weigh more
    shares = [float(share) for _, share in module.weighted_losses(rollout)]
    assert sum(shares) == pytest.approx(1.0) and shares == pytest.approx(weights)  # one micro-batch per step
    uniform = flow_module()
    assert uniform.sampler.step_weights(sampled.sigmas, sampled.step_indices) == [1 / len(stds)] * len(stds)


def test_timestep_fraction_trains_a_subset(fit):
    module = flow_module(timestep_fraction=0.5)
    seen = trained_sigmas(module)
    fit(module, prompt_loader(), max_steps=2)
    sigmas = [float(s) for s in flow_sigmas(T, shift=3.0)[:3]]
    assert all(len(step) == 1 and step[0] in sigmas for step in seen)


def test_kl_and_several_iterations(fit):
    module = flow_module(beta=0.01, num_iterations=2)
    _, recorder = fit(module, prompt_loader(2), max_steps=1)
    metrics = recorder.steps[0]["metrics"]
    assert metrics["train/kl"] > 0
    assert metrics["train/ratio_mean"] != 1.0  # the second iteration's ratio, after one update


def test_validation_logs_deterministic_rewards():
    module = flow_module(seed=1)
    first, second = module.generate(prompts(), batch_idx=0), module.generate(prompts(), batch_idx=0)
    assert first.shape == (2, 3, 16, 16) and torch.equal(first, second)
    logged = {}
    module.log = lambda key, value, **kwargs: logged.__setitem__(key, float(value))
    module.validation_step(prompts(), 0)
    assert set(logged) == {"val/reward/total", "val/reward/redness"}
    assert logged["val/reward/redness"] == pytest.approx(float(first[:, 0].mean()))


# ------------------------------------------------------------------------------------------- tiny SD3 policy
@pytest.fixture(scope="module")
def sd3_fit(fit):
    from app.models.flow import FlowPolicy
    from app.settings import LoRASettings

    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    module = flow_module(policy, learning_rate=1e-3)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    trainer, recorder = fit(module, prompt_loader(2, batch_size=1), max_steps=2)
    after = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    return module, trainer, recorder, before, after


def test_tiny_sd3_fit_moves_every_lora_weight_with_ratio_one(sd3_fit):
    module, trainer, recorder, before, after = sd3_fit
    assert trainer.global_step == 2
    assert before and all("lora" in n for n in before)
    # SD3's last block is context_pre_only: its context-token outputs are dropped, so the context query projection
    # of that block never reaches the velocity and its adapter gets no gradient.
    dead = f"transformer_blocks.{len(module.policy.transformer.transformer_blocks) - 1}.attn.add_q_proj."
    unchanged = sorted(n for n in before if dead not in n and torch.equal(before[n], after[n]))
    assert not unchanged, unchanged
    assert recorder.metric("train/ratio_mean") == [1.0, 1.0]
    assert "train/reward/redness" in recorder.steps[-1]["metrics"]


def test_tiny_sd3_rescored_log_probs_match_the_rollout(sd3_fit):
    module = sd3_fit[0]
    trajectory = module.rollout(prompts(1)).sampled
    sigmas = trajectory.sigmas
    for j, i in enumerate(trajectory.step_indices):
        x = trajectory.latents[:, j]
        v = module.sampler.velocity(x, sigmas[i], trajectory.conditioning)
        out = module.sampler.step(
            x, v, float(sigmas[i]), float(sigmas[i + 1]), prev_sample=trajectory.next_latents[:, j]
        )
        assert torch.equal(out.log_prob, trajectory.old_logprobs[:, j])


@pytest.mark.parametrize("dropout", [0.05, 0.3])
def test_tiny_sd3_under_lora_dropout_starts_each_rollout_at_ratio_exactly_one(dropout):
    """The transitions are drawn, stored and re-scored for the loss by one network: with LoRA dropout (and a non-zero
    adapter, so the dropout reaches the velocity) the first update of stored log-probs has ratio exactly 1."""
    from app.models.flow import FlowPolicy
    from app.settings import LoRASettings

    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8, dropout=dropout))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    module = flow_module(policy, num_iterations=2)
    rollout = module.rollout(prompts(1))
    outs = [out for out, _ in module.weighted_losses(rollout)]
    assert len(outs) == len(rollout.sampled.step_indices) > 1
    assert all(float(out.ratio_mean) == 1.0 and float(out.clip_fraction) == 0.0 for out in outs)


def test_checkpoints_carry_the_rollout_generator():
    module = flow_module(seed=5)
    module.rollout(prompts())
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    expected = module.rollout(prompts()).sampled.next_latents
    resumed = flow_module(seed=0)
    resumed.on_load_checkpoint(checkpoint)
    assert torch.equal(resumed.rollout(prompts()).sampled.next_latents, expected)


def on_rank(module: FlowGRPOModule, rank: int, world_size: int, checkpoint: dict) -> FlowGRPOModule:
    """``module`` after loading ``checkpoint`` as process ``rank`` of ``world_size``."""
    module._trainer = SimpleNamespace(world_size=world_size, global_rank=rank)
    module.on_load_checkpoint(checkpoint)
    module._trainer = None
    return module


def test_each_rank_takes_its_own_rollout_generator_back():
    saved = [flow_module(seed=5), flow_module(seed=6)]  # two ranks' modules, after a rollout each
    for module in saved:
        module.rollout(prompts())
    checkpoint = {RANK_STATES: [module.rank_state() for module in saved]}
    expected = [module.rollout(prompts()).sampled.next_latents for module in saved]
    for rank in (0, 1):
        resumed = on_rank(flow_module(seed=0), rank, 2, checkpoint)
        assert torch.equal(resumed.rollout(prompts()).sampled.next_latents, expected[rank]), f"rank {rank}"


def test_a_rank_the_checkpoint_holds_no_generator_for_draws_noise_of_its_own(caplog):
    """A checkpoint of one process holds rank 0's rollout generator only: resumed on three, rank 0 continues it, every
    other rank draws from a seed derived for it (not rank 0's state, not the same on two ranks), the same on every
    resume."""
    saved = flow_module(seed=5)
    saved.rollout(prompts())
    checkpoint = {RANK_STATES: [saved.rank_state()]}
    continued = saved.rollout(prompts()).sampled.next_latents
    latents = [
        on_rank(flow_module(seed=5), rank, 3, checkpoint).rollout(prompts()).sampled.next_latents for rank in range(3)
    ]
    assert torch.equal(latents[0], continued)
    assert not torch.equal(latents[1], continued) and not torch.equal(latents[2], continued)
    assert not torch.equal(latents[1], latents[2])
    unresumed = flow_module(seed=6).rollout(prompts()).sampled.next_latents  # rank 1's generator seed: seed + rank
    assert not torch.equal(latents[1], unresumed), "not the noise rank 1 starts a fresh run with"
    again = on_rank(flow_module(seed=5), 1, 3, checkpoint).rollout(prompts()).sampled.next_latents
    assert torch.equal(again, latents[1])
    assert any("rank 1 has none of its own" in record.getMessage() for record in caplog.records)


def test_a_rank_without_saved_states_seeds_its_generators_from_the_fresh_seed():
    """The fresh seed a rank without states of its own gets (from a checkpoint of one process, resumed on two) seeds
    the global generators, as every module's, and the rollout generator from ``derived_seed(seed,
    "rollout_generator")``: a stream of its own, the same on every resume."""
    checkpoint = {RANK_STATES: [flow_module(seed=5).rank_state()]}
    _, fresh = saved_rank_state(checkpoint, 1, 2)
    seed_rng_states(fresh)
    expected_global = torch.rand(4)
    seed_rng_states(99)
    module = on_rank(flow_module(seed=5), 1, 2, checkpoint)
    assert torch.equal(torch.rand(4), expected_global)
    expected = torch.Generator().manual_seed(derived_seed(fresh, "rollout_generator"))
    assert torch.equal(module.generator.get_state(), expected.get_state())


def test_a_small_step_along_the_loss_gradient_favours_above_average_trajectories():
    """Direction of the update: after a small step against the loss gradient, the stored transitions of trajectories
    with a positive advantage became more likely and those with a negative one less (sum_i A_i dlogp_i > 0)."""
    module = flow_module(seed=11)
    rollout = module.rollout(prompts(4))
    trajectory = rollout.sampled

    def logprobs():
        with torch.no_grad():
            return torch.stack(
                [
                    module.sampler.step(
                        trajectory.latents[:, j],
                        module.sampler.velocity(
                            trajectory.latents[:, j], trajectory.sigmas[i], trajectory.conditioning
                        ),
                        float(trajectory.sigmas[i]),
                        float(trajectory.sigmas[i + 1]),
                        prev_sample=trajectory.next_latents[:, j],
                    ).log_prob
                    for j, i in enumerate(trajectory.step_indices)
                ],
                dim=1,
            ).mean(dim=1)  # [N]

    class NoStep:
        def step(self):
            pass

        def zero_grad(self, set_to_none=True):
            pass

    module.manual_backward = lambda loss: loss.backward()
    module.grpo = dataclasses.replace(module.grpo, gradient_clip_val=0.0)
    before = logprobs()
    module._update([rollout], NoStep())
    parameters = module.policy.trainable_parameters()
    norm = torch.cat([p.grad.flatten() for p in parameters]).norm()
    with torch.no_grad():
        for p in parameters:
            p -= 1e-3 * p.grad / norm
    change = logprobs() - before  # [N]
    assert float((rollout.advantages * change).sum()) > 0
    assert torch.corrcoef(torch.stack([rollout.advantages, change]))[0, 1] > 0.3


@pytest.mark.parametrize(
    ("num_iterations", "keep"),
    [
        (2, [True, True, False, True]),  # the stored log-probs give the ratio; both clip bounds are hit
        (1, [False, False, False, True]),
    ],  # ratio exactly 1 whatever was stored; one kept row carries the whole weight
)
def test_weighted_losses_are_the_clipped_surrogate_plus_k3_kl_averaged_over_kept_rows_and_steps(num_iterations, keep):
    """4 trajectories of 3 trained steps in micro-batches of 3 rows (3 + 1): two weighted parts per step, whose
    weighted sum is the mean over kept rows and trained steps of -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    + beta * k3(ref - logp)."""
    eps_low, eps_high, beta = 0.1, 0.3, 0.5
    module = flow_module(
        seed=2, micro_batch_size=3, num_iterations=num_iterations, eps_low=eps_low, eps_high=eps_high, beta=beta
    )
    rollout = module.rollout(prompts(1))
    logp = rollout.sampled.old_logprobs  # [4, 3], what rescoring reproduces exactly under the unchanged policy
    stored_ratio = torch.tensor([1.5, 0.5, 2.0, 0.5])[:, None]  # [4, 1], far outside both clip bounds
    advantages, mask = torch.tensor([1.0, -1.0, 0.5, 2.0]), torch.tensor(keep)
    stored = dataclasses.replace(
        rollout.sampled,
        old_logprobs=logp - stored_ratio.log(),
        ref_logprobs=logp + torch.tensor([0.2, -0.3, 0.1])[None],
    )
    trajectory = dataclasses.replace(rollout, sampled=stored, advantages=advantages, loss_mask=mask)
    parts = list(module.weighted_losses(trajectory))
    assert len(parts) == 3 * 2
    weights = torch.stack([weight for _, weight in parts]).view(3, 2)  # [step, micro-batch]
    expected_weights = torch.stack([mask[:3].sum(), mask[3:].sum()]) / mask.sum() / 3  # [2]
    torch.testing.assert_close(weights, expected_weights.expand(3, 2))
    ratio = stored_ratio if module.stores_behaviour_logprobs else torch.ones(4, 1)  # [4, 1]
    adv = advantages[:, None]  # [4, 1]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)  # [4, 1]
    d = stored.ref_logprobs - logp  # [4, 3]
    per_entry = -surrogate + beta * (d.exp() - d - 1)  # [4, 3]
    expected = per_entry[mask].mean()
    total = sum(weight * out.loss for out, weight in parts)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shared", [True, False])
def test_shared_initial_noise_starts_a_group_from_one_noise(shared):
    trajectory = flow_module(seed=3, shared_initial_noise=shared).rollout(prompts(2)).sampled
    start = trajectory.latents[:, 0].reshape(2, K, -1)  # x at step 0, grouped by prompt
    assert not torch.equal(start[0, 0], start[1, 0]), "groups start from different noise"
    assert torch.equal(start[0, 0], start[0, 1]) == shared
    assert not torch.equal(trajectory.next_latents[0, 0], trajectory.next_latents[1, 0]), "the sampler's noise differs"

"""FlowNFTModule: settings it refuses, rollouts of clean samples from the sampling policy, the update against that
policy, its moving average and its place in checkpoints, on the stand-in policy and on the tiny SD3 policy."""

import dataclasses

import lightning as L
import pytest
import torch
from doubles import RednessReward, StandInPolicy
from lightning.fabric.plugins.environments.lightning import find_free_network_port
from prompt_samples import prompt_loader, prompts

from app.models import FlowPolicy
from app.modules.flow_nft import FlowNFTModule
from app.parallel import FSDP2Strategy
from app.sampling.flow import flow_sigmas
from app.settings import FlowSamplingSettings, GRPOSettings, LoRASettings, NFTSettings, OptimizerSettings
from app.types import SampledImages

K = 4
T = 4


SAMPLING_FIELDS = {f.name for f in dataclasses.fields(FlowSamplingSettings)} - {"group_size", "num_steps"}
NFT_FIELDS = {f.name for f in dataclasses.fields(NFTSettings)}
GRPO_FIELDS = {f.name for f in dataclasses.fields(GRPOSettings)}


def nft_module(policy=None, learning_rate=1e-2, **options) -> FlowNFTModule:
    """A module on the stand-in policy with K samples of T steps; settings passed flat, gathered into their blocks
    (``timestep_fraction`` goes to ``nft``)."""

    def block(fields):
        return {key: options.pop(key) for key in fields & options.keys()}

    nft = NFTSettings(**block(NFT_FIELDS))
    sampling = FlowSamplingSettings(group_size=K, num_steps=T, **block(SAMPLING_FIELDS))
    grpo = GRPOSettings(**block(GRPO_FIELDS))
    optimizer = OptimizerSettings(learning_rate=learning_rate)
    policy = policy if policy is not None else StandInPolicy()
    return FlowNFTModule(policy, [RednessReward()], sampling, nft, grpo=grpo, optimizer=optimizer, **options)


# ---------------------------------------------------------------------------------------------- settings
def test_guidance_and_a_deterministic_solver_on_shared_noise_are_refused():
    with pytest.raises(ValueError, match="CFG-free"):
        nft_module(guidance_scale=2.0)
    with pytest.raises(ValueError, match="samples of a group would be one"):
        nft_module(shared_initial_noise=True)
    nft_module(shared_initial_noise=True, solver="stochastic")  # the sampler's noise tells the samples apart


@pytest.mark.parametrize("solver", ["euler", "unipc"])
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"sampler": "sde"}, "sampling.sampler"),
        ({"eta": 0.5}, "sampling.eta"),
        ({"sampler": "sde", "eta": 0.5}, "sampling.sampler, sampling.eta"),
    ],
)
def test_the_stochastic_samplers_options_are_refused_with_a_deterministic_solver(solver, kwargs, named):
    with pytest.raises(ValueError, match=f"nft.solver '{solver}' is deterministic: .*drop .*{named}"):
        nft_module(solver=solver, **kwargs)
    module = nft_module(solver="stochastic", **kwargs)  # the stochastic solver draws with them
    assert (module.sampling.sampler, module.sampling.eta) == (kwargs.get("sampler", "cps"), kwargs.get("eta", 0.7))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": 0.0}, "nft.beta"),
        ({"advantage_clip": -1.0}, "nft.advantage_clip"),
        ({"solver": "dpm"}, "nft.solver"),
        ({"timestep_fraction": 0.0}, "nft.timestep_fraction"),
        ({"old_decay_max": 1.0}, "old_decay_max"),
    ],
)
def test_bad_nft_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NFTSettings(**kwargs)


def test_the_old_decay_follows_the_reference_schedule():
    """decay_type 1 of the reference code (rate 0.001, max 0.5) and type 2 (75 flat steps, 0.0075, 0.999)."""
    one = NFTSettings()
    assert [one.old_decay(s) for s in (0, 1, 100, 499, 500, 10_000)] == pytest.approx([0, 0.001, 0.1, 0.499, 0.5, 0.5])
    two = NFTSettings(old_decay_rate=0.0075, old_decay_max=0.999, old_decay_start=75)
    assert [two.old_decay(s) for s in (0, 75, 76, 175, 10_000)] == pytest.approx([0, 0, 0.0075, 0.75, 0.999])


def test_the_kl_reference_pass_leaves_fsdp2_reducing_float32_gradients(tmp_path, monkeypatch):
    """bf16 frozen weights, a float32 adapter, FSDP2 gathering in bf16 and reducing in float32, ``grpo.beta > 0`` (the
    SD3.5 recipe's setup): an explicit gather re-reads which parameters train to choose the gradients' dtype, so a
    gather made while the adapter is off (the reference pass) left the next backward reducing bf16 gradients into the
    float32 adapter, an error."""
    # the one-process group's rendezvous, set here so that it is undone after the test (Lightning would set it for good)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_network_port()))
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8), dtype="bfloat16")
    sampling = FlowSamplingSettings(group_size=2, num_steps=2)
    module = FlowNFTModule(policy, [RednessReward()], sampling, grpo=GRPOSettings(beta=0.1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=FSDP2Strategy(param_dtype="bfloat16", reduce_dtype="float32"),
        precision="bf16-mixed",
        max_steps=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(module, prompt_loader(2))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert trainer.global_step == 1
    adapter = [p.full_tensor() for p in module.policy.trainable_parameters()]
    assert {p.dtype for p in adapter} == {torch.float32} and all(bool(p.isfinite().all()) for p in adapter)


# ----------------------------------------------------------------------------------------------- rollouts
@pytest.mark.parametrize("solver", ["euler", "unipc", "stochastic"])
def test_a_rollout_keeps_the_clean_latents_the_images_decode_from(solver):
    module = nft_module(solver=solver)
    rollout = module.rollout(prompts())
    drawn = rollout.sampled
    assert isinstance(drawn, SampledImages)
    assert drawn.latents.shape == (2 * K, 4, 8, 8)
    torch.testing.assert_close(drawn.images, module.policy.decode(drawn.latents), rtol=0, atol=0)
    assert len({tuple(image.flatten()[:4].tolist()) for image in drawn.images}) == 2 * K  # every sample differs


def test_the_euler_rollout_is_the_deterministic_sample_of_its_noise():
    module = nft_module(seed=3)
    drawn = module.rollout(prompts(1)).sampled
    noise = module.policy.initial_noise(K, generator=torch.Generator().manual_seed(3))
    final = module.sampler.denoise(drawn.conditioning, noise, flow_sigmas(T, shift=3.0)).final
    torch.testing.assert_close(drawn.latents, final, rtol=0, atol=0)


def test_rollouts_are_drawn_by_the_sampling_policy_not_the_trained_weights():
    module = nft_module(seed=1)
    module.sampling_policy()  # v_old: the weights as they are now
    with torch.no_grad():
        for p in module.policy.trainable_parameters():
            p.add_(1.0)  # the trained weights move, the sampling policy does not
    drawn = module.rollout(prompts(1)).sampled
    expected = nft_module(seed=1).rollout(prompts(1)).sampled  # the same weights as v_old, the same noise
    torch.testing.assert_close(drawn.latents, expected.latents, rtol=0, atol=0)
    moved = nft_module(seed=1)
    with torch.no_grad():
        for p in moved.policy.trainable_parameters():
            p.add_(1.0)
    assert not torch.equal(moved.rollout(prompts(1)).sampled.latents, drawn.latents)


# -------------------------------------------------------------------------------------------------------- fits
def test_a_fit_moves_the_weights_and_the_sampling_policy_follows_by_its_schedule(fit):
    module = nft_module(old_decay_rate=0.25, old_decay_max=0.5)
    before = [p.detach().clone() for p in module.policy.trainable_parameters()]
    trainer, recorder = fit(module, prompt_loader(), max_steps=2)
    assert trainer.global_step == 2
    after = module.policy.trainable_parameters()
    assert all(not torch.equal(b, p) for b, p in zip(before, after, strict=True))
    # decay 0 after step 1 (v_old = the weights then), 0.25 after step 2: v_old is 3/4 of the way to the weights
    assert recorder.metric("train/nft/old_decay") == [0.0, 0.25]
    old = module.sampling_policy()
    assert int(old.steps) == 2
    assert all(not torch.equal(a, p) for a, p in zip(old.averages, after, strict=True))
    metrics = recorder.steps[-1]["metrics"]
    assert "train/ratio_mean" not in metrics and "train/clip_fraction" not in metrics
    for key in ("train/reward/total", "train/loss/policy", "train/grad_norm", "train/nft/optimality"):
        assert key in metrics, key


def test_the_update_trains_at_the_chosen_share_of_the_schedule_s_noise_levels(fit):
    module = nft_module(timestep_fraction=0.5)
    seen: list[float] = []
    velocity = module.policy.velocity

    def spy(latents, sigma, conditioning):
        if torch.is_grad_enabled():
            seen.append(float(sigma[0]))
        return velocity(latents, sigma, conditioning)

    module.policy.velocity = spy
    fit(module, prompt_loader(2), max_steps=1)
    schedule = [float(s) for s in flow_sigmas(T, shift=3.0)[:-1]]
    assert len(seen) == 2 and set(seen) <= set(schedule)


def test_micro_batches_reproduce_the_full_batch_update(fit):
    full, micro = nft_module(seed=5, beta=0.05), nft_module(seed=5, beta=0.05, micro_batch_size=3)
    _, full_log = fit(full, prompt_loader(2), max_steps=1)
    _, micro_log = fit(micro, prompt_loader(2), max_steps=1)
    for key in ("train/loss/policy", "train/kl", "train/grad_norm"):
        assert micro_log.metric(key) == pytest.approx(full_log.metric(key), rel=1e-5, abs=1e-7), key
    for a, b in zip(full.policy.trainable_parameters(), micro.policy.trainable_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_while_v_old_is_the_trained_weights_the_update_is_flow_matching_weighted_by_2r_minus_1():
    """The module's gradient, with v_old = v_theta (the first update), is that of
    ``mean over levels and samples of (2 r - 1) ||v_theta(x_t) - (eps - x_0)||^2`` at the same noised samples
    ``x_t = (1 - t) x_0 + t eps``: good samples pull the velocity towards their flows, bad ones push it away."""
    module = nft_module(seed=2, weighting="velocity", beta=0.5)
    rollout = module.rollout(prompts(2))
    drawn, parameters = rollout.sampled, module.policy.trainable_parameters()
    module.sampling_policy()
    state = module.generator.get_state()
    sum(share * out.loss for out, share in module.weighted_losses(rollout)).backward()
    gradients = [p.grad.clone() for p in parameters]
    for p in parameters:
        p.grad = None
    module.generator.set_state(state)  # the same noise again (timestep_fraction 1 draws no levels)
    r = (0.5 + 0.5 * rollout.advantages / 5.0).clamp(0, 1)
    losses = []
    for sigma in drawn.sigmas[:-1]:
        eps = torch.randn(drawn.latents.shape, generator=module.generator)
        x = (1 - sigma) * drawn.latents + sigma * eps
        error = (module.policy.velocity(x, sigma.expand(len(x)), drawn.conditioning) - (eps - drawn.latents)).square()
        losses.append(((2 * r - 1) * error.flatten(1).mean(dim=1)).mean())
    torch.stack(losses).mean().backward()
    # equal in exact arithmetic; in float32 the module's r and (1 - r) terms each carry a few ulp of the larger of the
    # two and cancel to (2r - 1), so the error is relative to the terms (order 1) rather than to their difference: 1e-4
    for got, expected in zip(gradients, [p.grad for p in parameters], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)


def test_checkpoints_carry_the_sampling_policy(fit, tmp_path):
    module = nft_module()
    trainer, _ = fit(module, prompt_loader(), max_steps=2)
    path = tmp_path / "nft.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=True)["state_dict"]
    saved = [state[f"old_policy.average_{i}"] for i in range(len(module.policy.trainable_parameters()))]
    for a, b in zip(saved, module.sampling_policy().averages, strict=True):
        assert torch.equal(a, b)
    resumed = nft_module()
    resumed.sampling_policy()
    resumed.load_state_dict(state, strict=False)
    assert all(torch.equal(a, b) for a, b in zip(resumed.sampling_policy().averages, saved, strict=True))
    assert int(resumed.sampling_policy().steps) == 2


def test_tiny_sd3_fit_moves_the_lora_weights(fit):
    from app.models.flow import FlowPolicy
    from app.settings import LoRASettings

    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    module = nft_module(policy, learning_rate=1e-3, timestep_fraction=0.5)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    trainer, recorder = fit(module, prompt_loader(2, batch_size=1), max_steps=2)
    after = {n: p.detach() for n, p in policy.named_parameters() if p.requires_grad}
    assert trainer.global_step == 2
    # as in flow-GRPO's test: the last block's context query projection never reaches the velocity
    dead = f"transformer_blocks.{len(policy.transformer.transformer_blocks) - 1}.attn.add_q_proj."
    unchanged = sorted(n for n in before if dead not in n and torch.equal(before[n], after[n]))
    assert not unchanged, unchanged
    assert "train/reward/redness" in recorder.steps[-1]["metrics"]

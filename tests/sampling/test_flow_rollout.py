"""The flow denoising loop on the tiny SD3 policy (a real diffusers transformer): micro-batched and guided velocities,
kept transitions that rescore exactly, the Euler ODE, initial noise, deterministic samples. The loop's logic on a
closed-form stand-in policy is in test_flow_rollout_logic.py."""

import inspect

import pytest
import torch

from app.models import FlowPolicy
from app.sampling import FlowSampler
from app.sampling.flow import unipc_sample
from app.sampling.flow_rollout import DenoisingPolicy
from app.settings import FlowGRPOSamplingSettings, LoRASettings
from app.tiny.flow_models import TINY_FLOWS

PROMPTS = ["a red dot left of a blue dot", "three squares", "a green circle"]


@pytest.fixture(scope="module")
def policy() -> FlowPolicy:
    torch.manual_seed(0)
    return FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))


# ---------------------------------------------------------------------------------------------- velocities
def test_micro_batched_velocities_equal_the_full_batch(policy):
    x = policy.initial_noise(3, torch.Generator().manual_seed(1))
    conditioning = policy.encode_prompts(PROMPTS)
    full, micro = FlowSampler(policy, FlowGRPOSamplingSettings()), FlowSampler(policy, FlowGRPOSamplingSettings(), 2)
    with torch.no_grad():
        expected = full.velocity(x, torch.tensor(0.7), conditioning)
        torch.testing.assert_close(micro.velocity(x, torch.tensor(0.7), conditioning), expected, rtol=1e-5, atol=1e-6)
        one_row = {k: v[:1] for k, v in conditioning.items()}  # broadcast to every row
        broadcast = micro.velocity(x, torch.tensor(0.7), one_row)
    torch.testing.assert_close(broadcast[0], expected[0], rtol=1e-5, atol=1e-6)


def test_guidance_mixes_in_the_empty_prompt_and_keeps_the_gradient(policy):
    x = policy.initial_noise(2, torch.Generator().manual_seed(2))
    sigma, conditioning = torch.full((2,), 0.6), policy.encode_prompts(PROMPTS[:2])
    with torch.no_grad():
        v_cond = policy.velocity(x, sigma, conditioning)
        v_uncond = policy.velocity(x, sigma, policy.encode_prompts(["", ""]))
    guided = FlowSampler(policy, FlowGRPOSamplingSettings(guidance_scale=4.0)).velocity(x, sigma, conditioning)
    torch.testing.assert_close(guided, v_uncond + 4.0 * (v_cond - v_uncond), atol=1e-5, rtol=1e-5)
    assert guided.requires_grad  # trained steps differentiate through both passes


# ---------------------------------------------------------------------------------------------- the loop
def test_denoise_keeps_chained_transitions_whose_log_probs_rescore_exactly(policy):
    sampler = FlowSampler(policy, FlowGRPOSamplingSettings(num_steps=4, eta=0.7))
    sigmas = policy.sigmas(4).float()
    conditioning = sampler.conditioning(PROMPTS[:2], rows_per_prompt=2)  # 4 rows
    noise = policy.initial_noise(4, torch.Generator().manual_seed(3))
    kept = sampler.denoise(conditioning, noise, sigmas, [0, 1, 2], [0, 1, 2], torch.Generator().manual_seed(4))
    assert kept.latents.shape == kept.next_latents.shape == (4, 3, 4, 16, 16) and kept.logprobs.shape == (4, 3)
    assert torch.equal(kept.latents[:, 0], noise) and torch.equal(kept.next_latents[:, 1], kept.latents[:, 2])
    with torch.no_grad():
        rescored = sampler.transition_logprobs(conditioning, sigmas, [0, 1, 2], kept.latents, kept.next_latents)
    assert torch.equal(rescored, kept.logprobs)
    with pytest.raises(ValueError, match=r"kept steps \[3\] are not stochastic"):
        sampler.denoise(conditioning, noise, sigmas, [0, 1], [1, 3])


def test_euler_denoising_is_the_ode_and_keeps_nothing(policy):
    sampler = FlowSampler(policy, FlowGRPOSamplingSettings(num_steps=3))
    sigmas = policy.sigmas(3).float()
    conditioning = sampler.conditioning(PROMPTS[:1])
    x = policy.initial_noise(1, torch.Generator().manual_seed(5))
    out = sampler.denoise(conditioning, x, sigmas)
    with torch.no_grad():
        for i in range(3):
            x = x + (sigmas[i + 1] - sigmas[i]) * policy.velocity(x, sigmas[i : i + 1], conditioning)
    torch.testing.assert_close(out.final, x, rtol=1e-5, atol=1e-6)
    assert out.latents.shape[1] == 0 and out.logprobs.shape == (1, 0)


def test_a_unipc_tail_takes_the_steps_after_the_window(policy):
    sampler = FlowSampler(policy, FlowGRPOSamplingSettings(num_steps=6))
    sigmas = policy.sigmas(6).float()
    conditioning = sampler.conditioning(PROMPTS[:2])
    noise = policy.initial_noise(2, torch.Generator().manual_seed(6))
    mixed = sampler.denoise(conditioning, noise, sigmas, [1, 2], [1, 2], torch.Generator().manual_seed(7), "unipc")
    # the same window on the schedule cut after it, then UniPC from there (steps 3, 4, 5) to the sample
    head = sampler.denoise(conditioning, noise, sigmas[:4], [1, 2], [1, 2], torch.Generator().manual_seed(7))
    with torch.no_grad():
        tail = unipc_sample(lambda z, sigma: sampler.velocity(z, sigma, conditioning), head.final, sigmas[3:])
    assert torch.equal(mixed.final, tail) and torch.equal(mixed.logprobs, head.logprobs)
    euler = sampler.denoise(conditioning, noise, sigmas, [1, 2], [1, 2], torch.Generator().manual_seed(7))
    assert torch.equal(euler.logprobs, mixed.logprobs) and not torch.equal(euler.final, mixed.final)


def test_a_compressed_unipc_tail_takes_that_many_steps_of_the_remaining_schedule(policy):
    settings = FlowGRPOSamplingSettings(num_steps=8, ode_tail="unipc", ode_tail_steps=2)
    sampler = FlowSampler(policy, settings)
    sigmas = policy.sigmas(8).float()
    conditioning = sampler.conditioning(PROMPTS[:2])
    noise = policy.initial_noise(2, torch.Generator().manual_seed(6))
    calls = []
    velocity = sampler.velocity
    sampler.velocity = lambda *args: calls.append(1) or velocity(*args)
    mixed = sampler.denoise(conditioning, noise, sigmas, [0, 1], [0, 1], torch.Generator().manual_seed(7), "unipc")
    assert len(calls) == 2 + 2  # the window's two steps, then two UniPC steps for the six left
    sampler.velocity = velocity
    head = sampler.denoise(conditioning, noise, sigmas[:3], [0, 1], [0, 1], torch.Generator().manual_seed(7))
    with torch.no_grad():  # the tail's schedule: sigmas 2, 5 and 8 of the 8-step schedule
        tail = unipc_sample(lambda z, s: sampler.velocity(z, s, conditioning), head.final, sigmas[[2, 5, 8]])
    assert torch.equal(mixed.final, tail)


def test_a_coarser_schedule_keeps_its_ends_and_spaces_its_steps_evenly():
    from app.sampling.flow_rollout import coarser

    sigmas = torch.linspace(1, 0, 7)  # 6 steps
    assert torch.equal(coarser(sigmas, 3), sigmas[[0, 2, 4, 6]])
    assert torch.equal(coarser(sigmas, 6), sigmas) and torch.equal(coarser(sigmas, None), sigmas)
    assert torch.equal(coarser(sigmas, 1), sigmas[[0, 6]])
    with pytest.raises(ValueError, match="ode_tail_steps compresses the UniPC tail"):
        FlowGRPOSamplingSettings(ode_tail_steps=2)


@pytest.mark.parametrize("shared", [True, False])
def test_initial_noise_is_shared_within_a_group_only_when_asked(policy, shared):
    sampler = FlowSampler(policy, FlowGRPOSamplingSettings(group_size=3, shared_initial_noise=shared))
    noise = sampler.initial_noise(2, torch.Generator().manual_seed(6)).reshape(2, 3, -1)
    assert torch.equal(noise[0, 0], noise[0, 1]) == shared
    assert not torch.equal(noise[0, 0], noise[1, 0])


def test_generate_is_deterministic_per_seed(policy):
    sampler = FlowSampler(policy, FlowGRPOSamplingSettings(num_steps=2))
    first, again = sampler.generate(PROMPTS[:2], seed=7), sampler.generate(PROMPTS[:2], seed=7)
    assert first.shape == (2, 3, 64, 64) and torch.equal(first, again)
    assert first.min() >= 0 and first.max() <= 1
    assert not torch.equal(first, sampler.generate(PROMPTS[:2], seed=8))


# ---------------------------------------------------------------------------------- groups spread over ranks
def _whole_from_shares(parts: list[torch.Tensor], num_prompts: int) -> torch.Tensor:
    """Rows of the R shares ``[B * K / R, ...]`` put back in the whole groups' order ``[B * K, ...]``."""
    split = torch.stack([p.view(num_prompts, -1, *p.shape[1:]) for p in parts], dim=1)  # [B, R, K / R, ...]
    return split.flatten(0, 2)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("shared", [False, True])
def test_the_shares_of_a_group_are_what_one_process_draws_for_the_whole_group(policy, ranks, shared):
    """Each rank draws with the same generator state and keeps its rows: put together, the trajectories, their
    log-densities and the decoded samples are one process's, bit for bit (the same noise reaches every row). One row
    per forward pass, so that no row's velocity is summed by kernels of another batch size."""
    from app.types import GroupShare, VisualSample

    settings = FlowGRPOSamplingSettings(group_size=4, num_steps=4, eta=0.7, shared_initial_noise=shared)
    sampler = FlowSampler(policy, settings, micro_batch_size=1)
    samples = [VisualSample([], prompt, "toy") for prompt in PROMPTS[:2]]
    whole = sampler.draw(samples, torch.Generator().manual_seed(5), reference=False)
    shares = [
        sampler.draw(samples, torch.Generator().manual_seed(5), reference=False, share=GroupShare(i, ranks, 4))
        for i in range(ranks)
    ]
    assert shares[0].latents.shape[0] == 2 * 4 // ranks and shares[0].step_indices == whole.step_indices
    for field in ("latents", "next_latents", "old_logprobs", "images"):
        got = _whole_from_shares([getattr(s, field) for s in shares], 2)
        assert torch.equal(got, getattr(whole, field)), field


def test_the_shares_of_a_stochastic_sample_draw_are_one_process_s(policy):
    from app.types import GroupShare, VisualSample

    sampler = FlowSampler(policy, FlowGRPOSamplingSettings(group_size=4, num_steps=3, eta=0.7), micro_batch_size=1)
    samples = [VisualSample([], prompt, "toy") for prompt in PROMPTS[:2]]
    whole = sampler.draw_samples(samples, torch.Generator().manual_seed(6), "stochastic")
    shares = [
        sampler.draw_samples(samples, torch.Generator().manual_seed(6), "stochastic", share=GroupShare(i, 2, 4))
        for i in range(2)
    ]
    assert torch.equal(_whole_from_shares([s.latents for s in shares], 2), whole.latents)


# ---------------------------------------------------------------------------------------------- the policy protocol
@pytest.mark.parametrize("name", sorted(TINY_FLOWS))
def test_every_tiny_flow_policy_is_a_denoising_policy(name):
    assert isinstance(FlowPolicy(name, lora=None), DenoisingPolicy)


def test_flow_policy_methods_take_what_the_protocol_passes():
    # isinstance checks names only: the sampler also relies on each method's parameters and defaults
    members = [n for n, v in vars(DenoisingPolicy).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert "velocity" in members and "reference" in members
    for name in members:
        expected = inspect.signature(getattr(DenoisingPolicy, name)).parameters
        actual = inspect.signature(getattr(FlowPolicy, name)).parameters
        assert [(p.name, p.default) for p in actual.values()] == [(p.name, p.default) for p in expected.values()], name


def test_a_policy_without_decoding_is_not_a_denoising_policy(policy):
    class NoDecode:
        """Every member of the protocol but ``decode``."""

        device = policy.device
        sigmas = initial_noise = encode_prompts = condition_images = encode_conditions = velocity = reference = print

    assert not isinstance(NoDecode(), DenoisingPolicy)
    NoDecode.decode = print  # any callable: isinstance checks names, not signatures
    assert isinstance(NoDecode(), DenoisingPolicy)

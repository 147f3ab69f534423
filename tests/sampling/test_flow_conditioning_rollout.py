"""Conditioned rollouts: stored transitions re-score to the rollout's log-probs with the same image conditioning, and
the UniPC evaluation sampler (diffusers' scheduler in flow mode) solves the flow ODE."""

import pytest
import torch

from app.models.flow import FlowPolicy
from app.sampling.flow import unipc_sample
from app.sampling.flow_rollout import FlowSampler, rows_of, stochastic_steps
from app.settings import FlowSamplingSettings, LoRASettings


def text_length(name):
    """Short prompts (the embedded tokenizer's 16 tokens), except Wan I2V, whose attention needs 512."""
    return 512 if name == "tiny-wan-i2v" else 16


@pytest.mark.parametrize("name", ["tiny-wan-i2v", "tiny-wan-ti2v", "tiny-flux-kontext"])
def test_conditioned_log_prob_of_a_stored_step_equals_the_rollouts(name):
    policy = FlowPolicy(name, lora=LoRASettings(r=4, alpha=8), max_sequence_length=text_length(name))
    settings = FlowSamplingSettings(group_size=2, num_steps=3, sampler="cps", eta=0.7)
    sampler = FlowSampler(policy, settings, micro_batch_size=2)
    images = torch.rand(2, 3, *policy.frame_size, generator=torch.Generator().manual_seed(0))
    conditioning = sampler.conditioning(["a", "b"], rows_per_prompt=2, images=images)
    sigmas = policy.sigmas(3).float()
    steps = stochastic_steps(sigmas)
    generator = torch.Generator().manual_seed(1)
    kept = sampler.denoise(conditioning, sampler.initial_noise(2, generator), sigmas, steps, steps, generator)
    with torch.no_grad():
        again = sampler.transition_logprobs(conditioning, sigmas, steps, kept.latents, kept.next_latents)
        rows = slice(2, 4)  # the training pass slices the conditioning per micro-batch
        part = sampler.transition_logprobs(
            rows_of(conditioning, rows), sigmas, steps, kept.latents[rows], kept.next_latents[rows]
        )
        swapped = {
            k: v.flip(0) if k not in ("encoder_hidden_states", "pooled_projections") else v
            for k, v in conditioning.items()
        }
        other = sampler.transition_logprobs(swapped, sigmas, steps, kept.latents, kept.next_latents)
    torch.testing.assert_close(again, kept.logprobs, rtol=0, atol=1e-5)
    torch.testing.assert_close(part, kept.logprobs[rows], rtol=0, atol=1e-5)
    assert (other - kept.logprobs).abs().max() > 1e-6  # another image's condition scores the step differently


def test_unipc_lands_on_the_target_of_an_exact_flow():
    """For ``v = (x - x0) / sigma`` every consistent solver reaches ``x0``; UniPC does so from any schedule."""
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(3, 4, 5, 5, generator=generator)
    sigmas = torch.cat([torch.linspace(1.0, 0.1, 6), torch.zeros(1)])
    out = unipc_sample(lambda x, s: (x - target) / s, torch.randn(3, 4, 5, 5, generator=generator), sigmas)
    torch.testing.assert_close(out, target, atol=1e-4, rtol=0)


def test_unipc_evaluates_the_velocity_on_the_given_sigmas():
    """The sigmas come shifted already: no shift on top; only a first sigma of exactly 1 is nudged to 1 - 1e-6."""
    seen = []
    unipc_sample(lambda x, s: seen.append(float(s)) or -x, torch.ones(2, 3), torch.tensor([1.0, 0.8, 0.5, 0.2, 0.0]))
    assert seen == pytest.approx([1 - 1e-6, 0.8, 0.5, 0.2], abs=1e-7)


def diffusers_unipc(velocity, noise, sigmas, order):
    """diffusers' UniPC run by hand, set up as ``unipc_sample`` documents: flow mode, no shift, the given sigmas."""
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(
        solver_order=order, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=1.0
    )
    scheduler.set_timesteps(sigmas=sigmas[:-1].double().numpy())
    x = noise
    for i, t in enumerate(scheduler.timesteps):
        x = scheduler.step(velocity(x, scheduler.sigmas[i]), t, x).prev_sample
    return x


@pytest.mark.parametrize("order", [None, 3])  # None: the default, order 2
def test_unipc_is_diffusers_multistep_unipc_of_the_given_order(order):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 4, generator=generator)
    noise = torch.randn(3, 4, generator=generator)
    sigmas = torch.tensor([1.0, 0.9, 0.75, 0.55, 0.35, 0.15, 0.0])

    def velocity(x, sigma):  # nonlinear in x and sigma: the solver's order shows
        return torch.tanh(x @ weight) * (1 + sigma)

    kwargs = {} if order is None else {"solver_order": order}
    expected = diffusers_unipc(velocity, noise, sigmas, order or 2)
    torch.testing.assert_close(unipc_sample(velocity, noise, sigmas, **kwargs), expected, atol=1e-6, rtol=0)
    other = diffusers_unipc(velocity, noise, sigmas, 5 - (order or 2))  # orders 2 and 3 give different samples
    assert (other - expected).abs().max() > 1e-3


def test_unipc_needs_a_schedule_ending_at_sigma_zero():
    with pytest.raises(ValueError, match=r"^unipc_sample needs a schedule ending at sigma 0, got 0\.25$"):
        unipc_sample(lambda x, s: -x, torch.ones(2, 3), torch.tensor([1.0, 0.5, 0.25]))


def test_unipc_refuses_sigmas_closer_than_its_timestep_resolution():
    """diffusers' scheduler finds its step by timestep (sigma x 1000 as an integer): two sigmas on one timestep would
    stop it with a bare assertion deep inside; the message says what is wrong."""
    with pytest.raises(ValueError, match=r"needs sigmas at least 1/1000 apart .*use fewer steps"):
        unipc_sample(lambda x, s: -x, torch.ones(2, 3), torch.tensor([1.0, 0.9995, 0.5, 0.0]))


def test_unipc_is_closer_to_the_exact_ode_solution_than_euler_with_few_steps():
    """A curved flow ``dx/ds = -x / (1 + s)`` (exact: ``x(0) = x(1) * 2``): UniPC's error is below Euler's."""
    x1 = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    sigmas = torch.cat([torch.linspace(1.0, 0.25, 4), torch.zeros(1)])
    unipc = unipc_sample(lambda x, s: -x / (1 + s), x1.clone(), sigmas)
    euler = x1.clone()
    for s, s_next in zip(sigmas[:-1], sigmas[1:], strict=True):
        euler = euler + (s_next - s) * (-euler / (1 + s))
    exact = 2 * x1
    assert (unipc - exact).abs().max() < (euler - exact).abs().max()


def test_eval_sampler_is_checked():
    with pytest.raises(ValueError, match="eval_sampler must be 'euler' or 'unipc'"):
        FlowSamplingSettings(eval_sampler="dpm")

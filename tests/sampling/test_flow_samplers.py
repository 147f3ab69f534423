"""Flow-matching step functions against the reference equations (docs/algorithms.md), on fresh random inputs."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from torch.distributions import Normal

from app.sampling.flow import StepOutput, cps_step, flow_sigmas, is_trainable_step, ode_step, sde_step

STOCHASTIC = {"sde": sde_step, "cps": cps_step}
SHAPE = (3, 4, 6, 6)  # [B, C, H, W]


def _exactly(message: str) -> str:
    """A ``pytest.raises(match=)`` pattern for exactly this error message."""
    return f"^{re.escape(message)}$"


def _inputs(seed: int, shape=SHAPE, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x, v, z = (torch.randn(shape, generator=g) for _ in range(3))
    return x.to(dtype), v.to(dtype), z, g


def _random_sigmas(g: torch.Generator, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample ``s`` in (0, 1] (the first one exactly 1) and ``s'`` in (0, s)."""
    s = torch.rand(b, generator=g) * 0.95 + 0.05
    s[0] = 1.0
    s_next = s * (torch.rand(b, generator=g) * 0.9 + 0.05)
    return s, s_next


def _reference(kind: str, x, v, s, s_next, eta, sample) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, std and MEAN Gaussian log-prob of ``sample``, from the formulas, in float64."""
    x, v, sample = x.double(), v.double(), sample.double()
    s, s_next = (torch.as_tensor(t, dtype=torch.float64).reshape(-1, 1, 1, 1) for t in (s, s_next))
    d = s_next - s
    x0_hat, x1_hat = x - s * v, x + (1 - s) * v
    if kind == "sde":
        std_s = eta * torch.sqrt(s / (1 - torch.where(s == 1, s_next, s)))
        mean = x + (v + std_s**2 / (2 * s) * x1_hat) * d
        std = std_s * torch.sqrt(-d)
    else:
        std = s_next * math.sin(eta * math.pi / 2)
        mean = (1 - s_next) * x0_hat + s_next * math.cos(eta * math.pi / 2) * x1_hat
    log_prob = Normal(mean, std.expand_as(mean)).log_prob(sample).mean(dim=(1, 2, 3))
    return mean, std.reshape(-1), log_prob


@pytest.mark.parametrize("kind", ["sde", "cps"])
@pytest.mark.parametrize("per_sample", [False, True])
def test_eta_zero_is_exactly_euler(kind, per_sample):
    x, v, z, g = _inputs(0)
    sigmas = flow_sigmas(8, shift=3.0)
    for i in range(len(sigmas) - 1):  # every step, from s = 1 to the final s' = 0
        s, s_next = sigmas[i], sigmas[i + 1]
        if per_sample:
            s, s_next = s.expand(SHAPE[0]), s_next.expand(SHAPE[0])
        euler = ode_step(x, v, s, s_next)
        out = STOCHASTIC[kind](x, v, s, s_next, eta=0.0, noise=z)  # the noise is multiplied by std = 0
        assert torch.equal(out.sample, euler.sample) and torch.equal(out.mean, euler.mean)
        assert torch.equal(out.std, torch.zeros(SHAPE[0])) and out.log_prob is None


def test_ode_step_matches_diffusers_scheduler_step():
    x, _, _, g = _inputs(1)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(6)
    sigmas = flow_sigmas(6, shift=3.0)
    for i, t in enumerate(scheduler.timesteps):
        v = torch.randn(SHAPE, generator=g)
        expected = scheduler.step(v, t, x).prev_sample
        out = ode_step(x, v, sigmas[i], sigmas[i + 1])
        assert torch.equal(out.sample, expected)
        assert torch.equal(out.log_prob, torch.zeros(SHAPE[0])) and torch.equal(out.std, torch.zeros(SHAPE[0]))
        x = expected


def test_cps_eta_one_std_is_next_sigma():
    x, v, z, g = _inputs(2)
    s, s_next = _random_sigmas(g, SHAPE[0])
    out = cps_step(x, v, s, s_next, eta=1.0, noise=z)
    assert torch.equal(out.std, s_next)
    x0_hat = x - s.view(-1, 1, 1, 1) * v  # eta = 1 keeps nothing of the predicted noise: mu = (1 - s') x0_hat
    torch.testing.assert_close(out.mean, (1 - s_next.view(-1, 1, 1, 1)) * x0_hat, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["sde", "cps"])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_log_prob_matches_float64_reference(kind, seed):
    x, v, z, g = _inputs(seed)
    s, s_next = _random_sigmas(g, SHAPE[0])
    eta = float(torch.rand((), generator=g)) * 0.9 + 0.1
    out = STOCHASTIC[kind](x, v, s, s_next, eta=eta, noise=z)
    mean, std, log_prob = _reference(kind, x, v, s, s_next, eta, out.sample)
    torch.testing.assert_close(out.mean, mean.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.std, std.float(), rtol=1e-5, atol=0)
    torch.testing.assert_close(out.sample, (mean + std.view(-1, 1, 1, 1) * z.double()).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.log_prob, log_prob.float(), rtol=1e-5, atol=1e-5)
    # scoring a transition the step did not draw (far in the tails for small std) follows the formula too
    other = torch.randn(SHAPE, generator=g)
    scored = STOCHASTIC[kind](x, v, s, s_next, eta=eta, prev_sample=other)
    torch.testing.assert_close(
        scored.log_prob, _reference(kind, x, v, s, s_next, eta, other)[2].float(), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("kind", ["sde", "cps"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prev_sample_reproduces_the_sampled_log_prob(kind, dtype):
    x, v, _, g = _inputs(6, dtype=dtype)
    sigmas = flow_sigmas(10, shift=3.0)
    for i in range(len(sigmas) - 2):  # every trainable step
        drawn = STOCHASTIC[kind](x, v, sigmas[i], sigmas[i + 1], eta=0.7, generator=g)
        scored = STOCHASTIC[kind](x, v, sigmas[i], sigmas[i + 1], eta=0.7, prev_sample=drawn.sample)
        assert scored.sample is drawn.sample
        assert torch.equal(scored.log_prob, drawn.log_prob)  # ratio exp(logp - logp_old) is exactly 1
        assert torch.equal(scored.mean, drawn.mean) and torch.equal(scored.std, drawn.std)


@pytest.mark.parametrize("kind", ["sde", "cps"])
def test_generator_draws_the_noise(kind):
    x, v, _, g = _inputs(11)
    s, s_next = _random_sigmas(g, SHAPE[0])
    drawn = STOCHASTIC[kind](x, v, s, s_next, eta=0.7, generator=torch.Generator().manual_seed(123))
    z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(123))  # the same draw, passed as noise
    assert torch.equal(drawn.sample, STOCHASTIC[kind](x, v, s, s_next, eta=0.7, noise=z).sample)


@pytest.mark.parametrize("kind", ["sde", "cps"])
def test_log_prob_is_differentiable_in_v(kind):
    x, v, z, g = _inputs(7)
    s, s_next = _random_sigmas(g, SHAPE[0])
    stored = STOCHASTIC[kind](x, v, s, s_next, eta=0.7, noise=z).sample
    v = v.clone().requires_grad_(True)
    out = STOCHASTIC[kind](x, v, s, s_next, eta=0.7, prev_sample=stored)
    out.log_prob.sum().backward()
    assert v.grad is not None and torch.isfinite(v.grad).all() and v.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["sde", "cps"])
def test_final_step_is_deterministic_and_never_trainable(kind):
    x, v, z, _ = _inputs(8)
    sigmas = flow_sigmas(5, shift=3.0)
    trainable = is_trainable_step(sigmas[1:])
    assert trainable[:-1].all() and not trainable[-1]
    assert is_trainable_step(0.0) is False and is_trainable_step(float(sigmas[-2])) is True
    s, s_next = sigmas[-2], sigmas[-1]
    out = STOCHASTIC[kind](x, v, s, s_next, eta=0.7, noise=z)
    euler = ode_step(x, v, s, s_next)
    assert out.log_prob is None and torch.equal(out.std, torch.zeros(SHAPE[0]))
    assert torch.equal(out.sample, euler.sample)  # x0_hat
    with pytest.raises(
        ValueError,
        match=_exactly("cannot score a deterministic step (std = 0: the last step or eta = 0); see is_trainable_step"),
    ):
        STOCHASTIC[kind](x, v, s, s_next, eta=0.7, prev_sample=out.sample)
    mixed = _exactly("a batch mixes deterministic (std = 0) and stochastic steps; step them separately")
    with pytest.raises(ValueError, match=mixed):  # a batch whose last sample is on its final step
        STOCHASTIC[kind](x, v, s.expand(SHAPE[0]), torch.tensor([0.1, 0.1, 0.0]) * s, eta=0.7)


def test_flow_sigmas_match_diffusers():
    for kwargs, mu in [({}, None), ({"shift": 3.0}, None), ({"use_dynamic_shifting": True}, 0.8)]:
        scheduler = FlowMatchEulerDiscreteScheduler(**kwargs)
        scheduler.set_timesteps(12, mu=mu)
        sigmas = flow_sigmas(12, mu=mu, **kwargs)
        assert sigmas.dtype == torch.float32 and sigmas.shape == (13,)
        assert torch.equal(sigmas, scheduler.sigmas) and sigmas[0] == 1 and sigmas[-1] == 0
        assert (sigmas.diff() < 0).all()
    # dynamic shifting is the exponential time shift exp(mu) / (exp(mu) + 1 / t - 1) of the unshifted schedule
    t = flow_sigmas(12)[:-1].double()
    expected = math.exp(0.8) / (math.exp(0.8) + 1 / t - 1)
    torch.testing.assert_close(flow_sigmas(12, use_dynamic_shifting=True, mu=0.8)[:-1].double(), expected)
    with pytest.raises(
        ValueError,
        match=_exactly("use_dynamic_shifting=True needs mu= (the pipelines derive it from the image sequence length)"),
    ):
        flow_sigmas(12, use_dynamic_shifting=True)


def test_flow_sigmas_are_float32_on_the_host_whatever_the_torch_defaults():
    expected = flow_sigmas(6, shift=3.0)
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)  # the scheduler then computes in float64
        in_float64 = flow_sigmas(6, shift=3.0)
        torch.set_default_dtype(default)
        torch.set_default_device("meta")
        on_meta = flow_sigmas(6, shift=3.0)
    finally:
        torch.set_default_dtype(default)
        torch.set_default_device(None)
    for sigmas in (in_float64, on_meta):
        assert sigmas.dtype == torch.float32 and sigmas.device.type == "cpu"
        assert torch.equal(sigmas, expected)


def test_flow_sigmas_pass_base_sigmas_and_scheduler_arguments_through():
    flux = flow_sigmas(4, base_sigmas=np.linspace(1, 1 / 4, 4))  # FluxPipeline's unshifted schedule
    assert torch.equal(flux, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    scheduler = FlowMatchEulerDiscreteScheduler(shift_terminal=0.1)
    scheduler.set_timesteps(4)
    terminal = flow_sigmas(4, shift_terminal=0.1)
    assert torch.equal(terminal, scheduler.sigmas) and terminal[-2] == np.float32(0.1)
    assert torch.equal(flow_sigmas(1), torch.tensor([1.0, 0.0]))  # one step: straight from noise to data
    with pytest.raises(ValueError, match=_exactly("num_steps must be >= 1, got 0")):
        flow_sigmas(0)
    with pytest.raises(
        ValueError, match=_exactly("the scheduler must run sigma down to a final 0 (invert_sigmas is not supported)")
    ):
        flow_sigmas(4, invert_sigmas=True)


@pytest.mark.parametrize("step", ["ode", "sde", "cps"])
def test_bf16_inputs_get_float32_math(step):
    x, v, z, g = _inputs(9, dtype=torch.bfloat16)
    s, s_next = _random_sigmas(g, SHAPE[0])
    fn = {"ode": ode_step, **STOCHASTIC}[step]
    kwargs = {} if step == "ode" else {"eta": 0.7, "noise": z}
    out = fn(x, v, s, s_next, **kwargs)
    ref = fn(x.float(), v.float(), s, s_next, **kwargs)  # the same inputs, already upcast
    assert isinstance(out, StepOutput)
    assert (
        out.sample.dtype == torch.bfloat16 and out.mean.dtype == torch.float32 and out.log_prob.dtype == torch.float32
    )
    assert torch.equal(out.mean, ref.mean) and torch.equal(out.sample, ref.sample.to(torch.bfloat16))
    if step != "ode":  # the log-prob is that of the stored bf16 sample
        assert torch.equal(out.log_prob, fn(x, v, s, s_next, eta=0.7, prev_sample=out.sample).log_prob)


def test_rejects_bad_arguments():
    x, v, z, _ = _inputs(10)
    with pytest.raises(
        ValueError,
        match=_exactly("pass prev_sample (to score a stored transition) or noise/generator (to sample), not both"),
    ):
        sde_step(x, v, 0.5, 0.4, eta=0.7, noise=z, prev_sample=x)
    with pytest.raises(ValueError, match=_exactly("prev_sample must have shape (3, 4, 6, 6), got (3, 4, 6)")):
        sde_step(x, v, 0.5, 0.4, eta=0.7, prev_sample=x[..., 0])
    with pytest.raises(ValueError, match=_exactly("noise must have shape (3, 4, 6, 6), got (1, 4, 6, 6)")):
        cps_step(x, v, 0.5, 0.4, eta=0.7, noise=z[:1])
    with pytest.raises(ValueError, match=r"\[B\] tensor with B = 3, got shape \(2,\)"):
        cps_step(x, v, torch.full((2,), 0.5), 0.4, eta=0.7)
    with pytest.raises(ValueError, match=r"\[B\] tensor with B = 3, got shape \(3, 1\)"):
        cps_step(x, v, torch.full((3, 1), 0.5), 0.4, eta=0.7)
    with pytest.raises(ValueError, match=_exactly("eta must be in [0, 1], got 1.5")):
        cps_step(x, v, 0.5, 0.4, eta=1.5)
    with pytest.raises(ValueError, match=_exactly("eta must be in [0, inf), got -0.1")):
        sde_step(x, v, 0.5, 0.4, eta=-0.1)
    for sigma, sigma_next in [(0.4, 0.5), (0.5, 0.5), (1.5, 0.5)]:
        with pytest.raises(ValueError, match="sigma_next < sigma <= 1 for every sample"):
            ode_step(x, v, sigma, sigma_next)
    with pytest.raises(ValueError, match=r"x must be \[B, \.\.\.\] with at least one non-batch dim, got shape \(3,\)"):
        ode_step(x[:, 0, 0, 0], v[:, 0, 0, 0], 0.5, 0.4)
    with pytest.raises(ValueError, match="same shape"):
        ode_step(x, v[:, :2], 0.5, 0.4)


def test_flat_latents_and_one_element_sigma_tensors():
    x, v, z, _ = _inputs(12, shape=(3, 5))  # [B, N]: one non-batch dim is enough
    euler = ode_step(x, v, torch.tensor([0.5]), 0.25)  # a [1] tensor is one sigma for the whole batch
    assert torch.equal(euler.sample, x + (np.float32(0.25) - np.float32(0.5)) * v)
    out = sde_step(x, v, torch.tensor([0.5]), torch.tensor(0.25), eta=0.7, noise=z)
    assert torch.equal(out.sample, sde_step(x, v, 0.5, 0.25, eta=0.7, noise=z).sample) and out.log_prob.shape == (3,)


@pytest.mark.parametrize("step", ["ode", "sde", "cps"])
def test_the_step_runs_on_the_latents_device(step):
    x, v = torch.zeros(SHAPE, device="meta"), torch.zeros(SHAPE, device="meta")  # no data: only devices and shapes
    fn = {"ode": ode_step, **STOCHASTIC}[step]
    out = fn(x, v, 0.5, 0.25, **({} if step == "ode" else {"eta": 0.7}))  # stochastic steps draw their noise there
    assert all(t.device.type == "meta" for t in (out.sample, out.mean, out.std, out.log_prob))


@pytest.mark.parametrize("kind", ["sde", "cps"])
def test_drawn_noise_is_float32_whatever_the_default_dtype(kind):
    x, v, _, _ = _inputs(13)
    z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5), dtype=torch.float32)
    expected = STOCHASTIC[kind](x, v, 0.5, 0.25, eta=0.7, noise=z).sample
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        drawn = STOCHASTIC[kind](x, v, 0.5, 0.25, eta=0.7, generator=torch.Generator().manual_seed(5)).sample
    finally:
        torch.set_default_dtype(default)
    assert torch.equal(drawn, expected)


def test_unipc_timesteps_are_sigma_times_1000():
    """UniPC's timesteps are ``int(sigma x 1000)`` (its 1000 training timesteps): 0.5009 and 0.5001 share timestep 500
    and are refused, although x 1001 would part them; 1/1000 apart, they pass."""
    from app.sampling.flow import unipc_sample

    with pytest.raises(ValueError, match=r"timesteps \[999, 500, 500\]: use fewer steps$"):
        unipc_sample(lambda x, s: -x, torch.ones(2, 3), torch.tensor([1.0, 0.5009, 0.5001, 0.0]))
    out = unipc_sample(lambda x, s: -x, torch.ones(2, 3), torch.tensor([1.0, 0.5011, 0.5001, 0.0]))
    assert out.shape == (2, 3) and torch.isfinite(out).all()

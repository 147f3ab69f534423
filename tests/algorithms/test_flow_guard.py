"""GRPO-Guard's loss (app.algorithms.flow_guard) against a float64 transcription of the paper's equations.

Tolerances: both sides run in float64 on the same inputs and differ only in the order of a few dozen operations on
numbers of order 1 to 1e3 (log-densities, ratios, 1 / dt), so they agree to a few hundred ulps of the largest
intermediate: rtol 1e-10 leaves a wide margin over float64's 2.2e-16 while any error in the equations (a missing
factor std, 2 or dt) shows at order 1.
"""

import math

import pytest
import torch

from app.algorithms.flow_guard import guarded_loss, normalized_log_ratio

RTOL, ATOL = 1e-10, 1e-12


def gaussian_logprob(sample, mean, std):
    """Mean over latent elements of log N(sample; mean, std^2), per row (app.sampling.flow's log-prob), float64."""
    std = std.view(-1, *([1] * (sample.ndim - 1)))
    element = -((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return element.flatten(1).mean(dim=1)


def paper_loss(theta, old_mean, sample, std, dt, advantages, mask, eps_low, eps_high, beta=0.0, ref_mean=None):
    """Wang et al. 2025, GRPO-Guard, transcribed row by row: b = ||mu_theta - mu_old||^2_mean / (2 std^2),
    rho = exp((log p_theta - log p_old + b) std), L = (1 / dt) mean_i max(-A rho, -A clip(rho)) [+ beta k3 KL]."""
    mean = old_mean + theta  # the policy's mean moves with its parameters
    rows = []
    kls = []
    for i in range(sample.shape[0]):
        logp = gaussian_logprob(sample[i : i + 1], mean[i : i + 1], std[i : i + 1])[0]
        logp_old = gaussian_logprob(sample[i : i + 1], old_mean[i : i + 1], std[i : i + 1])[0]
        bias = ((mean[i] - old_mean[i]) ** 2).mean() / (2 * std[i] ** 2)
        rho = torch.exp((logp - logp_old + bias) * std[i])
        a = advantages[i]
        rows.append(torch.maximum(-a * rho, -a * rho.clamp(1 - eps_low, 1 + eps_high)))
        if ref_mean is not None:
            d = gaussian_logprob(sample[i : i + 1], ref_mean[i : i + 1], std[i : i + 1])[0] - logp
            kls.append(torch.exp(d) - d - 1)
    kept = [r for r, m in zip(rows, mask.tolist(), strict=True) if m]
    loss = torch.stack(kept).mean() / dt
    if ref_mean is not None:
        loss = loss + beta * torch.stack([k for k, m in zip(kls, mask.tolist(), strict=True) if m]).mean()
    return loss


def inputs(seed=0, n=6, shape=(3, 4, 4), drift=0.02):
    g = torch.Generator().manual_seed(seed)
    old_mean = torch.randn(n, *shape, generator=g, dtype=torch.float64)
    std = 0.05 + 0.1 * torch.rand(n, generator=g, dtype=torch.float64)
    z = torch.randn(n, *shape, generator=g, dtype=torch.float64)
    sample = old_mean + std.view(-1, 1, 1, 1) * z
    theta = (drift * torch.randn(n, *shape, generator=g, dtype=torch.float64)).requires_grad_()
    advantages = torch.randn(n, generator=g, dtype=torch.float64)
    return old_mean, std, z, sample, theta, advantages


def module_loss(theta, old_mean, sample, std, dt, advantages, mask, **kwargs):
    ref_mean = kwargs.pop("ref_mean", None)
    mean = old_mean + theta
    logprobs = gaussian_logprob(sample, mean, std)
    old = gaussian_logprob(sample, old_mean, std)
    ref = gaussian_logprob(sample, ref_mean, std) if ref_mean is not None else None
    return guarded_loss(logprobs, old, mean, old_mean, std, dt, advantages, mask, ref_logprobs=ref, **kwargs)


@pytest.mark.parametrize(
    ("drift", "eps"),
    [(0.02, 1e-3), (0.02, 1e-1), (0.5, 2e-2)],  # 2 of the 5 kept rows clipped, none, 2 of 5 at a larger drift
)
def test_loss_and_gradient_match_the_paper_s_equations(drift, eps):
    old_mean, std, _, sample, theta, advantages = inputs(drift=drift)
    mask = torch.tensor([True, True, False, True, True, True])
    dt = 0.0625
    expected = paper_loss(theta, old_mean, sample, std, dt, advantages, mask, eps, 2 * eps)
    (expected_grad,) = torch.autograd.grad(expected, theta)
    out = module_loss(theta, old_mean, sample, std, dt, advantages, mask, eps_low=eps, eps_high=2 * eps)
    (grad,) = torch.autograd.grad(out.loss, theta)
    assert out.loss.dtype == torch.float64
    torch.testing.assert_close(out.loss, expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=ATOL)
    assert not grad[2].any()  # the masked row gets nothing
    torch.testing.assert_close(out.policy_loss, expected.detach(), rtol=RTOL, atol=ATOL)


def test_the_kl_to_the_reference_is_added_on_the_plain_log_probs_without_the_reweighting():
    old_mean, std, _, sample, theta, advantages = inputs(seed=1)
    ref_mean = old_mean + 0.03
    mask = torch.ones(6, dtype=torch.bool)
    kwargs = {"eps_low": 1e-2, "eps_high": 1e-2}
    expected = paper_loss(theta, old_mean, sample, std, 0.1, advantages, mask, beta=0.3, ref_mean=ref_mean, **kwargs)
    (expected_grad,) = torch.autograd.grad(expected, theta)
    out = module_loss(theta, old_mean, sample, std, 0.1, advantages, mask, beta=0.3, ref_mean=ref_mean, **kwargs)
    (grad,) = torch.autograd.grad(out.loss, theta)
    torch.testing.assert_close(out.loss, expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=ATOL)
    assert float(out.kl) > 0


def test_the_normalized_log_ratio_is_the_noise_times_the_mean_s_drift_and_so_centred():
    """(logp - logp_old + b) std = mean(z (mu - mu_old)) exactly (module docstring): zero-mean over the noise,
    whatever the step's std, while the plain log-ratio is shifted down by b."""
    old_mean, std, z, sample, theta, _ = inputs(seed=2, drift=0.1)
    mean = (old_mean + theta).detach()
    logprobs, old = gaussian_logprob(sample, mean, std), gaussian_logprob(sample, old_mean, std)
    normalized = normalized_log_ratio(logprobs, old, mean, old_mean, std)
    torch.testing.assert_close(normalized, (z * (mean - old_mean)).flatten(1).mean(dim=1), rtol=1e-9, atol=1e-12)
    bias = (mean - old_mean).flatten(1).square().mean(dim=1) / (2 * std**2)
    torch.testing.assert_close(logprobs - old, normalized / std - bias, rtol=1e-9, atol=1e-12)


def test_on_policy_the_ratio_is_one_and_the_gradient_is_the_noise_over_dt():
    """mu_old = sg(mu): r_hat = 1 exactly, nothing clipped, and d loss / d mu = -A z / (D n dt) per row."""
    old_mean, std, z, sample, _, advantages = inputs(seed=3)
    mean = old_mean.clone().requires_grad_()
    logprobs = gaussian_logprob(sample, mean, std)
    mask = torch.ones(6, dtype=torch.bool)
    out = guarded_loss(
        logprobs, logprobs.detach(), mean, mean.detach(), std, 0.25, advantages, mask, eps_low=1e-6, eps_high=1e-6
    )
    assert float(out.ratio_mean) == 1.0 and float(out.clip_fraction) == 0.0
    (grad,) = torch.autograd.grad(out.loss, mean)
    elements = z[0].numel()
    expected = -advantages.view(-1, 1, 1, 1) * z / (elements * 6 * 0.25)
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"dt": 0.0}, "dt"), ({"std": 0.0}, "std"), ({"beta": 0.1}, "ref_logprobs")],
)
def test_bad_input_is_refused_naming_it(kwargs, message):
    x = torch.zeros(2, 3)
    args = {"std": 0.1, "dt": 0.1, "beta": 0.0} | kwargs
    with pytest.raises(ValueError, match=message):
        guarded_loss(
            torch.zeros(2),
            torch.zeros(2),
            x,
            x,
            args["std"],
            args["dt"],
            torch.ones(2),
            torch.ones(2, dtype=torch.bool),
            eps_low=0.1,
            eps_high=0.1,
            beta=args["beta"],
        )

"""Diffusion-DPO's loss (app.algorithms.dpo) against a float64 transcription of the paper's equation.

Tolerances: both sides run in float64 on the same inputs and differ only in the order of a few dozen operations on
numbers of order 1 to 1e2 (errors, beta times margins, log-sigmoids), so they agree to a few hundred ulps of the
largest intermediate: rtol 1e-10 leaves a wide margin over float64's 2.2e-16 while a wrong factor (beta, 1/2, a sign)
shows at order 1.
"""

import math

import pytest
import torch

from app.algorithms.dpo import diffusion_dpo_loss, dpo_margin

RTOL, ATOL = 1e-10, 1e-12


def paper_loss(theta, x_w, x_l, eps, t, ref_w, ref_l, mask, beta):
    """Wallace et al. 2023, Diffusion-DPO (its eq. 14, in velocity form on the flow-matching forward process), pair by
    pair: x_t = (1 - t) x_0 + t eps, v = eps - x_0, L = -log sigmoid(-beta/2 [(e_w - e_ref_w) - (e_l - e_ref_l)])."""
    losses = []
    for i in range(x_w.shape[0]):
        terms = []
        for x0, ref in ((x_w[i], ref_w[i]), (x_l[i], ref_l[i])):
            x_t = (1 - t) * x0 + t * eps[i]
            v_theta = theta * x_t  # a toy velocity field with parameters theta
            v = eps[i] - x0
            terms.append(((v_theta - v) ** 2).mean() - ((ref - v) ** 2).mean())
        inside = -beta / 2 * (terms[0] - terms[1])
        losses.append(-torch.log(torch.sigmoid(inside)))
    kept = [loss for loss, m in zip(losses, mask.tolist(), strict=True) if m]
    return torch.stack(kept).mean()


def inputs(seed=0, n=5, shape=(2, 3, 3)):
    g = torch.Generator().manual_seed(seed)

    def draw(*size):
        return torch.randn(*size, generator=g, dtype=torch.float64)

    theta = (1 + 0.1 * draw(*shape)).requires_grad_()
    return theta, draw(n, *shape), draw(n, *shape), draw(n, *shape), draw(n, *shape), draw(n, *shape)


@pytest.mark.parametrize("beta", [0.5, 50.0])  # a weak and a strong pull towards the reference
def test_loss_and_gradient_match_the_paper_s_equation(beta):
    theta, x_w, x_l, eps, ref_w, ref_l = inputs()
    t, mask = 0.6, torch.tensor([True, False, True, True, True])
    expected = paper_loss(theta, x_w, x_l, eps, t, ref_w, ref_l, mask, beta)
    (expected_grad,) = torch.autograd.grad(expected, theta)
    noised_w, noised_l = (1 - t) * x_w + t * eps, (1 - t) * x_l + t * eps
    out = diffusion_dpo_loss(theta * noised_w, theta * noised_l, ref_w, ref_l, eps - x_w, eps - x_l, mask, beta=beta)
    (grad,) = torch.autograd.grad(out.loss, theta)
    assert out.loss.dtype == torch.float64 and out.kl is None
    torch.testing.assert_close(out.loss, expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(out.policy_loss, expected.detach(), rtol=RTOL, atol=ATOL)


def test_at_the_reference_the_loss_is_log_2_and_pulls_towards_the_preferred_sample():
    """v_theta = v_ref: margin 0, loss log 2 per pair, and one small step down the gradient lowers the policy's error
    on x^w relative to x^l."""
    _, x_w, x_l, eps, _, _ = inputs(seed=1)
    velocity_w = (0.3 * eps).requires_grad_()
    velocity_l = (0.3 * eps).requires_grad_()
    mask = torch.ones(5, dtype=torch.bool)
    out = diffusion_dpo_loss(
        velocity_w, velocity_l, velocity_w.detach(), velocity_l.detach(), eps - x_w, eps - x_l, mask, beta=10.0
    )
    torch.testing.assert_close(out.loss, torch.tensor(math.log(2.0), dtype=torch.float64), rtol=1e-12, atol=0)
    grad_w, grad_l = torch.autograd.grad(out.loss, (velocity_w, velocity_l))
    step_w, step_l = velocity_w - 1e-3 * grad_w, velocity_l - 1e-3 * grad_l
    margin = dpo_margin(step_w, step_l, velocity_w, velocity_l, eps - x_w, eps - x_l)
    assert bool((margin < 0).all())


def test_no_pair_gives_a_connected_zero():
    theta, x_w, x_l, eps, ref_w, ref_l = inputs()
    out = diffusion_dpo_loss(
        theta * x_w, theta * x_l, ref_w, ref_l, eps, eps, torch.zeros(5, dtype=torch.bool), beta=1.0
    )
    assert float(out.loss.detach()) == 0.0
    out.loss.backward()
    assert theta.grad is not None and not theta.grad.any()


@pytest.mark.parametrize(("beta", "message"), [(0.0, "beta must be > 0"), (float("nan"), "beta must be > 0")])
def test_bad_beta_is_refused(beta, message):
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=message):
        diffusion_dpo_loss(x, x, x, x, x, x, torch.ones(2, dtype=torch.bool), beta=beta)


def test_mismatched_shapes_are_refused_naming_the_tensor():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="ref_l has shape"):
        diffusion_dpo_loss(x, x, x, torch.zeros(2, 4), x, x, torch.ones(2, dtype=torch.bool), beta=1.0)

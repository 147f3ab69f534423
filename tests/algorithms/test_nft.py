"""The DiffusionNFT loss against the paper's equations written out in float64, and what its gradient does."""

import pytest
import torch

from app.algorithms.nft import nft_loss, optimality_probability

# float32 inputs of order 1 through a handful of multiply-adds and a mean over 2 x 3 x 4 elements: each result carries
# a relative rounding error of a few ulp (float32 ulp 1.2e-7) per operation, far below 1e-5.
RTOL = 1e-5


def draw(n=3, shape=(2, 3, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    velocity = torch.randn(n, *shape, generator=g)
    old = torch.randn(n, *shape, generator=g)
    target = torch.randn(n, *shape, generator=g)
    return velocity, old, target


def reference_loss(velocity, old, target, sigma, r, mask, beta, weighting):
    """Zheng et al. (2025), eq. of the implicit positive / negative policies, in float64, one row at a time."""
    rows = []
    for n in range(len(velocity)):
        v, vo, t = velocity[n].double(), old[n].double(), target[n].double()
        positive = (1 - beta) * vo + beta * v
        negative = (1 + beta) * vo - beta * v
        if weighting == "velocity":
            errors = [((p - t) ** 2).mean() for p in (positive, negative)]
        else:  # the clean-sample error x_hat_0 - x_0 = sigma (v - v_hat), over its mean absolute value
            errors = []
            for p in (positive, negative):
                clean = sigma * (t - p)
                errors.append((clean**2).mean() / clean.abs().mean().clamp(min=1e-5))
        rows.append((float(r[n]) * errors[0] + (1 - float(r[n])) * errors[1]) / beta)
    rows = torch.stack(rows)
    weights = mask.double()
    return (rows * weights).sum() / weights.sum()


def test_the_optimality_probability_maps_clipped_advantages_onto_0_to_1():
    advantages = torch.tensor([-10.0, -5.0, 0.0, 2.5, 5.0, 10.0])
    assert optimality_probability(advantages, 5.0).tolist() == [0.0, 0.0, 0.5, 0.75, 1.0, 1.0]
    with pytest.raises(ValueError, match="clip must be > 0"):
        optimality_probability(advantages, 0.0)


@pytest.mark.parametrize("weighting", ["velocity", "adaptive"])
@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_the_loss_is_the_papers_equation(weighting, beta):
    velocity, old, target = draw()
    r, mask = torch.tensor([0.9, 0.2, 0.5]), torch.tensor([True, True, False])
    out = nft_loss(velocity, old, target, 0.7, r, mask, beta=beta, weighting=weighting)
    expected = reference_loss(velocity, old, target, 0.7, r, mask, beta, weighting)
    assert float(out.loss) == pytest.approx(float(expected), rel=RTOL)
    assert float(out.policy_loss) == float(out.loss)
    assert float(out.kl) == 0.0


def test_masked_rows_add_nothing_and_the_normaliser_counts_the_kept_ones():
    velocity, old, target = draw()
    r = torch.tensor([0.9, 0.2, 0.5])
    both = nft_loss(velocity, old, target, 0.5, r, torch.tensor([True, True, False]), beta=1.0)
    changed = velocity.clone()
    changed[2] += 100.0  # the masked row
    again = nft_loss(changed, old, target, 0.5, r, torch.tensor([True, True, False]), beta=1.0)
    assert float(both.loss) == float(again.loss)
    first = nft_loss(velocity[:1], old[:1], target[:1], 0.5, r[:1], torch.tensor([True]), beta=1.0)
    second = nft_loss(velocity[1:2], old[1:2], target[1:2], 0.5, r[1:2], torch.tensor([True]), beta=1.0)
    assert float(both.loss) == pytest.approx((float(first.loss) + float(second.loss)) / 2, rel=RTOL)


def test_at_the_sampling_policy_the_gradient_is_flow_matching_weighted_by_2r_minus_1():
    """With v_theta = v_old, d/dv_theta of r |v+ - v|^2 + (1 - r) |v- - v|^2 over beta is 2 (2r - 1) (v_theta - v) / M
    per row (M elements): good samples (r > 1/2) pull the velocity to their flow, bad ones push it away, average ones
    leave it."""
    _, old, target = draw()
    velocity = old.clone().requires_grad_(True)
    r = torch.tensor([1.0, 0.0, 0.5])
    out = nft_loss(velocity, old, target, 0.5, r, torch.ones(3, dtype=torch.bool), beta=0.3, weighting="velocity")
    out.loss.backward()
    elements = old[0].numel()
    expected = 2 * (2 * r - 1).view(-1, 1, 1, 1) * (old - target) / elements / 3
    torch.testing.assert_close(velocity.grad, expected, rtol=RTOL, atol=1e-8)
    assert velocity.grad[2].abs().max() < 1e-8  # r = 1/2


def test_the_kl_to_the_reference_is_the_velocity_mse_and_needs_the_reference():
    velocity, old, target = draw()
    ref = torch.zeros_like(velocity)
    mask, r = torch.ones(3, dtype=torch.bool), torch.full((3,), 0.5)
    out = nft_loss(velocity, old, target, 0.5, r, mask, beta=1.0, kl_weight=0.1, ref_velocity=ref)
    assert float(out.kl) == pytest.approx(float(velocity.square().mean()), rel=RTOL)
    assert float(out.loss) == pytest.approx(float(out.policy_loss) + 0.1 * float(out.kl), rel=RTOL)
    with pytest.raises(ValueError, match="needs ref_velocity"):
        nft_loss(velocity, old, target, 0.5, r, mask, beta=1.0, kl_weight=0.1)
    with pytest.raises(ValueError, match="beta must be > 0"):
        nft_loss(velocity, old, target, 0.5, r, mask, beta=0.0)

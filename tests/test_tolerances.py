"""The bounds of ``tolerances.py`` against torch's AdamW: Adam's largest step is what the formula says, and the
training-weights check tells rounding from a different run."""

from __future__ import annotations

import pytest
import torch
from tolerances import ADAM_BETAS, adam_ratio_bound, adamw_drift_bound, assert_close_training


def adamw_steps(gradients: torch.Tensor, lr: float = 1.0, weight_decay: float = 0.0) -> torch.Tensor:
    """Weights after AdamW's steps on ``gradients`` ``[steps, n]`` from zero (float64, torch's implementation)."""
    weight = torch.zeros(gradients.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.AdamW([weight], lr=lr, betas=ADAM_BETAS, weight_decay=weight_decay)
    for g in gradients:
        weight.grad = g.clone()
        optimizer.step()
    return weight.detach()


@pytest.mark.parametrize("steps", [1, 2, 3, 5])
def test_adams_largest_step_is_the_bound(steps, random_seed):
    b1, b2 = ADAM_BETAS
    # Cauchy-Schwarz is tight for g_i proportional to (b1 / b2)^(t - i): the last step is then c_t (times lr = 1)
    worst = torch.tensor([[(b1 / b2) ** (steps - i)] for i in range(1, steps + 1)], dtype=torch.float64)
    last = adamw_steps(worst) - adamw_steps(worst[:-1]) if steps > 1 else adamw_steps(worst)
    assert last.abs().item() == pytest.approx(adam_ratio_bound(steps), rel=1e-6)  # eps 1e-8 against gradients ~1
    random = torch.randn(steps, 10_000, dtype=torch.float64, generator=torch.Generator().manual_seed(random_seed))
    previous = adamw_steps(random[:-1]) if steps > 1 else torch.zeros(10_000, dtype=torch.float64)
    assert (adamw_steps(random) - previous).abs().max() <= adam_ratio_bound(steps)


def test_the_training_check_takes_rounding_and_rejects_another_run(random_seed):
    generator = torch.Generator().manual_seed(random_seed)
    gradients = torch.randn(3, 4096, dtype=torch.float64, generator=generator)
    noise = gradients.abs().max() * 1e-7 * torch.randn(gradients.shape, dtype=torch.float64, generator=generator)
    near_zero = gradients.abs() < 1e-3  # about 10 elements whose sign rounding decides, as Adam sees it
    lr, initial = 1e-3, {"w": torch.zeros(4096, dtype=torch.float64)}
    expected = {"w": adamw_steps(gradients, lr, weight_decay=0.01)}
    flipped = torch.where(near_zero, -gradients, gradients + noise)
    assert near_zero.any()
    assert_close_training({"w": adamw_steps(flipped, lr, 0.01)}, expected, lr=lr, steps=3, initial=initial)
    others = {
        "another batch": adamw_steps(torch.randn(3, 4096, dtype=torch.float64, generator=generator), lr, 0.01),
        "twice the rate": adamw_steps(gradients, 2 * lr, 0.01),
        "a step fewer": adamw_steps(gradients[:2], lr, 0.01),
        "no training": initial["w"],
    }
    for name, weights in others.items():
        try:
            assert_close_training({"w": weights}, expected, lr=lr, steps=3, initial=initial)
        except AssertionError:
            continue
        pytest.fail(f"{name} passed for rounding")
    assert adamw_drift_bound(lr, 3) == pytest.approx(2 * lr * (1 + 1.0013579 + 1.0036136), rel=1e-6)

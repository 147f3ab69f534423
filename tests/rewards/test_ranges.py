"""scores_in_range: float32 values clamped into a reward's value_range, NaN to the low end, never a float32 step out."""

import math

import numpy as np
import pytest
import torch

from app.rewards.ranges import scores_in_range


def inside(values: torch.Tensor, low: float, high: float) -> bool:
    return all(low <= v <= high for v in values.tolist())


def test_values_are_clamped_and_nan_goes_to_the_low_end():
    out = scores_in_range([-5.0, 0.25, 7.0, float("nan"), float("inf"), -float("inf")], (-1.0, 2.0))
    assert out.dtype == torch.float32
    assert out.tolist() == [-1.0, 0.25, 2.0, -1.0, 2.0, -1.0]


def test_bounds_float32_cannot_represent_are_moved_one_step_inside():
    low, high = -0.3, 1.7  # float32(1.7) > 1.7 and float32(-0.3) < -0.3
    out = scores_in_range([high, low, 5.0, -5.0, 0.5], (low, high))
    assert inside(out, low, high)
    below_high = float(np.nextafter(np.float32(high), np.float32(-np.inf)))
    above_low = float(np.nextafter(np.float32(low), np.float32(np.inf)))
    assert out.tolist() == [below_high, above_low, below_high, above_low, 0.5]
    # Representable bounds are kept exactly, and a value already inside is rounded to the nearest float32 only.
    assert scores_in_range([1.0, 0.0, 0.1], (0.0, 1.0)).tolist() == [1.0, 0.0, float(np.float32(0.1))]
    assert math.isclose(out[0].item(), high, rel_tol=1e-7)


def test_values_stay_float32_and_inside_under_a_float64_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = scores_in_range([1.7, -0.3], (-0.3, 1.7))
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == torch.float32 and inside(out, -0.3, 1.7)


@pytest.mark.parametrize("values", [[], [0.5]])
def test_empty_and_single_batches(values):
    assert scores_in_range(values, (0.0, 1.0)).tolist() == values

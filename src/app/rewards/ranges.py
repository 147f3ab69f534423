"""Float32 reward values that stay inside a reward's declared ``value_range``.

Rewards compute in Python floats and return float32 tensors. Rounding to float32 can step just outside a bound that
float32 cannot represent (1.7 becomes 1.70000005), so a value at the top of ``(-0.3, 1.7)`` would break the contract
``low <= value <= high``. :func:`scores_in_range` clamps, rounds, and moves any value that rounding pushed outside one
float32 step back in (an error of about 1e-7).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def scores_in_range(values: Sequence[float], value_range: tuple[float, float]) -> Tensor:
    """``[N]`` float32 values clamped to ``value_range`` (NaN to ``low``), each ``low <= v <= high`` as Python floats.

    >>> scores_in_range([1.7, -0.3, 2.0, 0.5], (-0.3, 1.7)).tolist()[:2] == [1.6999999284744263, -0.29999998211860657]
    True
    """
    low, high = value_range
    clamped = [min(max(v, low), high) if v == v else low for v in map(float, values)]  # NaN -> low
    out = torch.tensor(clamped, dtype=torch.float32)  # [N]
    out = torch.where(out.double() > high, torch.nextafter(out, torch.tensor(-torch.inf)), out)
    out = torch.where(out.double() < low, torch.nextafter(out, torch.tensor(torch.inf)), out)
    return out

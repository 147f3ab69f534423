"""Group-relative advantages (GRPO, Dr. GRPO) from one scalar reward per completion.

Rows are group-major: ``N = B * K`` completions, row ``b * K + k`` is completion ``k`` of prompt ``b``. Standard
deviations are population ones (``unbiased=False``): a group of K rewards is the whole population being normalised,
and K = 2 would otherwise inflate the scale by sqrt(2). Equations: docs/algorithms.md#grpo-advantages.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AdvantageScale = Literal["group", "batch", "none"]
"""How :func:`group_advantages` divides; the modules' ``advantage_scale`` adds ``global`` (``batch`` with the std of
every rank's rewards, :func:`moments_std`) and ``per_prompt``
(:class:`~app.algorithms.prompt_stats.PromptStatTracker`)."""


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    """Check ``rewards`` ``[N]`` and view it as ``[B, K]`` floats (at least float32)."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.numel() % group_size != 0:
        raise ValueError(
            f"number of rewards ({rewards.numel()}) is not divisible by group_size ({group_size}); "
            "rows must be group-major, B prompts x K completions"
        )
    bad = int((~torch.isfinite(rewards)).sum())
    if bad:
        raise ValueError(f"rewards must be finite: {bad} of {rewards.numel()} values are NaN or inf")
    return rewards.to(torch.promote_types(rewards.dtype, torch.float32)).view(-1, group_size)  # [B, K], float


def zero_std_groups(rewards: Tensor, group_size: int, atol: float = 1e-6) -> Tensor:
    """``[B]`` bool, True where every reward of the group is equal (within ``atol``): no learning signal."""
    groups = _groups(rewards, group_size)  # [B, K]
    spread = groups.amax(dim=1) - groups.amin(dim=1)  # [B]
    return spread <= atol  # [B]


def group_advantages(
    rewards: Tensor,
    group_size: int,
    scale: AdvantageScale = "group",
    eps: float = 1e-4,
    batch_std: float | Tensor | None = None,
) -> Tensor:
    """``A = (r - group mean) / (std + eps)``, ``[N]`` -> ``[N]``.

    ``scale``: ``"group"`` divides by each group's std, ``"batch"`` by the std of all N rewards (or by ``batch_std``
    when given: the std of a larger batch these rewards are part of, every rank's), ``"none"`` does not divide
    (Dr. GRPO). Groups whose rewards are all equal get exactly 0, not rounding noise over ``eps``.
    """
    groups = _groups(rewards, group_size)  # [B, K]
    centered = groups - groups.mean(dim=1, keepdim=True)  # [B, K]
    if scale == "group":
        centered = centered / (groups.std(dim=1, unbiased=False, keepdim=True) + eps)  # [B, K]
    elif scale == "batch":
        spread = groups.std(unbiased=False) if batch_std is None else torch.as_tensor(batch_std).to(groups)
        centered = centered / (spread + eps)  # [B, K]
    elif scale != "none":
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    flat = zero_std_groups(rewards, group_size)[:, None]  # [B, 1]
    return torch.where(flat, torch.zeros_like(centered), centered).reshape(-1)  # [N]


def reward_moments(rewards: Tensor) -> Tensor:
    """``[count, sum, sum of squares]`` of ``rewards`` in float64: what ranks add up (one all-reduce) to get the std
    of all their rewards (:func:`moments_std`)."""
    values = rewards.detach().double().flatten()
    return torch.stack([values.new_tensor(float(values.numel())), values.sum(), (values * values).sum()])


def moments_std(moments: Tensor) -> Tensor:
    """The population std of the rewards whose :func:`reward_moments` (summed over ranks) are ``moments``; float64,
    so that ``E[r^2] - E[r]^2`` keeps its digits for rewards of any offset met in practice (|mean| / std < 1e5)."""
    count, total, squares = moments.double().unbind()
    mean = total / count.clamp(min=1)
    return (squares / count.clamp(min=1) - mean * mean).clamp(min=0).sqrt()

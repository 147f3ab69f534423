"""DiffusionNFT (Zheng et al. 2025, arXiv:2509.16117) as pure tensor math: the optimality probability of a sample and
the negative-aware flow-matching loss on the forward process (docs/algorithms.md#diffusionnft).

A sampling ("old") policy ``v_old`` draws clean samples ``x_0`` with any solver; the rewards say how good each one is.
The update noises ``x_0`` again, ``x_t = (1 - t) x_0 + t eps`` (the flow-matching forward process, target velocity
``v = eps - x_0``), and trains ``v_theta`` through two implicit policies that share its parameters::

    v+ = (1 - beta) v_old + beta v_theta        (the positive policy)
    v- = (1 + beta) v_old - beta v_theta        (the negative policy, the reflection of v+ about v_old)
    L  = E[ r ||v+ - v||^2 + (1 - r) ||v- - v||^2 ] / beta

so a sample with optimality probability ``r`` near 1 pulls ``v+`` (hence ``v_theta``) towards its flow, one near 0
pushes ``v_theta`` away from it. No likelihood, no trajectory and no solver enter the loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from app.algorithms.loss import LossOutput

NFTWeighting = Literal["adaptive", "velocity"]

_MIN_ADAPTIVE_WEIGHT = 1e-5  # the reference code's floor of the per-sample normaliser


def optimality_probability(advantages: Tensor, clip: float) -> Tensor:
    """``[N]`` ``r = 0.5 + 0.5 * clip(A / clip, -1, 1)`` in [0, 1]: an advantage of ``+clip`` or more is surely
    good (1), ``-clip`` or less surely bad (0), an average sample 0.5 (DiffusionNFT's normalised reward)."""
    if clip <= 0:
        raise ValueError(f"the advantage clip must be > 0, got {clip}")
    return (0.5 + 0.5 * advantages.float() / clip).clamp(0.0, 1.0)


def _per_row_mean(values: Tensor) -> Tensor:
    return values.flatten(1).mean(dim=1)  # [n]


def _error(predicted_velocity: Tensor, target_velocity: Tensor, sigma: Tensor, weighting: NFTWeighting) -> Tensor:
    """``[n]`` the error of one implicit policy: the velocity MSE, or (``adaptive``) the clean-sample MSE
    ``||x_t - t v_hat - x_0||^2 = t^2 ||v_hat - v||^2`` divided by its own detached mean absolute error per sample, as
    the reference implementation weighs it (a per-sample, scale-free step size)."""
    if weighting == "velocity":
        return _per_row_mean((predicted_velocity - target_velocity).square())
    clean_error = sigma * (target_velocity - predicted_velocity)  # x_hat_0 - x_0, [n, ...]
    scale = _per_row_mean(clean_error.detach().abs()).clamp(min=_MIN_ADAPTIVE_WEIGHT)  # [n]
    return _per_row_mean(clean_error.square()) / scale


def nft_loss(
    velocity: Tensor,
    old_velocity: Tensor,
    target_velocity: Tensor,
    sigma: Tensor,
    optimality: Tensor,
    mask: Tensor,
    *,
    beta: float,
    weighting: NFTWeighting = "adaptive",
    kl_weight: float = 0.0,
    ref_velocity: Tensor | None = None,
) -> LossOutput:
    """The DiffusionNFT loss of ``n`` noised samples at one noise level, averaged over the ``mask``-ed rows.

    Args:
        velocity: ``[n, ...]`` ``v_theta(x_t)``, with gradients.
        old_velocity: ``[n, ...]`` ``v_old(x_t)`` of the sampling policy (detached here).
        target_velocity: ``[n, ...]`` ``eps - x_0``, the flow of each sample.
        sigma: the noise level ``t`` (a scalar or ``[n]``; ``adaptive`` weighting only).
        optimality: ``[n]`` ``r`` in [0, 1] (:func:`optimality_probability`).
        mask: ``[n]`` bool, the rows in the loss (the normaliser counts them only).
        beta: the implicit policies' step, > 0.
        weighting: ``adaptive`` (the reference code) or ``velocity`` (the paper's plain flow-matching loss).
        kl_weight: weight of ``||v_theta - v_ref||^2`` (the reference code's KL to the base model); 0 skips it.
        ref_velocity: ``[n, ...]`` ``v_ref(x_t)``, required when ``kl_weight > 0``.

    There is no likelihood ratio here, so the output has no ``clip_fraction`` or ``ratio_mean``.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if kl_weight > 0 and ref_velocity is None:
        raise ValueError("kl_weight > 0 needs ref_velocity")
    old = old_velocity.detach().float()
    velocity, target = velocity.float(), target_velocity.float()
    sigma = torch.as_tensor(sigma, dtype=torch.float32, device=velocity.device)
    sigma = sigma.view(-1, *([1] * (velocity.ndim - 1))) if sigma.ndim else sigma
    positive = beta * velocity + (1.0 - beta) * old
    negative = (1.0 + beta) * old - beta * velocity
    r = optimality.float().to(velocity.device)
    per_row = (
        r * _error(positive, target, sigma, weighting) + (1 - r) * _error(negative, target, sigma, weighting)
    ) / beta
    weights = mask.float().to(velocity.device)
    normaliser = weights.sum().clamp(min=1.0)
    policy_loss = (per_row * weights).sum() / normaliser
    kl = torch.zeros((), device=velocity.device)
    if ref_velocity is not None:
        kl = (_per_row_mean((velocity - ref_velocity.detach().float()).square()) * weights).sum() / normaliser
    loss = policy_loss + kl_weight * kl if kl_weight > 0 else policy_loss
    return LossOutput(loss=loss, policy_loss=policy_loss.detach(), kl=kl.detach())

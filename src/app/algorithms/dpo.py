"""Diffusion-DPO (Wallace et al. 2023, arXiv:2311.12908) on a flow-matching generator as pure tensor math: the loss of
preference pairs noised on the forward process (docs/algorithms.md#diffusion-dpo).

A pair is a preferred sample ``x_0^w`` and a dispreferred ``x_0^l`` of the same prompt. Both are noised with the same
noise ``eps`` at the same level ``t``, ``x_t = (1 - t) x_0 + t eps`` (target velocity ``v = eps - x_0``), and the
policy's flow-matching errors are compared with the frozen reference's::

    e(x) = mean ||v_theta(x_t) - v||^2,   e_ref(x) = mean ||v_ref(x_t) - v||^2
    L    = -log sigmoid(-beta / 2 * [(e(x^w) - e_ref(x^w)) - (e(x^l) - e_ref(x^l))])

so the policy lowers its error on the preferred sample and raises it on the other, relative to the reference, with
``beta`` the strength of the implicit KL to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from app.algorithms.loss import LossOutput


def _error(velocity: Tensor, target: Tensor) -> Tensor:
    """``[n]`` the mean squared velocity error per row, in at least float32."""
    dtype = torch.promote_types(velocity.dtype, torch.float32)
    return (velocity.to(dtype) - target.to(dtype)).flatten(1).square().mean(dim=1)


def dpo_margin(
    velocity_w: Tensor, velocity_l: Tensor, ref_w: Tensor, ref_l: Tensor, target_w: Tensor, target_l: Tensor
) -> Tensor:
    """``[n]`` ``(e(x^w) - e_ref(x^w)) - (e(x^l) - e_ref(x^l))``: negative where the policy already prefers ``w``
    more than the reference does. The reference velocities are detached here."""
    return (_error(velocity_w, target_w) - _error(ref_w.detach(), target_w)) - (
        _error(velocity_l, target_l) - _error(ref_l.detach(), target_l)
    )


def diffusion_dpo_loss(
    velocity_w: Tensor,
    velocity_l: Tensor,
    ref_w: Tensor,
    ref_l: Tensor,
    target_w: Tensor,
    target_l: Tensor,
    mask: Tensor,
    *,
    beta: float,
) -> LossOutput:
    """The Diffusion-DPO loss of ``n`` pairs at one noise level, averaged over the ``mask``-ed pairs.

    Args:
        velocity_w, velocity_l: ``[n, ...]`` the policy's velocities at the noised preferred / dispreferred samples.
        ref_w, ref_l: ``[n, ...]`` the reference's at the same points.
        target_w, target_l: ``[n, ...]`` their flows ``eps - x_0``.
        mask: ``[n]`` bool, the pairs in the loss (the normaliser counts them only); none: a zero still connected to
            the velocities.
        beta: > 0, the implicit KL's weight.

    ``policy_loss`` is the loss; there is no ratio and no separate KL term (the reference enters the margin).
    """
    if not beta > 0:
        raise ValueError(f"the DPO beta must be > 0, got {beta}")
    for name, tensor in {"velocity_l": velocity_l, "ref_w": ref_w, "ref_l": ref_l, "target_w": target_w}.items():
        if tensor.shape != velocity_w.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, velocity_w has {tuple(velocity_w.shape)}")
    if target_l.shape != velocity_w.shape or mask.shape != velocity_w.shape[:1]:
        raise ValueError(
            f"target_l {tuple(target_l.shape)} and mask {tuple(mask.shape)} must be {tuple(velocity_w.shape)} and "
            f"{tuple(velocity_w.shape[:1])}"
        )
    margin = dpo_margin(velocity_w, velocity_l, ref_w, ref_l, target_w, target_l)  # [n]
    per_pair = -F.logsigmoid(-0.5 * beta * margin)  # [n]
    kept = mask.bool().to(per_pair.device)  # [n]
    loss = torch.where(kept, per_pair, torch.zeros_like(per_pair)).sum() / kept.sum().clamp_min(1)  # []
    return LossOutput(loss=loss, policy_loss=loss.detach(), kl=None)

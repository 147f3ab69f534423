"""Token-level GRPO loss: clipped surrogate, k3 KL to the reference, and the three aggregations.

Shapes: N completions (B prompts x K, group-major), L completion tokens. Log-probs are of the sampled tokens. The loss
works in at least float32 (bf16/fp16 inputs are upcast); with ``old_logprobs = logprobs.detach()`` the ratio is exactly 1.
Equations: docs/algorithms.md#grpo-loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token_mean", "sequence_mean", "constant"]


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Elementwise k3 estimator of KL(policy || ref): ``exp(d) - d - 1`` with ``d = ref - logp``; >= 0, 0 at d = 0.

    Written as ``expm1(d) - d``: same value, but no rounding below 0 when d is tiny.
    """
    delta = ref_logprobs - logprobs  # same shape
    return torch.expm1(delta) - delta  # same shape


def clipped_surrogate(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO-clip surrogate per token, negated to be minimised.

    Returns ``(loss [N, L], ratio [N, L], is_clipped [N, L] bool)``. ``is_clipped`` marks tokens where the clipped
    term is strictly the smaller one, i.e. where the token gets no gradient.
    """
    adv = advantages[:, None]  # [N, 1]
    ratio = torch.exp(logprobs - old_logprobs)  # [N, L]
    unclipped = ratio * adv  # [N, L]
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv  # [N, L]
    surrogate = torch.minimum(unclipped, clipped)  # [N, L]
    return -surrogate, ratio, clipped < unclipped  # [N, L] x 3


def aggregate(
    per_token: Tensor, mask: Tensor, mode: Aggregation = "token_mean", max_length: int | None = None
) -> Tensor:
    """Reduce a ``[N, L]`` per-token quantity over the tokens in ``mask`` (bool or 0/1) to a scalar.

    ``token_mean``: sum / number of tokens. ``sequence_mean``: mean per row, then mean over rows with >= 1 token.
    ``constant`` (Dr. GRPO): sum / (N * max_length), ``max_length`` defaulting to L. Without any token the result is a
    zero still connected to ``per_token`` (so ``backward`` works on every rank), never NaN.
    """
    if per_token.shape != mask.shape:
        raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must have the same shape")
    mask = mask.bool()  # [N, L]
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))  # [N, L], padding values never leak (NaN-safe)
    if mode == "token_mean":
        return masked.sum() / mask.sum().clamp_min(1)  # []
    if mode == "sequence_mean":
        counts = mask.sum(dim=1)  # [N]
        row_means = masked.sum(dim=1) / counts.clamp_min(1)  # [N], 0 for empty rows
        return row_means.sum() / (counts > 0).sum().clamp_min(1)  # []
    if mode == "constant":
        max_length = per_token.shape[1] if max_length is None else max_length
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        return masked.sum() / (per_token.shape[0] * max_length)  # []
    raise ValueError(f"mode must be 'token_mean', 'sequence_mean' or 'constant', got {mode!r}")


@dataclass(frozen=True)
class GRPOLossOutput:
    """What one GRPO step backpropagates and logs. Everything but ``loss`` is detached."""

    loss: Tensor
    """Scalar to backpropagate: aggregate(surrogate loss + beta * k3 KL)."""
    policy_loss: Tensor
    """Aggregated surrogate part (same aggregation as ``loss``)."""
    kl: Tensor
    """Aggregated k3 KL to the reference, so that ``loss = policy_loss + beta * kl``; 0 without a reference."""
    clip_fraction: Tensor
    """Fraction of the masked tokens whose clipped term was active."""
    ratio_mean: Tensor
    """Mean ratio over the masked tokens (exactly 1 on the first update of a rollout)."""


def _upcast(tensor: Tensor) -> Tensor:
    """Half-precision tensors to float32; float32 and float64 as they are."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def _check_shapes(logprobs: Tensor, advantages: Tensor, mask: Tensor, **same: Tensor | None) -> None:
    """Raise when the inputs of ``grpo_loss`` do not line up as ``[N, L]`` / ``[N]``."""
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [N, L], got shape {tuple(logprobs.shape)}")
    for name, tensor in {"mask": mask, **same}.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, logprobs has {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [N] = {tuple(logprobs.shape[:1])}, got {tuple(advantages.shape)}")


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    ref_logprobs: Tensor | None = None,
    aggregation: Aggregation = "token_mean",
    max_length: int | None = None,
) -> GRPOLossOutput:
    """GRPO loss from per-token log-probs ``[N, L]``, advantages ``[N]`` and the loss mask ``[N, L]``.

    The k3 KL is added per token, before aggregation. ``ref_logprobs`` is required when ``beta > 0``; with
    ``beta == 0`` it is only logged.
    """
    _check_shapes(logprobs, advantages, mask, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs)
    if beta < 0 or eps_low < 0 or eps_high < 0:
        raise ValueError(f"beta, eps_low and eps_high must be >= 0, got {beta}, {eps_low}, {eps_high}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta = {beta} > 0 needs ref_logprobs (log-probs under the reference model)")
    logprobs, old_logprobs, advantages = _upcast(logprobs), _upcast(old_logprobs), _upcast(advantages)  # [N, L], [N]
    policy_tok, ratio, is_clipped = clipped_surrogate(logprobs, old_logprobs, advantages, eps_low, eps_high)  # [N, L]
    per_token = policy_tok  # [N, L]
    kl = logprobs.new_zeros(())  # []
    if ref_logprobs is not None:
        kl_tok = k3_kl(logprobs, _upcast(ref_logprobs))  # [N, L]
        kl = aggregate(kl_tok.detach(), mask, aggregation, max_length)  # []
        if beta > 0:
            per_token = per_token + beta * kl_tok  # [N, L]
    with torch.no_grad():
        policy_loss = aggregate(policy_tok, mask, aggregation, max_length)  # []
        clip_fraction = aggregate(is_clipped.float(), mask)  # [], masked token mean
        ratio_mean = aggregate(ratio, mask)  # [], masked token mean
    loss = aggregate(per_token, mask, aggregation, max_length)  # []
    return GRPOLossOutput(loss, policy_loss, kl, clip_fraction, ratio_mean)

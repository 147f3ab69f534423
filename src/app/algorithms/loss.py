"""GRPO loss: the token-level clipped surrogate (PPO-clip), its sequence-level form (GSPO) and the clipped-IS objective
(CISPO), off-policy sequence masking, training on the high-entropy tokens only, the k3 KL to the reference, and the
three aggregations.

Shapes: N completions (B prompts x K, group-major), L completion tokens. Log-probs are of the sampled tokens. The loss
works in at least float32 (bf16/fp16 inputs are upcast); with ``old_logprobs = logprobs.detach()`` the ratio is
exactly 1. Equations: docs/algorithms.md#grpo-loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from app.algorithms.tally import TokenTally

Aggregation = Literal["token_mean", "sequence_mean", "constant"]
ImportanceSamplingLevel = Literal["token", "sequence"]
Objective = Literal["ppo_clip", "cispo"]


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


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``[N]``: the mean over each row's masked tokens of ``logprobs - old_logprobs``, i.e. ``log s_i`` with GSPO's
    sequence ratio ``s_i`` (the geometric mean of the token ratios); 0 for a row without a token. Padding values never
    leak (NaN-safe). Equation: docs/algorithms.md#sequence-level-importance-ratio-gspo."""
    mask = mask.bool()  # [N, L]
    delta = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))  # [N, L]
    return delta.sum(dim=1) / mask.sum(dim=1).clamp_min(1)  # [N]


def gspo_surrogate(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """GSPO's sequence-level clipped surrogate, negated to be minimised, broadcast to the tokens of each row.

    ``s_i = exp(sequence_log_ratio)``; ``loss_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``. Returns
    ``(loss [N, L], s [N], is_clipped [N, L] bool)``: every token of row i carries ``loss_i`` (so the usual aggregation
    applies) and the gradient reaches each masked token through ``s_i``; ``is_clipped`` marks the rows (on all their
    tokens) whose clipped term is strictly the smaller one.
    Equation: docs/algorithms.md#sequence-level-importance-ratio-gspo.
    """
    ratio = torch.exp(sequence_log_ratio(logprobs, old_logprobs, mask))  # [N]
    unclipped = ratio * advantages  # [N]
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages  # [N]
    loss = -torch.minimum(unclipped, clipped)  # [N]
    return loss[:, None].expand_as(logprobs), ratio, (clipped < unclipped)[:, None].expand_as(logprobs)


def cispo_surrogate(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """CISPO's loss per token: ``-sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A * logp_t``, ``sg`` = detached.

    Every token gets the gradient ``-w_t A grad(logp_t)`` with the clipped weight ``w_t``; none is clipped away (the
    loss value itself is not the surrogate's: only its gradient means something). ``eps_low >= 1`` leaves the weight
    unbounded below, as MiniMax-M1 ran it. Returns ``(loss [N, L], ratio [N, L], is_clipped [N, L] bool)``;
    ``is_clipped`` marks the tokens PPO-clip would clip (weight capped on the side the advantage pushes: ``r_t > 1 +
    eps_high`` with ``A > 0``, ``r_t < 1 - eps_low`` with ``A < 0``), which CISPO still trains with the capped weight.
    Equation: docs/algorithms.md#clipped-importance-sampling-weights-cispo.
    """
    adv = advantages[:, None]  # [N, 1]
    ratio = torch.exp(logprobs - old_logprobs).detach()  # [N, L], no gradient flows through the weight
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # [N, L]
    loss = -weight * adv * logprobs  # [N, L]
    return loss, ratio, weight * adv < ratio * adv  # [N, L] x 3


def off_policy_mask(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    max_log_ratio: float | None = None,
    max_kl: float | None = None,
) -> Tensor:
    """``[N]`` bool, True for the rows kept in the loss: a row whose sampling policy has drifted too far is left out.

    A row is masked when ``|log s_i| > max_log_ratio`` (``log s_i`` = :func:`sequence_log_ratio`) or when the mean over
    its tokens of the k3 estimate of ``KL(pi_old || pi)`` (``r - 1 - log r``, its tokens being samples of ``pi_old``)
    exceeds ``max_kl``; None disables a test. A row without a token is kept (it has no loss anyway); a NaN measure keeps
    the row, so a non-finite loss still surfaces. No gradient. Equation: docs/algorithms.md#off-policy-sequence-masking.
    """
    with torch.no_grad():
        keep = torch.ones(logprobs.shape[0], dtype=torch.bool, device=logprobs.device)  # [N]
        if max_log_ratio is not None:
            keep &= ~(sequence_log_ratio(logprobs, old_logprobs, mask).abs() > max_log_ratio)  # [N]
        if max_kl is not None:
            mask_bool = mask.bool()  # [N, L]
            kl_tok = torch.where(mask_bool, k3_kl(old_logprobs, logprobs), torch.zeros_like(logprobs))  # [N, L]
            keep &= ~(kl_tok.sum(dim=1) / mask_bool.sum(dim=1).clamp_min(1) > max_kl)  # [N]
    return keep


def high_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """``[N, L]`` bool: the tokens of ``mask`` whose entropy is in the top ``quantile`` fraction of the masked tokens'.

    The threshold is the ``1 - quantile`` quantile (linear interpolation, ``torch.quantile``) of the entropies of the
    tokens in ``mask``; tokens at or above it are kept, so ties at the threshold all stay. ``quantile = 1`` keeps every
    masked token; no masked token: none. Wang et al. 2025 train on the top 20 % (``quantile = 0.2``). No gradient.
    Equation: docs/algorithms.md#high-entropy-tokens."""
    with torch.no_grad():
        mask = mask.bool()  # [N, L]
        if quantile == 1 or not mask.any():
            return mask
        values = entropy.detach().float()[mask]  # [T]
        threshold = torch.quantile(values, 1.0 - quantile)  # []
        return mask & (entropy.detach().float() >= threshold)  # [N, L]


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
class LossOutput:
    """What the loss of one part of a rollout backpropagates and logs. Everything but ``loss`` is detached.

    A statistic a loss does not have is None and is not logged: DiffusionNFT has no likelihood ratio (no
    ``clip_fraction``, no ``ratio_mean``), liger-kernel's fused loss returns no ratio and, under ``sequence_mean`` with
    a reference, no per-row KL, and ``off_policy_masked`` exists only when off-policy masking is on."""

    loss: Tensor
    """Scalar to backpropagate: aggregate(surrogate loss + beta * k3 KL)."""
    policy_loss: Tensor | None
    """Aggregated surrogate part (same aggregation as ``loss``)."""
    kl: Tensor | None
    """Aggregated k3 KL to the reference, so that ``loss = policy_loss + beta * kl``; 0 without a reference."""
    clip_fraction: Tensor | None = None
    """Fraction of the masked tokens whose clipped term was active (under ``sequence`` level: the tokens of clipped
    rows; under ``cispo``: the tokens PPO-clip would clip, whose weight is capped)."""
    ratio_mean: Tensor | None = None
    """Mean token ratio ``exp(logp - old_logp)`` over the masked tokens (exactly 1 on the first update of a rollout),
    whatever the objective."""
    off_policy_masked: Tensor | None = None
    """Fraction of the rows with a token that off-policy masking left out of the loss."""
    entropy: TokenTally | None = None
    """The policy's per-token entropy summed over the loss's tokens, per task (None where the loss never sees the
    logits: the fused loss)."""

    def statistics(self) -> dict[str, Tensor]:
        """``loss`` (detached) and every statistic this loss has, by field name: what the GRPO step sums over a
        rollout's parts and logs."""
        values = {name: getattr(self, name) for name in LOSS_STATISTICS}
        return {"loss": self.loss.detach()} | {name: value for name, value in values.items() if value is not None}


LOSS_STATISTICS = ("policy_loss", "kl", "clip_fraction", "ratio_mean", "off_policy_masked")
"""The :class:`LossOutput` fields that are logged, when a loss has them."""


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
    importance_sampling_level: ImportanceSamplingLevel = "token",
    objective: Objective = "ppo_clip",
    off_policy_max_log_ratio: float | None = None,
    off_policy_max_kl: float | None = None,
    entropy: Tensor | None = None,
    top_entropy_quantile: float = 1.0,
) -> LossOutput:
    """GRPO loss from per-token log-probs ``[N, L]``, advantages ``[N]`` and the loss mask ``[N, L]``.

    The k3 KL is added per token, before aggregation. ``ref_logprobs`` is required when ``beta > 0``; with
    ``beta == 0`` it is only logged. The per-token policy loss is :func:`clipped_surrogate` (``token``, ``ppo_clip``:
    the default), :func:`gspo_surrogate` (``sequence``: each row's loss on every one of its tokens) or
    :func:`cispo_surrogate` (``cispo``, token level only). Rows :func:`off_policy_mask` leaves out (either threshold
    set) contribute nothing to the loss, its policy part or its KL, but stay in the aggregation's normaliser, so the
    loss of micro-batches weighted by their share of the normaliser is still the full-batch loss; ``clip_fraction`` and
    ``ratio_mean`` are taken over every masked token. With ``top_entropy_quantile < 1`` the policy term is kept only
    on :func:`high_entropy_mask`'s tokens of ``entropy`` ``[N, L]`` (the KL on every token, the normaliser unchanged,
    as Wang et al. 2025 and TRL do). The options' bounds and combinations (clip ranges and ``beta`` >= 0, ``cispo``
    token-level only, the quantile in (0, 1]) are checked where a config sets them,
    :class:`~app.settings.VLMLossSettings`.
    """
    _check_shapes(logprobs, advantages, mask, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs, entropy=entropy)
    if top_entropy_quantile != 1 and entropy is None:
        raise ValueError(f"top_entropy_quantile = {top_entropy_quantile} < 1 needs the per-token entropy")
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta = {beta} > 0 needs ref_logprobs (log-probs under the reference model)")
    logprobs, old_logprobs, advantages = _upcast(logprobs), _upcast(old_logprobs), _upcast(advantages)  # [N, L], [N]
    if importance_sampling_level == "sequence":
        policy_tok, _, is_clipped = gspo_surrogate(logprobs, old_logprobs, advantages, mask, eps_low, eps_high)
        ratio = torch.exp(logprobs - old_logprobs).detach()  # [N, L], for ratio_mean
    elif objective == "cispo":
        policy_tok, ratio, is_clipped = cispo_surrogate(logprobs, old_logprobs, advantages, eps_low, eps_high)
    elif objective == "ppo_clip":
        policy_tok, ratio, is_clipped = clipped_surrogate(logprobs, old_logprobs, advantages, eps_low, eps_high)
    else:  # the settings refuse it; a direct call must not silently train another objective
        raise ValueError(f"unknown objective {objective!r}; expected 'ppo_clip' or 'cispo'")
    kl_tok = k3_kl(logprobs, _upcast(ref_logprobs)) if ref_logprobs is not None else None  # [N, L]
    masked = None  # off-policy masking off: no fraction to log
    if off_policy_max_log_ratio is not None or off_policy_max_kl is not None:
        keep = off_policy_mask(logprobs, old_logprobs, mask, off_policy_max_log_ratio, off_policy_max_kl)  # [N]
        has_tokens = mask.bool().any(dim=1)  # [N]
        masked = ((has_tokens & ~keep).sum() / has_tokens.sum().clamp_min(1)).detach()  # []
        kept = keep[:, None].expand_as(mask)  # [N, L]
        policy_tok = torch.where(kept, policy_tok, torch.zeros_like(policy_tok))  # [N, L]
        if kl_tok is not None:
            kl_tok = torch.where(kept, kl_tok, torch.zeros_like(kl_tok))  # [N, L]
    if top_entropy_quantile != 1:
        high = high_entropy_mask(entropy, mask, top_entropy_quantile)  # [N, L]
        policy_tok = torch.where(high, policy_tok, torch.zeros_like(policy_tok))  # [N, L]
    per_token = policy_tok  # [N, L]
    kl = logprobs.new_zeros(())  # []
    if kl_tok is not None:
        kl = aggregate(kl_tok.detach(), mask, aggregation, max_length)  # []
        if beta > 0:
            per_token = per_token + beta * kl_tok  # [N, L]
    with torch.no_grad():
        policy_loss = aggregate(policy_tok, mask, aggregation, max_length)  # []
        clip_fraction = aggregate(is_clipped.float(), mask)  # [], masked token mean
        ratio_mean = aggregate(ratio, mask)  # [], masked token mean
    loss = aggregate(per_token, mask, aggregation, max_length)  # []
    return LossOutput(loss, policy_loss, kl, clip_fraction, ratio_mean, masked)

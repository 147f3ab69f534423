"""GRPO-Guard (Wang et al. 2025, arXiv:2510.22319) as pure tensor math: the flow-GRPO loss with the ratio normalised
per denoising step and the policy term reweighted by ``1 / dt`` (docs/algorithms.md#grpo-guard).

One stochastic step draws ``x' = mu_old + std z`` (``z ~ N(0, I)``, D latent elements). With log-probs averaged over
the elements (:mod:`app.sampling.flow`) the per-step log-ratio of the policy's mean ``mu`` is::

    logp - logp_old = mean(z (mu - mu_old)) / std - mean((mu - mu_old)^2) / (2 std^2)

so its expectation over the noise is ``-mean((mu - mu_old)^2) / (2 std^2) < 0`` (the "left-shifted" ratio, whose mean
falls below 1 and whose spread varies with the step's std). GRPO-Guard adds that bias back and rescales by ``std``::

    log r_hat = (logp - logp_old + mean((mu - mu_old)^2) / (2 std^2)) * std  =  mean(z (mu - mu_old))

a log-ratio of mean exactly 0 whatever the step, clipped as usual, and divides the step's clipped surrogate by
``dt = s - s'`` (the mean moves with the velocity in proportion to ``dt``, so every step's gradient gets the same
scale). The bias keeps its gradient (the reference implementations let it flow through ``mu``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from app.algorithms.loss import LossOutput, aggregate, grpo_loss, k3_kl


def normalized_log_ratio(
    logprobs: Tensor, old_logprobs: Tensor, mean: Tensor, old_mean: Tensor, std: Tensor | float
) -> Tensor:
    """``[n]`` GRPO-Guard's per-step log-ratio ``(logp - logp_old + mean((mu - mu_old)^2) / (2 std^2)) * std``.

    Args:
        logprobs: ``[n]`` log-density of the stored transitions under the policy (mean over latent elements).
        old_logprobs: ``[n]`` the same under the sampling policy.
        mean: ``[n, ...]`` the policy's transition mean ``mu`` (with gradients).
        old_mean: ``[n, ...]`` the sampling policy's ``mu_old`` (detached here).
        std: the transition's std, a number or ``[n]``, > 0.
    """
    std = torch.as_tensor(std, dtype=torch.promote_types(logprobs.dtype, torch.float32), device=logprobs.device)
    if not bool((std > 0).all()):
        raise ValueError("the transition std must be > 0 (a deterministic step has no ratio to normalise)")
    drift = (mean - old_mean.detach()).flatten(1).to(std.dtype).square().mean(dim=1)  # [n]
    return (logprobs.to(std.dtype) - old_logprobs.to(std.dtype) + drift / (2 * std**2)) * std  # [n]


def guarded_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mean: Tensor,
    old_mean: Tensor,
    std: Tensor | float,
    dt: float,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    beta: float = 0.0,
    ref_logprobs: Tensor | None = None,
) -> LossOutput:
    """GRPO-Guard's loss of one denoising step over ``n`` trajectories, averaged over the ``mask``-ed rows.

    ``loss = mean_rows(-min(r_hat A, clip(r_hat, 1 - eps_low, 1 + eps_high) A)) / dt + beta * mean_rows(k3)``, with
    ``r_hat = exp(`` :func:`normalized_log_ratio` ``)`` and the k3 KL to the reference taken on the plain log-probs
    (as flow-GRPO's, not reweighted). ``dt = s - s' > 0`` is the step's decrease in sigma. ``clip_fraction`` and
    ``ratio_mean`` are those of ``r_hat``; ``policy_loss`` includes the ``1 / dt``.
    """
    if not dt > 0:
        raise ValueError(f"dt = s - s' must be > 0, got {dt}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta = {beta} > 0 needs ref_logprobs (log-probs under the reference model)")
    log_ratio = normalized_log_ratio(logprobs, old_logprobs, mean, old_mean, std)[:, None]  # [n, 1]
    rows = mask[:, None]  # [n, 1]
    clipped = grpo_loss(log_ratio, torch.zeros_like(log_ratio), advantages, rows, eps_low=eps_low, eps_high=eps_high)
    policy = clipped.loss / dt  # []
    kl = log_ratio.new_zeros(())  # []
    loss = policy
    if ref_logprobs is not None:
        plain = logprobs.to(log_ratio.dtype)[:, None]  # [n, 1]
        kl_rows = k3_kl(plain, ref_logprobs.to(log_ratio.dtype)[:, None])  # [n, 1]
        if beta > 0:
            loss = loss + beta * aggregate(kl_rows, rows)
        kl = aggregate(kl_rows.detach(), rows)
    return LossOutput(loss, policy.detach(), kl, clipped.clip_fraction, clipped.ratio_mean)

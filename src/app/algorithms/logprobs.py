"""Per-token log-probabilities of sampled completions under the policy, without full-vocabulary logits.

``log p(y_t | y_<t) = z[y_t] - logsumexp(z)`` with ``z = lm_head(h_t) / temperature`` in float32, where the
temperature is the sampler's, so the log-probs are those of the distribution the tokens were drawn from.

:func:`token_logprobs_naive` is the reference: it builds the ``[N, L, V]`` float32 logits, which for 8 completions of
1,024 tokens over Qwen's 151,936-token vocabulary is 5 GB, and its backward holds about three such tensors.
:func:`chunked_token_logprobs` gives the same values and gradients while holding only ``[chunk_size, V]`` logits at a
time: each chunk runs under activation checkpointing (its logits are recomputed in backward, not saved), and its
softmax gradient is written in place (two ``[chunk_size, V]`` buffers in backward instead of about four).
See docs/algorithms.md#token-log-probabilities.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint


def token_logprobs_naive(hidden: Tensor, lm_head: nn.Module, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Reference log-probs: the whole ``[N, L, V]`` float32 logits at once. Returns ``[N, L]`` float32."""
    _check(hidden, targets, temperature=temperature)
    logits = lm_head(hidden).float() / temperature  # [N, L, V]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.long()[..., None]).squeeze(-1)  # [N, L]


def chunked_token_logprobs(
    hidden: Tensor, lm_head: nn.Module, targets: Tensor, chunk_size: int = 1024, temperature: float = 1.0
) -> Tensor:
    """Log-probs of ``targets`` computed ``chunk_size`` tokens at a time; equals :func:`token_logprobs_naive`.

    Args:
        hidden: ``[N, L, H]`` final hidden states at the positions that predict ``targets`` (any float dtype).
        lm_head: the output projection, called as a module (``nn.Linear`` with or without bias, or PEFT-wrapped).
        targets: ``[N, L]`` token ids, all valid (mask padding afterwards, not with ``-100``).
        chunk_size: tokens per chunk; peak memory is O(chunk_size * V) with or without grad.
        temperature: the sampling temperature; logits are divided by it.

    Returns:
        ``[N, L]`` float32 log-probs, differentiable w.r.t. ``hidden`` and ``lm_head``'s parameters.
    """
    _check(hidden, targets, temperature=temperature)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n, length, h = hidden.shape
    flat_hidden = hidden.reshape(n * length, h)  # [T, H], T = N * L
    flat_targets = targets.reshape(n * length).long()  # [T]
    out = []
    for start in range(0, n * length, chunk_size):
        args = (lm_head, flat_hidden[start : start + chunk_size], flat_targets[start : start + chunk_size], temperature)
        if torch.is_grad_enabled():  # recompute the chunk's [C, V] logits in backward instead of saving them
            out.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))  # [C]
        else:
            out.append(_chunk_logprobs(*args))  # [C]
    if not out:
        return hidden.new_zeros(n, length, dtype=torch.float32)
    return torch.cat(out).view(n, length)  # [N, L]


def _chunk_logprobs(lm_head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float) -> Tensor:
    logits = lm_head(hidden).float()  # [C, V]
    return _TargetLogProb.apply(logits, targets, temperature)  # [C]


class _TargetLogProb(torch.autograd.Function):
    """``z[t] - logsumexp(z)`` for ``z = logits / temperature``; backward adds one ``[C, V]`` buffer to the saved z."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
        z = logits  # [C, V]
        if temperature != 1.0:  # the division copies [C, V]; at 1 the logits serve as they are
            z = logits / temperature  # [C, V]
        lse = torch.logsumexp(z, dim=1)  # [C]
        ctx.save_for_backward(z, targets, lse)
        ctx.temperature = temperature
        return z.gather(1, targets[:, None]).squeeze(1) - lse  # [C]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None]:
        z, targets, lse = ctx.saved_tensors
        g = (grad_out / ctx.temperature)[:, None]  # [C, 1]
        grad = (z - lse[:, None]).exp_().mul_(-g)  # [C, V] -softmax(z) * g
        return grad.scatter_add_(1, targets[:, None], g), None, None  # [C, V] (onehot - softmax) * g


def _check(hidden: Tensor, targets: Tensor, temperature: float) -> None:
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [N, L, H], got shape {tuple(hidden.shape)}")
    if tuple(targets.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"targets must be [N, L] = {tuple(hidden.shape[:2])} like hidden, got {tuple(targets.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

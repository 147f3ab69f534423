"""Per-token log-probabilities of sampled completions under the policy, without full-vocabulary logits.

``log p(y_t | y_<t) = z[y_t] - logsumexp(z)`` with ``z = lm_head(h_t) / temperature`` in float32, where the
temperature is the sampler's, so the log-probs are those of the distribution the tokens were drawn from.

:func:`token_logprobs_naive` is the reference: it builds the ``[N, L, V]`` float32 logits, which for 8 completions of
1,024 tokens over Qwen's 151,936-token vocabulary is 5 GB, and its backward holds about three such tensors.
:func:`chunked_token_logprobs` gives the same values and gradients while holding only ``[chunk_size, V]`` logits at a
time: each chunk runs under activation checkpointing (its logits are recomputed in backward, not saved), and its
softmax gradient is written in place (two ``[chunk_size, V]`` buffers in backward instead of about four).
:func:`chunked_token_logprobs_and_entropy` also returns each position's entropy ``H_t = logsumexp(z) - sum_v p_v z_v``
of the same tempered distribution, from the chunk's logits while they are in memory (no second pass over the model or
the head; no gradient). See docs/algorithms.md#token-log-probabilities and #token-entropy.
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


def token_entropy_naive(hidden: Tensor, lm_head: nn.Module, temperature: float = 1.0) -> Tensor:
    """Reference entropy ``[N, L]`` float32 of the tempered next-token distribution, from the whole logits at once."""
    logits = lm_head(hidden).float() / temperature  # [N, L, V]
    logp = torch.log_softmax(logits, dim=-1)  # [N, L, V]
    return -(logp.exp() * logp).sum(dim=-1)  # [N, L]


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
    return _chunked(hidden, lm_head, targets, chunk_size, temperature, with_entropy=False)[0]


def chunked_token_logprobs_and_entropy(
    hidden: Tensor, lm_head: nn.Module, targets: Tensor, chunk_size: int = 1024, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """:func:`chunked_token_logprobs` and the entropy ``[N, L]`` float32 (detached) of each position's tempered
    distribution, computed from the same chunk of logits; equals :func:`token_entropy_naive`."""
    logprobs, entropy = _chunked(hidden, lm_head, targets, chunk_size, temperature, with_entropy=True)
    return logprobs, entropy


def _chunked(
    hidden: Tensor, lm_head: nn.Module, targets: Tensor, chunk_size: int, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    _check(hidden, targets, temperature=temperature)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n, length, h = hidden.shape
    flat_hidden = hidden.reshape(n * length, h)  # [T, H], T = N * L
    flat_targets = targets.reshape(n * length).long()  # [T]
    logprobs, entropies = [], []
    for start in range(0, n * length, chunk_size):
        args = (
            lm_head,
            flat_hidden[start : start + chunk_size],
            flat_targets[start : start + chunk_size],
            temperature,
            with_entropy,
        )
        if torch.is_grad_enabled():  # recompute the chunk's [C, V] logits in backward instead of saving them
            logprob, entropy = checkpoint(_chunk_logprobs, *args, use_reentrant=False)  # [C], [C]
        else:
            logprob, entropy = _chunk_logprobs(*args)  # [C], [C]
        logprobs.append(logprob)
        entropies.append(entropy)
    if not logprobs:
        empty = hidden.new_zeros(n, length, dtype=torch.float32)
        return empty, empty.clone() if with_entropy else None
    entropy = torch.cat(entropies).view(n, length) if with_entropy else None  # [N, L]
    return torch.cat(logprobs).view(n, length), entropy  # [N, L]


def _chunk_logprobs(
    lm_head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    logits = lm_head(hidden).float()  # [C, V]
    return _TargetLogProb.apply(logits, targets, temperature, with_entropy)  # [C], [C] (empty without entropy)


class _TargetLogProb(torch.autograd.Function):
    """``z[t] - logsumexp(z)`` for ``z = logits / temperature``; backward adds one ``[C, V]`` buffer to the saved z.

    With ``with_entropy`` the second output is ``logsumexp(z) - sum_v softmax(z)_v z_v`` (one more ``[C, V]``
    buffer in forward, freed at once; not differentiable); without, an empty tensor."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool) -> tuple[Tensor, Tensor]:
        z = logits  # [C, V]
        if temperature != 1.0:  # the division copies [C, V]; at 1 the logits serve as they are
            z = logits / temperature  # [C, V]
        lse = torch.logsumexp(z, dim=1)  # [C]
        ctx.save_for_backward(z, targets, lse)
        ctx.temperature = temperature
        if with_entropy:
            entropy = lse - (z - lse[:, None]).exp_().mul_(z).sum(dim=1)  # [C]
        else:
            entropy = lse.new_empty(0)
        ctx.mark_non_differentiable(entropy)
        return z.gather(1, targets[:, None]).squeeze(1) - lse, entropy  # [C], [C]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor, _grad_entropy: Tensor) -> tuple[Tensor, None, None, None]:
        z, targets, lse = ctx.saved_tensors
        g = (grad_out / ctx.temperature)[:, None]  # [C, 1]
        grad = (z - lse[:, None]).exp_().mul_(-g)  # [C, V] -softmax(z) * g
        return grad.scatter_add_(1, targets[:, None], g), None, None, None  # [C, V] (onehot - softmax) * g


def _check(hidden: Tensor, targets: Tensor, temperature: float) -> None:
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [N, L, H], got shape {tuple(hidden.shape)}")
    if tuple(targets.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"targets must be [N, L] = {tuple(hidden.shape[:2])} like hidden, got {tuple(targets.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

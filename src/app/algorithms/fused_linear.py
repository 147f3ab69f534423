"""The GRPO loss fused with the output head: liger-kernel's ``LigerFusedLinearGRPOLoss`` takes the final hidden states
and the head's weight and computes the per-token log-probs, the clipped surrogate, the k3 KL and their aggregation
chunk by chunk, computing the gradients of the hidden states and the head in the same pass, so neither the
``[N, L, V]`` logits nor the ``[N, L]`` log-probs' autograd graph are kept.

The math is :func:`app.algorithms.loss.grpo_loss`'s; each aggregation maps onto one of Liger's ``loss_type``\\ s:

- ``token_mean`` -> ``bnpo`` (sum over the masked tokens / their number);
- ``constant`` -> ``dr_grpo`` (sum / (N * max_length));
- ``sequence_mean`` -> ``grpo`` rescaled: Liger divides the sum of the rows' masked means by all N rows, ours by the
  rows that have a token, so its loss is multiplied by N / (rows with a token), a constant.

The objectives (docs/algorithms.md#fused-linear-grpo-loss): ``importance_sampling_level: sequence`` (GSPO) is Liger's
``importance_sampling_level="sequence"`` with the same sequence ratio, clip and broadcast, for every aggregation.
``objective: cispo`` is Liger's ``loss_type="cispo"``, whose weight is ``clamp(r, max=epsilon_high)`` (an absolute
bound, so it gets ``1 + eps_high``) with no lower bound, and whose normaliser is the token count: it is supported for
``token_mean`` (the count of this call's tokens is passed as ``num_items_in_batch``, so Liger never all-reduces it
across ranks) and ``constant`` (rescaled by tokens / (N * max_length)), with ``eps_low >= 1`` (no lower bound, as
``cispo_surrogate`` has then). Refused by :class:`~app.settings.VLMLossSettings`, naming the option: ``cispo`` with
``sequence_mean`` or ``eps_low < 1``, off-policy masking (it needs each row's current log-probs before the loss, which
the fused loss never materialises) and high-entropy token selection (Liger computes no entropy, which is therefore
not logged either).

Statistics: Liger returns the clip fraction and (with a reference) the token-mean k3 KL, from which the KL in the
loss's aggregation follows for ``token_mean`` and ``constant``, and the policy loss as ``loss - beta * kl``. It does not
return the ratio, nor a per-row KL: ``ratio_mean`` is None (not logged) unless the old log-probs are the current ones
(then the ratio is 1 by construction, and its masked mean 1, or 0 without a token, as ``grpo_loss`` gives), and under
``sequence_mean`` with a reference ``kl`` and ``policy_loss`` are None.
Equations: docs/algorithms.md#fused-linear-grpo-loss.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from app.algorithms.loss import Aggregation, ImportanceSamplingLevel, LossOutput, Objective
from app.errors import ConfigError

LIGER_LOSS_TYPES: dict[str, str] = {"token_mean": "bnpo", "sequence_mean": "grpo", "constant": "dr_grpo"}
"""Our aggregation -> liger-kernel's ``loss_type`` with the same per-token math and normaliser (up to a constant)."""


def require_liger_loss() -> None:
    """A short :class:`~app.errors.ConfigError` when liger-kernel is not installed (no silent fallback)."""
    if importlib.util.find_spec("liger_kernel") is None:
        raise ConfigError(
            "loss.fused_linear needs liger-kernel (pip install -e '.[gpu]', or pip install liger-kernel); "
            "set loss.fused_linear: false"
        )


def check_fused_head(lm_head: nn.Module) -> None:
    """The fused loss multiplies by the head's weight itself: a head wrapped by LoRA (or anything but a plain
    ``nn.Linear``) would lose its adapter, so it is refused."""
    kind = type(lm_head)
    if kind is not nn.Linear:
        raise ConfigError(
            f"loss.fused_linear needs a plain nn.Linear output head, got {kind.__module__}.{kind.__qualname__} "
            "(LoRA on lm_head is not supported by the fused loss); drop lm_head from the LoRA targets or set "
            "loss.fused_linear: false"
        )


@dataclass(frozen=True)
class FusedLinearGRPOLoss:
    """GRPO loss settings for liger-kernel's fused linear GRPO loss (see the module docstring), from
    :class:`~app.settings.VLMLossSettings`, which checks them.

    Attributes:
        eps_low: the ratio's lower clip, ``1 - eps_low``, as in :func:`~app.algorithms.loss.grpo_loss`.
        eps_high: the ratio's upper clip, ``1 + eps_high``, as in :func:`~app.algorithms.loss.grpo_loss`.
        beta: weight of the k3 KL to the reference.
        aggregation: ``token_mean``, ``sequence_mean`` or ``constant``.
        max_length: ``constant``'s L_max (the generation budget); None: the completion length L.
        compiled: let Liger ``torch.compile`` its loss math (worth it on GPU; on CPU it needs a C++ compiler).
        importance_sampling_level: ``token`` or ``sequence`` (GSPO), as in :func:`~app.algorithms.loss.grpo_loss`.
        objective: ``ppo_clip`` or ``cispo`` (token level, ``token_mean`` or ``constant``, ``eps_low >= 1``).
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.0
    aggregation: Aggregation = "token_mean"
    max_length: int | None = None
    compiled: bool = True
    importance_sampling_level: ImportanceSamplingLevel = "token"
    objective: Objective = "ppo_clip"

    def __call__(
        self,
        hidden: Tensor,
        lm_head: nn.Linear,
        targets: Tensor,
        advantages: Tensor,
        mask: Tensor,
        old_logprobs: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
        temperature: float = 1.0,
    ) -> LossOutput:
        """The loss of ``targets`` ``[N, L]`` given the hidden states ``[N, L, H]`` that predict them.

        ``old_logprobs`` None means the current log-probs detached (ratio 1); ``ref_logprobs`` is required when
        ``beta > 0``. Same result as :func:`~app.algorithms.loss.grpo_loss` on
        ``chunked_token_logprobs(hidden, lm_head, targets, temperature=temperature)``."""
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        if self.beta > 0 and ref_logprobs is None:
            raise ValueError(f"beta = {self.beta} > 0 needs ref_logprobs (log-probs under the reference model)")
        check_fused_head(lm_head)
        n, length = targets.shape
        max_length = length if self.max_length is None else self.max_length
        use_ref = self.beta > 0
        cispo = self.objective == "cispo"
        liger = LigerFusedLinearGRPOLoss(
            beta=self.beta if use_ref else 0.0,
            compiled=self.compiled,
            use_ref_model=use_ref,
            # one chunk: Liger bounds the logits by sequence x vocabulary chunks inside it
            chunk_size=max(n, 1),
            epsilon_low=self.eps_low,
            epsilon_high=1.0 + self.eps_high if cispo else self.eps_high,  # cispo's bound is absolute
            loss_type="cispo" if cispo else LIGER_LOSS_TYPES[self.aggregation],
            max_completion_length=max_length,
            importance_sampling_level=self.importance_sampling_level,
            temperature=temperature,
        )
        weights = mask.float()  # [N, L]
        tokens = weights.sum().clamp_min(1)  # []
        loss, metrics = liger(
            hidden,
            lm_head.weight,
            targets.long(),
            weights,
            advantages.float(),
            bias=lm_head.bias,
            ref_per_token_logps=ref_logprobs if use_ref else None,
            old_per_token_logps=old_logprobs,
            # cispo divides by num_items_in_batch / world size: this call's tokens, never all-reduced across ranks
            num_items_in_batch=weights.sum() * _world_size() if cispo else None,
        )
        if self.aggregation == "sequence_mean":
            loss = loss * (n / (weights.sum(dim=1) > 0).sum().clamp_min(1))  # Liger divides by all N rows
        elif cispo and self.aggregation == "constant":
            loss = loss * (tokens / (n * max_length))  # Liger's cispo divides by the tokens
        kl_token_mean, clip_fraction = metrics if use_ref else (None, metrics[0])
        if kl_token_mean is None:
            kl = torch.zeros((), device=loss.device)
        elif self.aggregation == "token_mean":
            kl = kl_token_mean
        elif self.aggregation == "constant":
            kl = kl_token_mean * tokens / (n * max_length)
        else:
            kl = None  # a per-row mean of the KL that Liger does not return
        policy_loss = loss.detach() - self.beta * kl if kl is not None else None  # no reference: beta and kl are 0
        ratio_mean = None if old_logprobs is not None else (weights.sum() > 0).float()  # 1, as a masked mean
        # no off-policy masking here (VLMLossSettings refuses it)
        return LossOutput(loss, policy_loss, _detached(kl), clip_fraction.detach(), ratio_mean)


def _detached(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach()


def _world_size() -> int:
    """The number of processes Liger divides ``num_items_in_batch`` by (1 without torch.distributed)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_world_size() if distributed else 1

"""The rollout of a vision-language policy: K sampled completions per prompt, their behaviour and reference
log-probs, and the re-scoring of stored completions for the loss (the VLM family's counterpart of
:mod:`app.sampling.flow_rollout`).

Group layout: completion row ``b * K + k`` belongs to prompt ``b``. Log-probs are per token, ``[N, L]`` float32, at the
sampling temperature, so they are those of the distribution the tokens were drawn from (:mod:`app.algorithms.logprobs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from app.sampling.batching import micro_batches
from app.settings import SamplingSettings
from app.types import CompletionBatch, PromptInputs, SampledCompletions, VisualSample

__all__ = ["VLMSampler"]


class CompletionPolicy(Protocol):
    """What :class:`VLMSampler` asks of a policy (:class:`~app.models.VLMPolicy` has it all)."""

    def encode_prompts(self, samples: list[VisualSample], group_size: int = 1) -> PromptInputs: ...

    def generate(
        self, prompt_inputs: PromptInputs, sampling: SamplingSettings, greedy: bool = False, group_size: int = 1
    ) -> CompletionBatch: ...

    def sequence_logprobs(self, prompt_inputs, completion_ids, completion_mask, temperature: float = 1.0) -> Tensor: ...

    def sequence_logprobs_and_entropy(
        self, prompt_inputs, completion_ids, completion_mask, temperature: float = 1.0
    ) -> tuple[Tensor, Tensor]: ...

    def reference_logprobs(
        self, prompt_inputs, completion_ids, completion_mask, temperature: float = 1.0
    ) -> Tensor: ...


class VLMSampler:
    """Draws a VLM policy's completions and scores stored ones, ``micro_batch_size`` rows per forward pass.

    Args:
        policy: the vision-language policy.
        settings: how completions are drawn (group size K, temperature, top_p, budget).
        micro_batch_size: rows per log-prob forward pass; None: all at once.
    """

    def __init__(self, policy: CompletionPolicy, settings: SamplingSettings, micro_batch_size: int | None = None):
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        self.policy = policy
        self.settings = settings
        self.micro_batch_size = micro_batch_size

    @torch.no_grad()
    def draw(self, samples: list[VisualSample], behaviour: bool, reference: bool) -> SampledCompletions:
        """K completions per prompt; with ``behaviour`` their log-probs under the sampling policy (computed now,
        before any later update), with ``reference`` under the reference."""
        k = self.settings.group_size
        prompt_inputs = self.policy.encode_prompts(samples, group_size=k)  # rows b*K + k
        completions = self.policy.generate(prompt_inputs, self.settings, group_size=k)
        old = self._in_micro_batches(self.policy.sequence_logprobs, prompt_inputs, completions) if behaviour else None
        ref = self._in_micro_batches(self.policy.reference_logprobs, prompt_inputs, completions) if reference else None
        return SampledCompletions(prompt_inputs, completions, old_logprobs=old, ref_logprobs=ref)

    def logprobs(self, sampled: SampledCompletions, rows: slice) -> Tensor:
        """``[n, L]`` per-token log-probs of the stored completions ``rows`` under the current policy, with gradients
        where they are enabled: the one place a stored completion is re-scored for the loss."""
        completions = sampled.completions
        return self.policy.sequence_logprobs(
            sampled.prompt_inputs.select(rows),
            completions.completion_ids[rows],
            completions.completion_mask[rows],
            self.settings.temperature,
        )

    def logprobs_and_entropy(self, sampled: SampledCompletions, rows: slice) -> tuple[Tensor, Tensor]:
        """:meth:`logprobs` and the policy's per-token entropy ``[n, L]`` (detached) from the same forward pass."""
        completions = sampled.completions
        return self.policy.sequence_logprobs_and_entropy(
            sampled.prompt_inputs.select(rows),
            completions.completion_ids[rows],
            completions.completion_mask[rows],
            self.settings.temperature,
        )

    def _in_micro_batches(self, logprob_fn: Callable, prompt_inputs: PromptInputs, completions: CompletionBatch):
        ids, mask, temperature = completions.completion_ids, completions.completion_mask, self.settings.temperature
        rows = micro_batches(len(prompt_inputs), self.micro_batch_size)
        return torch.cat([logprob_fn(prompt_inputs.select(r), ids[r], mask[r], temperature) for r in rows])

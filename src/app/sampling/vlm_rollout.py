"""The rollout of a vision-language policy: K sampled completions per prompt, their behaviour and reference
log-probs, and the re-scoring of stored completions for the loss (the VLM family's counterpart of
:mod:`app.sampling.flow_rollout`).

Group layout: completion row ``b * K + k`` belongs to prompt ``b``. Log-probs are per token, ``[N, L]`` float32, at the
sampling temperature, so they are those of the distribution the tokens were drawn from (:mod:`app.algorithms.logprobs`).

Stored completions are re-scored in micro-batches of rows of similar length (prompt plus completion tokens), each
re-padded to its own longest prompt and completion (:meth:`VLMSampler.micro_batch`), so the forward computes little
on padding whatever the attention backend; the policy may further pack the rows (``VLMPolicy(padding_free=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from app.models.shared_prefix import take_rows
from app.sampling.batching import length_grouped_micro_batches
from app.settings import SamplingSettings
from app.types import CompletionBatch, PromptInputs, SampledCompletions, VisualSample

__all__ = ["MicroBatch", "VLMSampler"]


@dataclass(frozen=True)
class MicroBatch:
    """Rows of stored completions, re-padded to their own longest prompt and completion.

    Attributes:
        rows: the rows' indices in the rollout.
        prompt_inputs: their prompts, without the columns of left padding they all share.
        completion_ids: ``[n, width]`` their completions, cut after the longest one's last token.
        completion_mask: ``[n, width]``.
        length: L, the rollout's completion length, which :meth:`pad` restores.
    """

    rows: list[int]
    prompt_inputs: PromptInputs
    completion_ids: Tensor
    completion_mask: Tensor
    length: int

    @property
    def width(self) -> int:
        return self.completion_ids.shape[1]

    def pad(self, per_token: Tensor) -> Tensor:
        """``[n, width]`` -> ``[n, L]``, zeros after ``width`` (padding positions, outside every mask)."""
        return torch.nn.functional.pad(per_token, (0, self.length - self.width))

    def cut(self, per_token: Tensor | None) -> Tensor | None:
        """A rollout's ``[N, L]`` per-token tensor at these rows, ``[n, width]``; None stays None."""
        return None if per_token is None else per_token[self.rows, : self.width]


class CompletionPolicy(Protocol):
    """What :class:`VLMSampler` asks of a policy (:class:`~app.models.VLMPolicy` has it all)."""

    def encode_prompts(self, samples: list[VisualSample], rows_per_prompt: int = 1) -> PromptInputs: ...

    def generate(
        self, prompt_inputs: PromptInputs, sampling: SamplingSettings, greedy: bool = False, rows_per_prompt: int = 1
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
        prompt_inputs = self.policy.encode_prompts(samples, rows_per_prompt=k)  # rows b*K + k
        completions = self.policy.generate(prompt_inputs, self.settings, rows_per_prompt=k)
        old = self._in_micro_batches(self.policy.sequence_logprobs, prompt_inputs, completions) if behaviour else None
        ref = self._in_micro_batches(self.policy.reference_logprobs, prompt_inputs, completions) if reference else None
        return SampledCompletions(prompt_inputs, completions, old_logprobs=old, ref_logprobs=ref)

    def micro_batches(self, sampled: SampledCompletions) -> list[list[int]]:
        """The row groups stored completions are re-scored in: at most ``micro_batch_size`` rows each, grouped by
        length (prompt plus completion tokens, see :func:`~app.sampling.batching.length_grouped_micro_batches`)."""
        prompt_tokens = sampled.prompt_inputs.tensors["attention_mask"].sum(dim=1)  # [N]
        lengths = (prompt_tokens + sampled.completions.completion_mask.sum(dim=1)).tolist()  # [N]
        return length_grouped_micro_batches(lengths, self.micro_batch_size)

    def micro_batch(self, sampled: SampledCompletions, rows: Sequence[int]) -> MicroBatch:
        """The stored completions ``rows`` with their prompts, re-padded to their own longest prompt and completion."""
        completions = sampled.completions
        index = torch.tensor(list(rows), dtype=torch.long, device=completions.completion_ids.device)
        mask = completions.completion_mask.index_select(0, index)  # [n, L]
        width = max(int(mask.sum(dim=1).max()), 1) if len(index) else 0
        ids = completions.completion_ids.index_select(0, index)[:, :width]  # [n, width]
        every_row = list(rows) == list(range(len(sampled.prompt_inputs)))  # one micro-batch: no copy of the prompts
        prompts = (sampled.prompt_inputs if every_row else take_rows(sampled.prompt_inputs, list(rows))).trimmed()
        return MicroBatch(list(rows), prompts, ids, mask[:, :width], completions.completion_ids.shape[1])

    def logprobs(self, sampled: SampledCompletions, rows: Sequence[int]) -> Tensor:
        """``[n, L]`` per-token log-probs of the stored completions ``rows`` under the current policy, with gradients
        where they are enabled: the one place a stored completion is re-scored for the loss."""
        batch = self.micro_batch(sampled, rows)
        logprobs = self.policy.sequence_logprobs(
            batch.prompt_inputs, batch.completion_ids, batch.completion_mask, self.settings.temperature
        )
        return batch.pad(logprobs)

    def logprobs_and_entropy(self, sampled: SampledCompletions, rows: Sequence[int]) -> tuple[Tensor, Tensor]:
        """:meth:`logprobs` and the policy's per-token entropy ``[n, L]`` (detached) from the same forward pass."""
        batch = self.micro_batch(sampled, rows)
        logprobs, entropy = self.policy.sequence_logprobs_and_entropy(
            batch.prompt_inputs, batch.completion_ids, batch.completion_mask, self.settings.temperature
        )
        return batch.pad(logprobs), batch.pad(entropy)

    def _in_micro_batches(self, logprob_fn: Callable, prompt_inputs: PromptInputs, completions: CompletionBatch):
        """``[N, L]`` log-probs of freshly drawn completions under ``logprob_fn``, in length-grouped micro-batches."""
        sampled = SampledCompletions(prompt_inputs, completions, old_logprobs=None, ref_logprobs=None)
        out = torch.zeros(completions.completion_ids.shape, device=completions.completion_ids.device)  # [N, L]
        for rows in self.micro_batches(sampled):
            batch = self.micro_batch(sampled, rows)
            values = logprob_fn(
                batch.prompt_inputs, batch.completion_ids, batch.completion_mask, self.settings.temperature
            )
            out[rows] = batch.pad(values).to(out.dtype)
        return out

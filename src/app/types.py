"""Typed containers passed between the stages of the loop (data -> rollout -> rewards -> loss).

Shapes use N = B * K rows (B prompts, K completions each, group-major: row ``b * K + k``), P prompt tokens and
L completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image


@dataclass
class VisualSample:
    """One prompt: its images, the question, and what rewards and SFT may read.

    ``answer`` is optional on purpose: label-free training runs on samples without it.
    ``reasoning`` is the chain of thought used by supervised fine-tuning (Reason-RFT stage 1).
    """

    images: list[Image.Image]
    question: str
    task: str
    answer: str | None = None
    reasoning: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class PromptInputs:
    """Processor outputs for N prompt rows (left-padded), with what is needed to select rows of them.

    Attributes:
        tensors: ``input_ids`` / ``attention_mask`` / ``mm_token_type_ids`` ``[N, P]``; ``pixel_values``
            ``[num_patches, D]`` (the patches of all images, in row order) and ``image_grid_thw`` ``[num_images, 3]``.
        images_per_row: number of images in each row.
        copies_of: for each row, the index of the distinct prompt it holds: rows with the same index hold the same
            tokens and images (``encode_prompts(repeats=K)`` repeats each prompt K times), so what depends on the
            prompt alone (image features, positions) can be computed once per index. None: every row is its own.
    """

    tensors: dict[str, torch.Tensor]
    images_per_row: list[int]
    copies_of: list[int] | None = None

    def __len__(self) -> int:
        return self.tensors["input_ids"].shape[0]

    def select(self, rows: slice) -> PromptInputs:
        """The rows ``rows`` (a contiguous slice), with their images' patches."""
        start, stop, _ = rows.indices(len(self))
        if (start, stop) == (0, len(self)):
            return self
        out = {k: v[start:stop] for k, v in self.tensors.items() if k not in ("pixel_values", "image_grid_thw")}
        if "image_grid_thw" in self.tensors:
            grid = self.tensors["image_grid_thw"]  # [num_images, 3]
            first_image, last_image = sum(self.images_per_row[:start]), sum(self.images_per_row[:stop])
            patches = grid.prod(dim=1)  # [num_images]
            first_patch, last_patch = int(patches[:first_image].sum()), int(patches[:last_image].sum())
            out["image_grid_thw"] = grid[first_image:last_image]
            out["pixel_values"] = self.tensors["pixel_values"][first_patch:last_patch]
        copies_of = self.copies_of[start:stop] if self.copies_of is not None else None
        return PromptInputs(out, self.images_per_row[start:stop], copies_of)


@dataclass
class CompletionBatch:
    """K sampled completions for each of B prompts.

    Attributes:
        completion_ids: ``[N, L]`` token ids, right-padded with the pad id.
        completion_mask: ``[N, L]`` 1 for real completion tokens (up to and including EOS), 0 for padding.
        texts: N decoded completions (special tokens skipped).
        truncated: ``[N]`` bool, True where the completion hit ``max_new_tokens`` without an EOS.
        group_size: K.
    """

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor
    group_size: int


@dataclass
class RewardOutput:
    """Weighted total reward and every named component, one value per completion.

    Attributes:
        total: ``[N]`` weighted sum of the components.
        components: name -> ``[N]`` unweighted component values.
        num_nonfinite: non-finite values (NaN, inf) the components returned for this batch, replaced by 0.
    """

    total: torch.Tensor
    components: dict[str, torch.Tensor]
    num_nonfinite: int = 0


@dataclass
class GRPOBatch:
    """Everything one GRPO update needs; built once per rollout and reused for ``num_iterations`` updates.

    Attributes:
        prompt_inputs: the B prompts, each repeated K times (N rows).
        completions: the sampled completions.
        old_logprobs: ``[N, L]`` log-probs under the policy that sampled them; None when ``num_iterations == 1`` and
            the reward pipeline has no delay (then the current log-probs, detached, are the old ones and the ratio is
            exactly 1).
        ref_logprobs: ``[N, L]`` log-probs under the reference (adapter disabled), or None when beta == 0.
        advantages: ``[N]`` group-relative advantages.
        loss_mask: ``[N, L]`` tokens that enter the loss (completion mask, minus dropped groups / truncated rows).
        rewards: the reward output used for the advantages.
        group_size: K, completions per prompt (rows ``b * K .. b * K + K - 1`` are prompt ``b``'s group).
    """

    prompt_inputs: PromptInputs
    completions: CompletionBatch
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    rewards: RewardOutput
    group_size: int


@dataclass
class CompletionRecord:
    """One row of the completion table that logging callbacks write."""

    step: int
    task: str
    question: str
    completion: str
    answer: str | None
    reward: float
    advantage: float
    components: dict[str, float]


@dataclass
class FlowTrajectory:
    """One flow-GRPO rollout: the trained transitions of N = B * K denoising trajectories and their scores.

    Only the transitions that enter the loss are kept (S of the T steps, in sampling order); the others are not needed
    for the update. ``...`` stands for the policy's ``latent_shape`` (``[C, h, w]`` or ``[C, t, h, w]``).

    Attributes:
        conditioning: the prompt encodings, every tensor with N rows (each prompt repeated K times, group-major).
        sigmas: ``[T + 1]`` float32 noise levels of the schedule, ending at 0 (on the host).
        step_indices: the S trained steps ``i`` (transition ``sigmas[i] -> sigmas[i + 1]``), increasing.
        latents: ``[N, S, ...]`` float32 ``x_t`` before each trained step.
        next_latents: ``[N, S, ...]`` float32 ``x_{t+1}`` sampled by each trained step.
        old_logprobs: ``[N, S]`` float32 log-density of each sampled transition under the rollout policy (MEAN over
            latent elements, see :mod:`app.sampling.flow`).
        ref_logprobs: ``[N, S]`` the same under the reference (adapter disabled), or None when beta == 0.
        images: ``[N, 3, H, W]`` or ``[N, F, 3, H, W]`` decoded final samples in [0, 1].
        rewards: the reward output of the N samples.
        advantages: ``[N]`` group-relative advantages.
        loss_mask: ``[N]`` bool, False for samples left out of the loss (dropped zero-std groups).
        group_size: K, trajectories per prompt.
    """

    conditioning: dict[str, torch.Tensor]
    sigmas: torch.Tensor
    step_indices: list[int]
    latents: torch.Tensor
    next_latents: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    images: torch.Tensor
    rewards: RewardOutput
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    group_size: int

"""Typed containers passed between the stages of the loop (data -> rollout -> rewards -> loss).

Shapes use N = B * K rows (B prompts, K completions each, group-major: row ``b * K + k``), P prompt tokens and
L completion tokens. Where a flow run spreads each group over R = ``grpo.group_ranks`` ranks, a rank's rollout holds
``rows_per_prompt`` = K / R rows of each prompt, and K in the rollout containers below reads as that; K itself (the
whole group, ``sampling.group_size``) is ``group_size`` wherever it appears.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from PIL import Image

IMAGE_TOKEN = "<image>"
"""A placeholder in ``VisualSample.question`` marking where one of the sample's images goes in a VLM prompt (one per
image, in order); a question without placeholders has its images, then its videos, before its text."""

VIDEO_TOKEN = "<video>"
"""A placeholder in ``VisualSample.question`` marking where one of the sample's videos goes (one per video, in order),
like :data:`IMAGE_TOKEN`; a question with placeholders has one for every image and every video."""

PAIR_RELATIONS = ("identity", "negation")
"""How the answer of a prompt's augmented twin relates to the prompt's (``meta["relation"]`` of the twin):
``identity`` (equal) or ``negation`` (the opposite; boolean answers only)."""


@dataclass
class Video:
    """A clip as a vision-language model reads it: its frames and their rate.

    Attributes:
        frames: ``[F, H, W, 3]`` uint8 RGB frames, F >= 1, in time order.
        fps: frames per second of these frames (after any sampling): frame ``i`` is at ``i / fps`` seconds. Qwen2.5-VL
            puts that time in its rotary positions and Qwen3-VL writes it in the prompt.
    """

    frames: np.ndarray
    fps: float

    def __post_init__(self):
        shape = getattr(self.frames, "shape", None)
        if not isinstance(self.frames, np.ndarray) or self.frames.dtype != np.uint8 or len(shape) != 4:
            raise ValueError(
                f"Video.frames must be a uint8 array [F, H, W, 3], got {type(self.frames).__name__} {shape}"
            )
        if shape[0] < 1 or shape[3] != 3:
            raise ValueError(f"Video.frames must be [F >= 1, H, W, 3], got {tuple(shape)}")
        if not self.fps > 0:
            raise ValueError(f"Video.fps must be > 0, got {self.fps}")

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])


@dataclass
class VisualSample:
    """One prompt: its images and videos, the question, and what rewards and SFT may read.

    ``question`` may hold :data:`IMAGE_TOKEN` and :data:`VIDEO_TOKEN` placeholders, one per image and per video, where
    they go. ``answer`` is optional on purpose: label-free training runs on samples without it.
    ``reasoning`` is the chain of thought used by supervised fine-tuning (Reason-RFT stage 1).
    """

    images: list[Image.Image]
    question: str
    task: str
    answer: str | None = None
    reasoning: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    videos: list[Video] = field(default_factory=list)


@dataclass(frozen=True)
class VisualInputs:
    """The processor outputs of one kind of visual input (images or videos) in :attr:`PromptInputs.tensors`.

    Attributes:
        patches: the key of ``[num_patches, D]``: the patches of all items (images or videos), in row order.
        grid: the key of ``[num_items, 3]``: each item's (t, h, w) patch grid; its product is the item's patch count.
        per_item: keys of ``[num_items]`` tensors with one value per item (Qwen2.5-VL's ``second_per_grid_ts``).
    """

    patches: str
    grid: str
    per_item: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.patches, self.grid, *self.per_item)


IMAGE_INPUTS = VisualInputs("pixel_values", "image_grid_thw")
VIDEO_INPUTS = VisualInputs("pixel_values_videos", "video_grid_thw", ("second_per_grid_ts",))
VISUAL_INPUTS = (IMAGE_INPUTS, VIDEO_INPUTS)
VISUAL_KEYS = frozenset(key for kind in VISUAL_INPUTS for key in kind.keys)
"""The prompt tensors that are not per token: the images' and videos' patches, grids and per-video values."""


@dataclass
class PromptInputs:
    """Processor outputs for N prompt rows (left-padded), with what is needed to select rows of them.

    Attributes:
        tensors: ``input_ids`` / ``attention_mask`` / ``mm_token_type_ids`` ``[N, P]``; ``pixel_values``
            ``[num_patches, D]`` (the patches of all images, in row order) and ``image_grid_thw`` ``[num_images, 3]``;
            likewise ``pixel_values_videos`` and ``video_grid_thw`` for videos (and, for Qwen2.5-VL,
            ``second_per_grid_ts`` ``[num_videos]``), see :data:`VISUAL_INPUTS`.
        images_per_row: number of images in each row.
        copies_of: for each row, the index of the distinct prompt it holds: rows with the same index hold the same
            tokens, images and videos (``encode_prompts(rows_per_prompt=K)`` repeats each prompt K times), so what
            depends on the prompt alone (vision features, positions) can be computed once per index. None: every row is
            its own.
        videos_per_row: number of videos in each row; None: no row has a video.
    """

    tensors: dict[str, torch.Tensor]
    images_per_row: list[int]
    copies_of: list[int] | None = None
    videos_per_row: list[int] | None = None

    def __len__(self) -> int:
        return self.tensors["input_ids"].shape[0]

    def per_row(self, kind: VisualInputs) -> list[int]:
        """Number of items of ``kind`` (images or videos) in each row."""
        if kind == IMAGE_INPUTS:
            return self.images_per_row
        return self.videos_per_row if self.videos_per_row is not None else [0] * len(self.images_per_row)

    def visual_kinds(self) -> list[VisualInputs]:
        """The kinds of visual input these rows hold (images, videos)."""
        return [kind for kind in VISUAL_INPUTS if kind.grid in self.tensors]

    def slices(self, kind: VisualInputs) -> tuple[list[slice], list[slice]]:
        """For each row, the slice of its items of ``kind`` in the grid (and per-item tensors) and the slice of their
        patches."""
        patches = self.tensors[kind.grid].prod(dim=1).tolist()  # [num_items]
        item_slices, patch_slices, item, patch = [], [], 0, 0
        for count in self.per_row(kind):
            size = sum(patches[item : item + count])
            item_slices.append(slice(item, item + count))
            patch_slices.append(slice(patch, patch + size))
            item, patch = item + count, patch + size
        return item_slices, patch_slices

    def select(self, rows: slice) -> PromptInputs:
        """The rows ``rows`` (a contiguous slice), with their images' and videos' patches (a kind none of them holds
        left out)."""
        start, stop, _ = rows.indices(len(self))
        if (start, stop) == (0, len(self)):
            return self
        out = {k: v[start:stop] for k, v in self.tensors.items() if k not in VISUAL_KEYS}
        for kind in self.visual_kinds():
            item_slices, patch_slices = self.slices(kind)
            if stop == start or item_slices[start].start == item_slices[stop - 1].stop:
                continue
            items = slice(item_slices[start].start, item_slices[stop - 1].stop)
            patches = slice(patch_slices[start].start, patch_slices[stop - 1].stop)
            out[kind.patches] = self.tensors[kind.patches][patches]
            for key in (kind.grid, *kind.per_item):
                if key in self.tensors:
                    out[key] = self.tensors[key][items]
        copies_of = self.copies_of[start:stop] if self.copies_of is not None else None
        videos = self.videos_per_row[start:stop] if self.videos_per_row is not None else None
        return PromptInputs(out, self.images_per_row[start:stop], copies_of, videos)

    def trimmed(self) -> PromptInputs:
        """These rows without the leading columns that are left padding in every row: the same prompts to the model
        (Qwen-VL counts positions over the attention mask), at the rows' own longest length."""
        mask = self.tensors["attention_mask"]  # [N, P]
        first = int(mask.any(dim=0).int().argmax()) if mask.numel() else 0  # the first column with a real token
        if first == 0:
            return self
        out = {k: v if k in VISUAL_KEYS else v[:, first:] for k, v in self.tensors.items()}
        return dataclasses.replace(self, tensors=out)


@dataclass
class CompletionBatch:
    """``rows_per_prompt`` sampled completions for each of B prompts (K in training).

    Attributes:
        completion_ids: ``[N, L]`` token ids, right-padded with the pad id.
        completion_mask: ``[N, L]`` 1 for real completion tokens (up to and including EOS), 0 for padding.
        texts: N decoded completions (special tokens skipped).
        truncated: ``[N]`` bool, True where the completion hit ``max_new_tokens`` without an EOS.
        rows_per_prompt: completions of each prompt (rows ``b * k .. b * k + k - 1`` are prompt ``b``'s): K in a GRPO
            rollout, the evaluation's samples per prompt in an evaluation.
    """

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor
    rows_per_prompt: int


@dataclass
class RewardOutput:
    """Weighted total reward and every named component, one value per completion.

    Attributes:
        total: ``[N]`` weighted sum of the components.
        components: name -> ``[N]`` unweighted component values.
        num_nonfinite: non-finite values (NaN, inf) the components returned for this batch, replaced by 0.
        unscored: ``[N]`` bool, the rows a component could not score and skipped (a remote reward that is down, with
            ``on_failure: skip``); their values are placeholders and their groups stay out of the loss. None: every row
            was scored.
    """

    total: torch.Tensor
    components: dict[str, torch.Tensor]
    num_nonfinite: int = 0
    unscored: torch.Tensor | None = None


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


# ------------------------------------------------------------------------------------------------------ rollouts
@dataclass
class SampledCompletions:
    """What a VLM rollout draws (:class:`~app.sampling.VLMSampler`): K completions of each of B prompts, N = B * K rows.

    Attributes:
        prompt_inputs: the B prompts, each repeated K times (N rows).
        completions: the sampled completions.
        old_logprobs: ``[N, L]`` log-probs under the policy that sampled them (at the sampling temperature); None when
            the rollout is trained once, by the policy that sampled it (then the current log-probs, detached, are the
            old ones and the ratio is exactly 1).
        ref_logprobs: ``[N, L]`` log-probs under the reference (adapter disabled), or None when beta == 0.
    """

    prompt_inputs: PromptInputs
    completions: CompletionBatch
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None

    @property
    def outputs(self) -> list[str]:
        """What the rewards score: the completions' texts."""
        return self.completions.texts


@dataclass
class SampledTrajectories:
    """What a flow rollout draws (:class:`~app.sampling.FlowSampler`): the trained transitions of K denoising
    trajectories of each of B prompts, N = B * K rows.

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
    """

    conditioning: dict[str, torch.Tensor]
    sigmas: torch.Tensor
    step_indices: list[int]
    latents: torch.Tensor
    next_latents: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    images: torch.Tensor

    @property
    def outputs(self) -> list[torch.Tensor]:
        """What the rewards score: the decoded samples, one ``[3, H, W]`` (or ``[F, 3, H, W]``) tensor each."""
        return list(self.images)


@dataclass
class SampledImages:
    """What a DiffusionNFT rollout draws (:meth:`~app.sampling.FlowSampler.draw_samples`): the final samples of K
    denoising runs of each of B prompts, N = B * K rows, and nothing of the trajectories (the update noises the clean
    latents again, on the forward process).

    Attributes:
        conditioning: the prompt encodings, every tensor with N rows (each prompt repeated K times, group-major).
        sigmas: ``[T + 1]`` float32 noise levels of the sampling schedule, ending at 0 (on the host); the update trains
            at these levels.
        latents: ``[N, ...]`` float32 clean latents ``x_0`` the solver ended at.
        images: ``[N, 3, H, W]`` or ``[N, F, 3, H, W]`` decoded samples in [0, 1].
    """

    conditioning: dict[str, torch.Tensor]
    sigmas: torch.Tensor
    latents: torch.Tensor
    images: torch.Tensor

    @property
    def outputs(self) -> list[torch.Tensor]:
        """What the rewards score: the decoded samples, one ``[3, H, W]`` (or ``[F, 3, H, W]``) tensor each."""
        return list(self.images)


Sampled = TypeVar("Sampled", SampledCompletions, SampledTrajectories, SampledImages)


@dataclass
class Generation(Generic[Sampled]):
    """A rollout before its rewards are in (what the rollout queue carries between steps).

    Attributes:
        samples: the B prompts.
        sampled: what the family's sampler drew for them (N = B * K rows, row ``b * K + k`` from prompt ``b``).
        version: rollouts trained before this one was generated (the policy that sampled it).
        rewards: pending (``app.rewards.PendingRewards``) while the workers score it, a :class:`RewardOutput` once
            collected.
    """

    samples: list[VisualSample]
    sampled: Sampled
    version: int = 0
    rewards: Any = None

    @property
    def outputs(self) -> list[Any]:
        """The N outputs the rewards score (texts, or decoded images / videos)."""
        return self.sampled.outputs


@dataclass
class Rollout(Generic[Sampled]):
    """Everything one GRPO update needs, in either family; built once per rollout and reused for ``num_iterations``
    updates.

    Attributes:
        samples: the B prompts.
        sampled: the family's draw (:class:`SampledCompletions`, :class:`SampledTrajectories` or
            :class:`SampledImages`).
        rewards: the reward output used for the advantages.
        advantages: ``[N]`` float32 group-relative advantages.
        loss_mask: what enters the loss: ``[N, L]`` completion tokens (minus dropped groups and, if asked, truncated
            completions) for a VLM, ``[N]`` bool trajectories for a flow model (one "token" per trained step).
        rows_per_prompt: the outputs of each prompt in this rollout, k: K, or K / ``grpo.group_ranks`` when a group is
            spread over ranks (rows ``b * k .. b * k + k - 1`` are prompt ``b``'s).
    """

    samples: list[VisualSample]
    sampled: Sampled
    rewards: RewardOutput
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    rows_per_prompt: int


@dataclass(frozen=True)
class GroupShare:
    """This rank's part of every group when a group's K outputs are spread over ``ranks`` consecutive ranks
    (``grpo.group_ranks``): outputs ``index * K / ranks`` up to ``(index + 1) * K / ranks`` of each prompt.

    Rows stay group-major: the whole groups of B prompts are ``B * K`` rows (row ``b * K + k``), and this rank holds
    ``B * K / ranks`` of them (its row ``b * K / ranks + j`` is whole row ``b * K + index * K / ranks + j``). Noise
    drawn through :meth:`randn` is what one process holding the whole groups draws, sliced to this rank's rows, so a
    spread group is sampled exactly as one process would sample it.

    Attributes:
        index: this rank's place among the ranks that share a group (``global_rank % ranks``).
        ranks: ranks that share each group.
        group_size: K, the whole group's outputs per prompt.
    """

    index: int
    ranks: int
    group_size: int

    def __post_init__(self):
        if self.ranks < 1 or not 0 <= self.index < self.ranks:
            raise ValueError(f"a group share needs 0 <= index < ranks, got index {self.index} of {self.ranks}")
        if self.group_size % self.ranks:
            raise ValueError(
                f"a group of {self.group_size} outputs cannot be spread evenly over {self.ranks} ranks: "
                "sampling.group_size must be a multiple of grpo.group_ranks"
            )

    @property
    def rows_per_prompt(self) -> int:
        """Outputs of each group this rank draws (K / ranks)."""
        return self.group_size // self.ranks

    def rows(self, num_prompts: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[B * K / ranks]`` int64 indices of this rank's rows among the ``B * K`` rows of the whole groups."""
        own = torch.arange(self.rows_per_prompt, device=device) + self.index * self.rows_per_prompt  # [K / ranks]
        starts = torch.arange(num_prompts, device=device) * self.group_size  # [B]
        return (starts[:, None] + own[None, :]).reshape(-1)

    def local(self, whole: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``whole`` ``[B * K, ...]`` (the whole groups)."""
        return whole[self.rows(len(whole) // self.group_size, whole.device)]

    def randn(
        self, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | str, dtype=torch.float32
    ) -> torch.Tensor:
        """Standard normal noise of this rank's rows, ``shape = (B * K / ranks, ...)``: drawn for the whole groups'
        ``B * K`` rows from ``generator`` (every rank of the share draws the same) and sliced."""
        num_prompts = shape[0] // self.rows_per_prompt
        whole = torch.randn(
            (num_prompts * self.group_size, *shape[1:]), generator=generator, device=device, dtype=dtype
        )
        return self.local(whole)

"""Phase 2 of the GRPO step: a rollout's rewards -> group advantages and the rows that stay in the loss.

Groups with a row some reward could not score are left out whole (and counted); the advantages are taken by
``grpo.advantage_scale`` over whole groups (when ``grpo.group_ranks`` spreads a group over ranks, its parts are put
back together first, :func:`~app.modules.group_spread.whole_groups`); groups of equal rewards are dropped when
``grpo.drop_zero_std_groups`` or dynamic sampling asks. Equations: docs/algorithms.md#grpo-advantages.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from app.algorithms import PromptStatTracker, group_advantages, moments_std, reward_moments, zero_std_groups
from app.modules.group_spread import whole_groups
from app.settings import GRPOSettings
from app.types import GroupShare, RewardOutput, VisualSample

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ScoredGroups:
    """Rewards of N = B * K outputs and what the loss makes of them.

    Attributes:
        rewards: the weighted total ``[N]`` and every component.
        advantages: ``[N]`` float32 group-relative advantages, on the module's device.
        keep: ``[N]`` bool, False for outputs left out of the loss (groups of equal rewards, when dropped).
    """

    rewards: RewardOutput
    advantages: Tensor
    keep: Tensor


class GroupScoring:
    """Advantages and kept rows of a rollout's rewards, with the state that outlives a step: the per-prompt reward
    history (``advantage_scale: per_prompt``, saved per rank) and the count of skipped groups.

    Args:
        grpo: the advantage scale, the per-prompt history length and ``drop_zero_std_groups``.
        group_size: K, the outputs of each prompt over every rank that shares its group.
        drop_equal_groups: leave groups of equal rewards out of the loss (``drop_zero_std_groups``, or dynamic
            sampling, which refills them).
    """

    def __init__(self, grpo: GRPOSettings, group_size: int, drop_equal_groups: bool) -> None:
        self.grpo, self.group_size, self.drop_equal_groups = grpo, group_size, drop_equal_groups
        self.prompt_stats = PromptStatTracker(grpo.prompt_history) if grpo.advantage_scale == "per_prompt" else None
        self.skipped_groups = 0  # groups left out of updates because a reward could not score them

    def scored(
        self,
        rewards: RewardOutput,
        samples: Sequence[VisualSample] | None,
        share: GroupShare | None,
        rank: int,
        device: torch.device,
    ) -> ScoredGroups:
        """Group advantages and kept rows of this rank's rewards; ``samples``: the B prompts (``per_prompt`` needs
        them); ``share``: this rank's part of every group (None: whole groups here)."""
        k = self.group_size
        unscored = rewards.unscored.to(device) if rewards.unscored is not None else None
        total, unscored = self.whole_groups(rewards.total.float().to(device), share, rank, unscored)  # [B * K] each
        scored = self._scored_rows(unscored, len(total), device)  # [B * K] bool
        advantages = torch.zeros_like(total)  # [B * K]; 0 in skipped groups, which stay out of the loss
        groups_kept = scored.view(-1, k)[:, 0].tolist() if len(total) else []
        prompts = samples if samples is not None else [None] * len(groups_kept)
        kept_prompts = [sample for sample, kept in zip(prompts, groups_kept, strict=True) if kept]
        advantages[scored] = self._advantages(total[scored], kept_prompts, device)
        keep = scored.clone()  # [B * K]
        if self.drop_equal_groups:
            keep &= ~zero_std_groups(total, k).repeat_interleave(k)  # [B * K]
        if share is not None:
            advantages, keep = share.local(advantages), share.local(keep)
        return ScoredGroups(rewards, advantages, keep)

    @staticmethod
    def whole_groups(
        total: Tensor, share: GroupShare | None, rank: int, unscored: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """The rewards ``[B * K]`` (and unscored rows) of the whole groups this rank holds a part of (this rank's own
        when groups stay on one rank)."""
        if share is None:
            return total, unscored
        return whole_groups(share, rank, total, unscored)

    def _advantages(self, total: Tensor, prompts: list[VisualSample], device: torch.device) -> Tensor:
        """``[n]`` advantages of the scored rows ``total`` (whole groups of K, of ``prompts``) by
        ``grpo.advantage_scale``; ``global`` all-reduces on every rank, whatever it scored."""
        k, scale = self.group_size, self.grpo.advantage_scale
        if scale == "global":
            moments = _summed_over_ranks(reward_moments(total).to(device))
            return group_advantages(total, k, "batch", batch_std=moments_std(moments)) if len(total) else total
        if not len(total):
            return total
        if scale == "per_prompt":
            return self.prompt_stats.advantages([prompt_key(p) for p in prompts], total)
        return group_advantages(total, k, scale=scale)

    def _scored_rows(self, unscored: Tensor | None, n: int, device: torch.device) -> Tensor:
        """``[n]`` bool: the rows of the groups every reward scored. A group with a row that a reward skipped
        (``unscored``, from ``RewardOutput.unscored``: a remote reward that failed, with ``on_failure: skip``) is left
        out whole, counted in :attr:`skipped_groups` and logged. None: every row was scored."""
        k = self.group_size
        if unscored is None:
            return torch.ones(n, dtype=torch.bool, device=device)
        skipped = unscored.view(-1, k).any(dim=1)  # [B]
        self.skipped_groups += int(skipped.sum())
        log.warning(
            "%d of %d groups left out of this update: a reward could not score them (%d skipped so far)",
            int(skipped.sum()),
            len(skipped),
            self.skipped_groups,
        )
        return (~skipped).repeat_interleave(k)


def _summed_over_ranks(value: Tensor) -> Tensor:
    """``value`` summed over every rank of the run (itself in one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value


def prompt_key(sample: VisualSample) -> str:
    """What ``advantage_scale: per_prompt`` tracks a prompt by: its task and question."""
    return f"{sample.task}\x1f{sample.question}"

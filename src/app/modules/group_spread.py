"""Groups spread over ranks (``grpo.group_ranks``, docs/algorithms.md#grpo-advantages): what such a run refuses, and
the collective that puts a group's parts back together so its statistics are the whole group's."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from app.types import GroupShare


def check_group_ranks(module: Any, ranks: int) -> None:
    """Refuse, naming the option, what a GRPO module cannot do with each group spread over ``ranks`` ranks: a group
    size they do not divide; a family whose sampler cannot draw a rank's part of a group (``spreads_groups``); rewards
    that compare the rows of a group (each rank scores only its part); dynamic sampling (each rank would refill with
    prompts of its own)."""
    if module.group_size % ranks:
        raise ValueError(
            f"grpo.group_ranks {ranks} must divide sampling.group_size {module.group_size}: each rank draws K / R "
            "outputs of every group"
        )
    if not module.spreads_groups:
        raise ValueError(
            f"grpo.group_ranks > 1 is for the flow family (its sampler draws a rank's part of a group's noise); "
            f"{type(module).__name__} keeps each group on one rank: set grpo.group_ranks to 1"
        )
    comparing = [c.name for c in module.rewards.components if c.scope != "completion"]
    if comparing:
        raise ValueError(
            f"grpo.group_ranks > 1 scores each rank's part of a group apart, but {', '.join(comparing)} compare "
            "the outputs of a group: keep such rewards with grpo.group_ranks 1"
        )
    if module.pipeline.dynamic_sampling:
        raise ValueError(
            "pipeline.dynamic_sampling refills each rank with prompts of its own, which the ranks sharing a group "
            "(grpo.group_ranks > 1) would not share: use one of them"
        )


def whole_groups(
    share: GroupShare, global_rank: int, total: Tensor, unscored: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The rewards ``[B * K]`` and unscored rows of the whole groups whose ``share`` this rank holds (``total`` and
    ``unscored``: its own ``[B * K / R]``), all-gathered from the ranks of the share. One collective: every rank calls
    it, whatever it scored. ``unscored`` comes back None when no rank of the share skipped a row."""
    skipped = unscored.to(total.device).float() if unscored is not None else torch.zeros_like(total)
    mine = torch.stack([total, skipped])  # [2, B * K / R]
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    first = global_rank - share.index
    block = torch.stack(parts[first : first + share.ranks])  # [R, 2, B * K / R]
    whole = block.view(share.ranks, 2, -1, share.rows_per_prompt).permute(1, 2, 0, 3).reshape(2, -1)  # [2, B * K]
    return whole[0], (whole[1] > 0 if unscored is not None or bool(whole[1].any()) else None)

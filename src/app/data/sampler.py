"""A shuffling sampler that can resume mid-epoch, so a resumed run sees exactly the batches an uninterrupted one would."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler


def prompt_ranks(trainer, rank: int, world_size: int) -> tuple[int, int]:
    """This process's ``(rank, num_replicas)`` in the split of the training prompts, from its data-parallel ``rank``
    among ``world_size``: ranks that share groups (the module's ``ranks_per_group``, GRPO's ``grpo.group_ranks``,
    consecutive ranks) draw the same prompts, so they count as one replica."""
    module = getattr(trainer, "lightning_module", None) if trainer is not None else None
    sharing = getattr(module, "ranks_per_group", 1)
    if world_size % sharing:
        raise ValueError(f"grpo.group_ranks {sharing} must divide the number of processes ({world_size})")
    return rank // sharing, world_size // sharing


class ResumableShuffleSampler(DistributedSampler):
    """Shuffles ``length`` indices with a permutation drawn from ``(seed, epoch)`` and gives this rank its share.

    The share is that of :class:`~torch.utils.data.DistributedSampler` (the permutation padded with its head to a
    multiple of ``num_replicas``, then every ``num_replicas``-th index from ``rank``), so with one rank it is the whole
    permutation. Lightning calls ``set_epoch`` at every epoch start and, since this is a ``DistributedSampler``, does
    not wrap it. ``resume(epoch, num_indices)`` makes the next pass over ``epoch`` start after this rank's first
    ``num_indices`` indices, without loading the skipped samples.
    """

    def __init__(self, length: int, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas), got rank={rank}, num_replicas={num_replicas}")
        if 0 < length < num_replicas:
            raise ValueError(f"{length} training samples cannot be shared by {num_replicas} processes")
        # DistributedSampler's attributes, set here: its __init__ would ask torch.distributed for the ranks.
        self.dataset = None
        self.shuffle, self.drop_last = True, False
        self.length = length
        self.seed = seed
        self.num_replicas, self.rank = num_replicas, rank
        self.num_samples = math.ceil(length / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.epoch = 0
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, num_indices: int) -> None:
        self._resume = (epoch, num_indices)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.length, generator=generator).tolist()
        order += order[: self.total_size - len(order)]  # pad to a multiple of num_replicas (length >= num_replicas)
        share = order[self.rank :: self.num_replicas]
        resume, self._resume = self._resume, None
        start = resume[1] if resume is not None and resume[0] == self.epoch else 0
        return iter(share[start:])

    def __len__(self) -> int:
        return self.num_samples

"""A shuffling sampler that can resume mid-epoch, so a resumed run sees exactly the batches an uninterrupted one
would."""

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
    not wrap it.

    Resuming mid-epoch is by global sample index: after every rank of a run on ``W`` ranks has drawn ``n`` indices,
    the ranks together have drawn exactly the first ``W * n`` indices of the permutation, whatever ``W``.
    ``resume(epoch, consumed, counted)`` makes the next pass over ``epoch`` share the permutation from index
    ``consumed`` on between this run's ranks (the rest padded with the permutation's head, as a whole epoch is), so a
    run resumed on any number of ranks draws no index before ``consumed`` again and leaves none after it out (on the
    same number of ranks that is each rank's own share after its first ``n``). ``counted`` is how many indices the
    trainer counts this rank as having drawn already (batches done x batch size): it keeps ``len`` what the trainer's
    loop expects of the resumed epoch.
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
        self._resume: tuple[int, int, int] | None = None  # (epoch, consumed, counted) for the next pass

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, consumed: int, counted: int) -> None:
        """Start the next pass, if it is over ``epoch``, at global index ``consumed`` of its permutation; the trainer
        counts ``counted`` of this rank's indices as drawn already."""
        self._resume = (epoch, consumed, counted)

    def _start(self) -> tuple[int, int]:
        """``(consumed, counted)`` of the resume pending for this epoch, else ``(0, 0)``."""
        if self._resume is None or self._resume[0] != self.epoch:
            return 0, 0
        return self._resume[1], self._resume[2]

    def __iter__(self) -> Iterator[int]:
        consumed, _ = self._start()
        self._resume = None
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.length, generator=generator).tolist()
        rest = order[consumed:]
        rest += order[: -len(rest) % self.num_replicas]  # pad to a multiple of num_replicas (length >= num_replicas)
        return iter(rest[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        """This rank's indices per epoch; for a resumed epoch, ``counted`` plus its share of the rest when that is
        more (more ranks than saved: the trainer's batch count runs past a whole epoch's)."""
        consumed, counted = self._start()
        if consumed == 0 and counted == 0:
            return self.num_samples
        rest = max(self.length - consumed, 0)
        return max(self.num_samples, counted + math.ceil(rest / self.num_replicas))

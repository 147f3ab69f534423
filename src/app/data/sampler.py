"""A shuffling sampler that can resume mid-epoch, so a resumed run sees exactly the batches an uninterrupted one would."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ResumableShuffleSampler(Sampler[int]):
    """Shuffles ``length`` indices with a permutation drawn from ``(seed, epoch)``.

    Lightning calls ``set_epoch`` at every epoch start (and wraps the sampler for distributed runs). ``resume(epoch,
    num_indices)`` makes the next pass over ``epoch`` start after its first ``num_indices`` indices, without loading the
    skipped samples.
    """

    def __init__(self, length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self.epoch = 0
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, num_indices: int) -> None:
        self._resume = (epoch, num_indices)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.length, generator=generator).tolist()
        start = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            start = self._resume[1]
        self._resume = None
        return iter(order[start:])

    def __len__(self) -> int:
        return self.length

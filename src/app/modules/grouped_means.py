"""Means of evaluation figures per group (task, split, evaluation set), correct across processes.

Lightning's ``self.log(..., sync_dist=True)`` reduces each key with one collective call, so every process must log the
same keys in the same order. Per-group keys break that: under DDP a process's share of the validation set need not
hold every task or split, and mismatched collectives hang or pair the wrong values. :class:`GroupedMeans` keeps sums
and counts per key over the epoch and merges them across processes once, at its end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
import torch.distributed as dist


class GroupedMeans:
    """Running sums and counts per key; :meth:`compute` returns the means over every process's values."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def update(self, key: str, values: Iterable[float] | torch.Tensor) -> None:
        """Add ``values`` (floats, or a tensor of any shape) to ``key``."""
        if isinstance(values, torch.Tensor):
            values = values.detach().double().flatten().tolist()
        for value in values:
            self.sums[key] += float(value)
            self.counts[key] += 1

    def compute(self) -> dict[str, float]:
        """``key -> mean`` over the values of every process (a collective call when a process group is running: every
        process must call it, whatever keys it holds)."""
        sums, counts = dict(self.sums), dict(self.counts)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            shares: list[tuple[dict[str, float], dict[str, int]] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(shares, (sums, counts))
            sums, counts = defaultdict(float), defaultdict(int)
            for share_sums, share_counts in shares:
                for key, total in share_sums.items():
                    sums[key] += total
                    counts[key] += share_counts[key]
        return {key: sums[key] / counts[key] for key in sorted(counts) if counts[key]}

    def reset(self) -> None:
        self.sums.clear()
        self.counts.clear()


class GroupedEvaluation:
    """LightningModule mixin: :meth:`log_grouped` during an evaluation epoch, :meth:`log_grouped_means` at its end
    (``on_validation_epoch_end`` / ``on_test_epoch_end``) logs every key's mean over all processes."""

    @property
    def grouped_means(self) -> GroupedMeans:
        if "_grouped_means" not in self.__dict__:
            self._grouped_means = GroupedMeans()
        return self._grouped_means

    def log_grouped(self, key: str, values: Iterable[float] | torch.Tensor) -> None:
        self.grouped_means.update(key, values)

    def log_grouped_means(self) -> dict[str, float]:
        """Log the epoch's grouped means (the same keys on every process, so ``sync_dist`` is safe) and reset them.
        Every process calls it, including one whose share held no grouped values."""
        grouped = self.grouped_means
        means = grouped.compute()
        grouped.reset()
        for key, mean in means.items():
            self.log(key, mean, sync_dist=True)
        return means

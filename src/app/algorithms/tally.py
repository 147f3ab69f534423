"""Per-token statistics summed per group (e.g. per task) with their token counts, so the parts of a batch
(micro-batches, rollouts) add up exactly and are divided once: the mean of the sum is the mean over every part's
tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TokenTally:
    """Sums of a per-token statistic and the number of tokens summed, per group; all detached.

    ``(a + b).means()`` is each group's mean over the tokens of both ``a`` and ``b``; :meth:`mean` is over all groups.
    """

    sums: dict[str, Tensor]
    counts: dict[str, Tensor]

    @classmethod
    def of(cls, values: Tensor, mask: Tensor, groups: Sequence[str]) -> TokenTally:
        """Tally ``values`` ``[n, L]`` over the tokens in ``mask`` ``[n, L]``, row ``i`` counting for ``groups[i]``.
        Values outside the mask never leak (NaN-safe)."""
        if values.shape != mask.shape or len(groups) != values.shape[0]:
            raise ValueError(
                f"values {tuple(values.shape)}, mask {tuple(mask.shape)} and {len(groups)} groups must line up as "
                "[n, L], [n, L] and n"
            )
        mask = mask.bool()  # [n, L]
        values = torch.where(mask, values.detach().float(), torch.zeros((), device=values.device))  # [n, L]
        row_sums, row_counts = values.sum(dim=1), mask.sum(dim=1).float()  # [n], [n]
        sums: dict[str, Tensor] = {}
        counts: dict[str, Tensor] = {}
        for name in dict.fromkeys(groups):  # first-seen order
            rows = torch.tensor([g == name for g in groups], device=values.device)  # [n]
            sums[name] = row_sums[rows].sum()
            counts[name] = row_counts[rows].sum()
        return cls(sums, counts)

    def __add__(self, other: TokenTally) -> TokenTally:
        sums, counts = dict(self.sums), dict(self.counts)
        for name, value in other.sums.items():
            sums[name] = sums[name] + value if name in sums else value
            counts[name] = counts[name] + other.counts[name] if name in counts else other.counts[name]
        return TokenTally(sums, counts)

    def means(self) -> dict[str, Tensor]:
        """Each group's mean over its tokens; groups without a token are left out."""
        return {name: self.sums[name] / count for name, count in self.counts.items() if count > 0}

    def mean(self) -> Tensor:
        """The mean over every group's tokens; NaN without a token."""
        total = sum(self.counts.values(), torch.zeros(()))
        if not total > 0:
            return torch.full((), float("nan"))
        return sum(self.sums.values(), torch.zeros(())) / total

"""Micro-batches: the row groups a batch of N rows is processed in, to bound activation memory: contiguous slices, or
groups of rows of similar length (so that each group, padded to its own longest row, carries little padding)."""

from __future__ import annotations

from collections.abc import Sequence


def micro_batches(n: int, size: int | None) -> list[slice]:
    """``[0:size], [size:2 size], ...`` covering ``n`` rows; ``size=None`` is one slice of all of them.

    >>> micro_batches(5, 2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    >>> micro_batches(3, None)
    [slice(0, 3, None)]
    >>> micro_batches(0, None)
    []
    """
    if not n:
        return []
    size = size or n
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def length_grouped_micro_batches(lengths: Sequence[int], size: int | None) -> list[list[int]]:
    """Groups of at most ``size`` row indices, the rows sorted by length (longest first, ties in row order) and cut
    into consecutive groups; each group's rows ascending, the groups in the order of their first row. ``size=None``:
    one group of every row. With ``size=1`` the groups are the rows in order.

    >>> length_grouped_micro_batches([3, 9, 1, 8, 2], 2)
    [[0, 4], [1, 3], [2]]
    >>> length_grouped_micro_batches([3, 9, 1], None)
    [[0, 1, 2]]
    """
    n = len(lengths)
    if not n:
        return []
    size = size or n
    order = sorted(range(n), key=lambda row: (-lengths[row], row))
    groups = [sorted(order[start : start + size]) for start in range(0, n, size)]
    return sorted(groups, key=lambda group: group[0])

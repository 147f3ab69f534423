"""Micro-batches: the contiguous row slices a batch of N rows is processed in, to bound activation memory."""

from __future__ import annotations


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

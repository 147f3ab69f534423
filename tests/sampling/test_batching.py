"""Micro-batch slices: every row once, in order, at most ``size`` rows each."""

import pytest

from app.sampling.batching import micro_batches


@pytest.mark.parametrize(
    ("n", "size", "expected"),
    [
        (5, 2, [(0, 2), (2, 4), (4, 5)]),
        (4, 2, [(0, 2), (2, 4)]),
        (3, 8, [(0, 3)]),
        (3, None, [(0, 3)]),  # None: one slice of every row
        (1, None, [(0, 1)]),
        (0, None, []),  # no rows, no slices
        (0, 4, []),
    ],
)
def test_micro_batches_cover_every_row_once_in_slices_of_at_most_size(n, size, expected):
    assert [(s.start, s.stop) for s in micro_batches(n, size)] == expected

"""Micro-batches: slices (every row once, in order, at most ``size`` rows each) and length-grouped row groups."""

import pytest
import torch

from app.sampling.batching import length_grouped_micro_batches, micro_batches


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


@pytest.mark.parametrize("size", [1, 2, 3, 8, None])
@pytest.mark.parametrize("seed", range(5))
def test_length_grouped_micro_batches_partition_the_rows_by_length(size, seed):
    lengths = torch.randint(1, 50, (11,), generator=torch.Generator().manual_seed(seed)).tolist()
    groups = length_grouped_micro_batches(lengths, size)
    assert sorted(row for group in groups for row in group) == list(range(11))  # every row once
    assert all(group == sorted(group) for group in groups) and all(len(g) <= (size or 11) for g in groups)
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)
    # cut from the rows sorted longest first: a group's shortest row is no shorter than a later-cut group's longest
    by_length = sorted(groups, key=lambda g: -max(lengths[r] for r in g))
    for longer, shorter in zip(by_length, by_length[1:], strict=False):
        assert min(lengths[r] for r in longer) >= max(lengths[r] for r in shorter)
    if size == 1:
        assert groups == [[row] for row in range(11)]


def test_length_grouping_saves_the_padding_of_unequal_rows():
    """Rows of 16-512 tokens in micro-batches of 8: padded to their group's longest, far less than to the longest."""
    lengths = torch.randint(16, 513, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    padded = sum(len(g) * max(lengths[r] for r in g) for g in length_grouped_micro_batches(lengths, 8))
    in_order = sum(8 * max(lengths[i : i + 8]) for i in range(0, 32, 8))
    assert padded < 0.75 * in_order and padded >= sum(lengths)

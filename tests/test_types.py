"""The typed containers' own logic: a rank's share of groups spread over ranks."""

import pytest
import torch

from app.types import GroupShare


def test_a_share_holds_its_slice_of_every_group_in_group_major_order():
    share = GroupShare(index=1, ranks=2, group_size=4)
    assert share.rows_per_prompt == 2
    assert share.rows(3).tolist() == [2, 3, 6, 7, 10, 11]
    whole = torch.arange(12.0)
    assert share.local(whole).tolist() == [2.0, 3.0, 6.0, 7.0, 10.0, 11.0]
    shares = [GroupShare(i, 4, 4).rows(3) for i in range(4)]
    assert sorted(torch.cat(shares).tolist()) == list(range(12))  # the shares cover every row once


def test_shared_noise_is_the_whole_draw_sliced():
    share = GroupShare(index=2, ranks=4, group_size=8)
    got = share.randn((6, 3), torch.Generator().manual_seed(0), "cpu")  # 3 prompts x 2 rows
    whole = torch.randn((24, 3), generator=torch.Generator().manual_seed(0))
    assert torch.equal(got, whole[share.rows(3)])


@pytest.mark.parametrize(
    ("index", "ranks", "group_size", "message"),
    [(0, 3, 4, "multiple of grpo.group_ranks"), (2, 2, 4, "0 <= index < ranks"), (0, 0, 4, "0 <= index < ranks")],
)
def test_a_share_that_cannot_split_its_groups_is_refused(index, ranks, group_size, message):
    with pytest.raises(ValueError, match=message):
        GroupShare(index, ranks, group_size)

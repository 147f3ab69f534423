"""The resumable sampler: a seeded permutation per epoch, split between ranks as DistributedSampler splits it, and a
mid-epoch resume that skips exactly the indices this rank already trained on."""

import pytest
import torch
from torch.utils.data import DistributedSampler

from app.data.sampler import ResumableShuffleSampler


def test_one_rank_gets_the_whole_permutation_of_its_epoch():
    sampler = ResumableShuffleSampler(10, seed=3)
    sampler.set_epoch(2)
    assert list(sampler) == torch.randperm(10, generator=torch.Generator().manual_seed(5)).tolist()
    assert len(sampler) == 10


@pytest.mark.parametrize("length, world", [(12, 2), (10, 4), (7, 3)])
def test_ranks_share_the_permutation_as_distributed_sampler_does(length, world):
    shares = [list(ResumableShuffleSampler(length, seed=1, num_replicas=world, rank=r)) for r in range(world)]
    order = torch.randperm(length, generator=torch.Generator().manual_seed(1)).tolist()
    padded = order + order[: -length % world]
    assert shares == [padded[r::world] for r in range(world)]
    assert sorted(set(sum(shares, []))) == list(range(length)), "every index is drawn by some rank"
    assert {len(s) for s in shares} == {-(-length // world)}, "every rank draws the same number of indices"
    assert isinstance(ResumableShuffleSampler(length, 0), DistributedSampler), "Lightning must not wrap it again"


def test_resume_skips_this_ranks_first_indices_of_that_epoch_only():
    straight = ResumableShuffleSampler(12, seed=0, num_replicas=2, rank=1)
    straight.set_epoch(1)
    expected = list(straight)
    resumed = ResumableShuffleSampler(12, seed=0, num_replicas=2, rank=1)
    resumed.set_epoch(1)
    resumed.resume(epoch=1, num_indices=4)
    assert list(resumed) == expected[4:]
    assert list(resumed) == expected, "the skip applies to one pass only"


def test_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="rank must be in"):
        ResumableShuffleSampler(4, seed=0, num_replicas=2, rank=2)


def test_an_empty_set_draws_nothing_and_a_set_smaller_than_the_world_is_refused():
    empty = ResumableShuffleSampler(0, seed=0, num_replicas=2, rank=1)
    assert len(empty) == 0 and list(empty) == []
    with pytest.raises(ValueError, match="3 training samples cannot be shared by 4 processes"):
        ResumableShuffleSampler(3, seed=0, num_replicas=4, rank=0)
    with pytest.raises(ValueError, match="1 training samples cannot be shared by 2 processes"):
        ResumableShuffleSampler(1, seed=0, num_replicas=2, rank=0)
    assert [len(list(ResumableShuffleSampler(2, seed=0, num_replicas=2, rank=r))) for r in (0, 1)] == [1, 1]


def test_a_resume_saved_for_another_epoch_is_ignored():
    sampler = ResumableShuffleSampler(6, seed=2)
    sampler.set_epoch(1)
    expected = list(sampler)
    sampler.resume(epoch=0, num_indices=3)
    assert list(sampler) == expected


def test_it_holds_the_attributes_code_reads_of_a_distributed_sampler():
    """Its ``__init__`` skips DistributedSampler's (which would ask torch.distributed for the ranks), so it sets the
    attributes that code reading a DistributedSampler expects: a shuffling sampler that drops nothing."""
    sampler = ResumableShuffleSampler(10, seed=3, num_replicas=4, rank=1)
    assert sampler.dataset is None
    assert sampler.shuffle is True and sampler.drop_last is False
    assert (sampler.num_replicas, sampler.rank, sampler.seed, sampler.epoch) == (4, 1, 3, 0)
    assert (sampler.num_samples, sampler.total_size) == (3, 12)


def test_ranks_that_share_groups_draw_the_same_prompts():
    from types import SimpleNamespace

    from app.data.sampler import prompt_ranks

    sharing = SimpleNamespace(lightning_module=SimpleNamespace(ranks_per_group=2))
    assert [prompt_ranks(sharing, rank, 4) for rank in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert prompt_ranks(SimpleNamespace(lightning_module=None), 3, 4) == (3, 4)  # no module: the strategy's ranks
    assert prompt_ranks(None, 0, 1) == (0, 1)
    with pytest.raises(ValueError, match="group_ranks 2 must divide the number of processes"):
        prompt_ranks(sharing, 0, 3)

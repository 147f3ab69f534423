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
    resumed.resume(epoch=1, consumed=2 * 4, counted=4)
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
    sampler.resume(epoch=0, consumed=3, counted=3)
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


def epoch_order(length: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(length, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


@pytest.mark.parametrize("saved_world, world", [(2, 1), (2, 4), (4, 3), (1, 2)])
def test_a_resume_on_another_number_of_ranks_continues_the_epoch_at_the_global_sample_index(saved_world, world):
    """The saved ranks together drew the first ``saved_world * n`` indices of the epoch's permutation; resumed on
    ``world`` ranks, they share the rest (padded with the permutation's head as any epoch is), so no index before the
    resume point is drawn again and none after it is left out."""
    length, n, epoch = 23, 3, 1
    order = epoch_order(length, seed=5, epoch=epoch)
    consumed = saved_world * n
    shares = []
    for rank in range(world):
        sampler = ResumableShuffleSampler(length, seed=5, num_replicas=world, rank=rank)
        sampler.set_epoch(epoch)
        sampler.resume(epoch, consumed, counted=n)
        shares.append(list(sampler))
    rest = order[consumed:]
    padded = rest + order[: -len(rest) % world]
    assert shares == [padded[r::world] for r in range(world)]
    drawn = sum(shares, [])
    assert sorted(i for i in drawn if i in rest) == sorted(rest), "every index of the rest, once"
    padding = [i for i in drawn if i not in rest]
    assert padding == order[: len(padding)] and len(padding) < world, "besides: the padding, from the epoch's head"


@pytest.mark.parametrize("world, counted, expected", [(1, 3, 23 - 6 + 3), (4, 3, 3 + 5), (4, 0, 6)])
def test_a_resumed_pass_counts_the_indices_the_trainer_counted_before_it(world, counted, expected):
    """``len`` is what the trainer's loop counts for the resumed epoch (``counted`` already, then this rank's share of
    the rest), and never less than a whole epoch's share, so the loop's batch limit cuts neither that epoch nor the
    following ones (Lightning takes the limit from ``len`` once, before the resumed pass)."""
    sampler = ResumableShuffleSampler(23, seed=0, num_replicas=world, rank=world - 1)
    sampler.resume(0, 2 * 3, counted=counted)
    assert len(sampler) == max(expected, sampler.num_samples)
    assert len(list(sampler)) == -(-(23 - 6) // world)
    assert len(sampler) == sampler.num_samples, "after the resumed pass: a whole epoch's share"

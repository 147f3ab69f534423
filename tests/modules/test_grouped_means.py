"""Per-group evaluation means: exact over an epoch, and merged across processes whose shares hold different groups
(where Lightning's per-key ``sync_dist`` would pair the wrong collectives)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from app.modules.grouped_means import GroupedMeans


def test_means_are_per_key_over_every_update_and_reset_clears_them():
    means = GroupedMeans()
    means.update("val/acc/counting", torch.tensor([1.0, 0.0]))
    means.update("val/acc/counting", [1.0])
    means.update("val/acc/dots", torch.tensor([[0.25, 0.75]]))
    assert means.compute() == pytest.approx({"val/acc/counting": 2 / 3, "val/acc/dots": 0.5})
    means.reset()
    assert means.compute() == {}


def _rank(rank: int, world: int, store_path: str, results) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    means = GroupedMeans()
    if rank == 0:  # rank 0 saw task a twice and task b once; rank 1 saw only task a, and a key of its own
        means.update("a", [1.0, 0.0])
        means.update("b", [0.5])
    else:
        means.update("a", [1.0])
        means.update("only_on_1", [0.25, 0.75])
    results[rank] = means.compute()
    dist.destroy_process_group()


@pytest.mark.slow
def test_processes_with_different_groups_merge_into_the_means_over_all_values(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_rank, args=(2, str(tmp_path / "store"), results), nprocs=2, start_method="spawn")
        got = dict(results)
    expected = {"a": 2 / 3, "b": 0.5, "only_on_1": 0.5}
    assert got[0] == pytest.approx(expected) and got[1] == pytest.approx(expected)

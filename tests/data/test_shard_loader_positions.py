"""ShardLoader's resume bookkeeping, fast: the position it records after each batch, how a pass started from a saved
position picks its epoch and its start, and what it logs. No data module and no worker processes: streams read in
the main process, and several workers are played in turn, as the data loader would hand their items over."""

import logging
import random
from types import SimpleNamespace

import pytest

from app.data.shard_stream import ShardLoader, ShardStream
from app.data.shards import write_samples
from app.tasks.dots import DotsDataset


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    """A garbage shard, then two shards of four samples (indices 0-3, 4-7)."""
    out = tmp_path_factory.mktemp("positions")
    dataset = DotsDataset(num_samples=8, seed=0, image_size=8)
    samples = []
    for i in range(8):
        sample = dataset[i]
        sample.meta["index"] = i
        samples.append(sample)
    good = write_samples(samples, out, "p", max_per_shard=4)
    (out / "garbage.tar").write_bytes(random.Random(0).randbytes(1000))
    return [str(out / "garbage.tar"), *map(str, good)]


def _indices(batches) -> list[list[int]]:
    return [[s.meta["index"] for s in batch] for batch in batches]


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "app.data.shard_stream"]


def _start(epoch: int) -> dict:
    return {"epoch": epoch, "batches": 0, "workers": [], "next_worker": 0, "skipped": [0, 0]}


def test_a_pass_records_each_batchs_position_with_the_workers_progress_and_the_skips(shards):
    """Batches of 3 over the garbage shard and samples 0-7: the garbage shard is reported with the first batch; the
    last batch, partial, is the worker's final item. With no worker processes, worker 0's turn always comes next."""
    loader = ShardLoader(ShardStream(shards, batch_size=3))
    assert _indices(loader) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [loader.position(n) for n in range(4)] == [
        _start(0),
        {"epoch": 0, "batches": 1, "workers": [[0, 3, 3, False]], "next_worker": 0, "skipped": [1, 0]},
        {"epoch": 0, "batches": 2, "workers": [[0, 6, 6, False]], "next_worker": 0, "skipped": [1, 0]},
        {"epoch": 0, "batches": 3, "workers": [[0, 8, 8, True]], "next_worker": 0, "skipped": [1, 0]},
    ]
    assert loader.passes == 1
    assert _indices(loader) == [[0, 1, 2], [3, 4, 5], [6, 7]]  # the next pass, epoch 1 (no shuffling: the same)
    assert loader.position(0) == _start(1) and loader.position()["epoch"] == 1 and loader.passes == 2


def test_a_loader_forgets_positions_older_than_its_history(shards, caplog):
    """With ``HISTORY`` 2, a pass of four batches keeps the positions after batches 3 and 4 only; for an older count
    it answers with where the pass started, and a warning."""
    loader = ShardLoader(ShardStream(shards[1:], batch_size=2))
    loader.HISTORY = 2
    assert len(list(loader)) == 4
    with caplog.at_level(logging.WARNING, logger="app.data.shard_stream"):
        assert [loader.position(n)["batches"] for n in (3, 4)] == [3, 4]
        assert _messages(caplog) == []
        assert [loader.position(n) for n in (0, 1, 2)] == [_start(0)] * 3
    assert _messages(caplog) == [
        f"shard loader: no position after {n} batches of epoch 0 (it yielded 4, keeps the last 2); a resumed run "
        "will replay this epoch from batch 0"
        for n in (0, 1, 2)
    ]


def test_without_an_epoch_fn_a_resumed_pass_continues_the_saved_epoch_and_counts_passes_on(shards, caplog):
    """A position saved one batch into the second pass (epoch 1) resumes there in a new loader, which then counts
    that pass as its epoch 1 and the next as epoch 2."""
    first = ShardLoader(ShardStream(shards[1:], batch_size=3))
    list(first)
    next(iter(first))
    saved = first.position()
    assert saved == {"epoch": 1, "batches": 1, "workers": [[0, 3, 3, False]], "next_worker": 0, "skipped": [0, 0]}
    loader = ShardLoader(ShardStream(shards[1:], batch_size=3))
    loader.resume(saved)
    with caplog.at_level(logging.INFO, logger="app.data.shard_stream"):
        assert _indices(loader) == [[3, 4, 5], [6, 7]]
    assert _messages(caplog) == ["shard loader: resuming epoch 1 after batch 1"]
    assert loader.passes == 2 and loader.stream.epoch == 1
    assert loader.position(1) == saved
    assert loader.position() == {
        "epoch": 1,
        "batches": 3,
        "workers": [[0, 8, 8, True]],
        "next_worker": 0,
        "skipped": [0, 0],
    }
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="app.data.shard_stream"):
        assert _indices(loader) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert _messages(caplog) == [] and loader.position(0) == _start(2)


def test_a_resumed_pass_at_the_start_of_its_epoch_logs_nothing(shards, caplog):
    loader = ShardLoader(ShardStream(shards[1:], batch_size=3), epoch_fn=lambda: 2)
    loader.resume(_start(2))
    with caplog.at_level(logging.INFO, logger="app.data.shard_stream"):
        assert _indices(loader) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert _messages(caplog) == [] and loader.passes == 1


def test_a_position_from_another_epoch_is_dropped_and_the_epoch_starts_afresh(shards, caplog):
    """A trainer's epoch 3 given a position from epoch 1: the pass logs why and yields all of epoch 3."""
    loader = ShardLoader(ShardStream(shards, batch_size=3), epoch_fn=lambda: 3)
    loader.resume({"epoch": 1, "batches": 1, "workers": [[0, 3, 3, False]], "next_worker": 0, "skipped": [1, 0]})
    with caplog.at_level(logging.INFO, logger="app.data.shard_stream"):
        assert _indices(loader) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert _messages(caplog)[0] == "shard loader: the saved position is in epoch 1; epoch 3 starts afresh"
    assert loader.stream.epoch == 3 and loader.passes == 1
    assert loader.position(0) == _start(3)
    assert loader.position(1) == {
        "epoch": 3,
        "batches": 1,
        "workers": [[0, 3, 3, False]],
        "next_worker": 0,
        "skipped": [1, 0],
    }
    assert loader.skipped == loader.skipped_this_pass  # the garbage shard, counted once: by this pass


def _round_robin(stream: ShardStream, num_workers: int, monkeypatch):
    """The items of ``num_workers`` loader workers over ``stream``, in the data loader's order: from loader worker 0
    on, one item of each worker in turn, leaving out a worker once it has ended. All in this process."""
    info = SimpleNamespace(id=0, num_workers=num_workers)
    monkeypatch.setattr("app.data.shard_stream.get_worker_info", lambda: info)
    workers = []
    for loader_worker in range(num_workers):
        workers.append((loader_worker, iter(stream)))
    while workers:
        for loader_worker, items in list(workers):
            info.id = loader_worker  # a generator reads its worker index on its first step
            try:
                yield next(items)
            except StopIteration:
                workers.remove((loader_worker, items))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # its workers never start: the items are played
def test_with_three_workers_a_resumed_pass_starts_with_the_worker_whose_turn_was_next(shards, monkeypatch):
    """Three workers over the garbage shard and samples 0-3 and 4-7, in batches of 2: each worker reads one shard.
    Interrupted after batch 3 (worker 1's last), the pass resumes with worker 2, whose last batch is all that is
    left."""
    full = ShardLoader(ShardStream(shards, batch_size=2), num_workers=3)
    full.loader = _round_robin(full.stream, 3, monkeypatch)
    assert _indices(full) == [[0, 1], [4, 5], [2, 3], [6, 7]]
    assert [full.position(n)["next_worker"] for n in range(5)] == [0, 2, 0, 2, 0]
    saved = full.position(3)
    assert saved == {
        "epoch": 0,
        "batches": 3,
        "workers": [[0, 0, 0, True], [1, 4, 4, False], [2, 2, 2, False]],
        "next_worker": 2,
        "skipped": [1, 0],
    }
    loader = ShardLoader(ShardStream(shards, batch_size=2), num_workers=3)
    loader.resume(saved)
    loader.loader = _round_robin(loader.stream, 3, monkeypatch)
    assert _indices(loader) == [[6, 7]]
    assert loader.stream.worker_offset == 2
    assert loader.position() == {
        "epoch": 0,
        "batches": 4,
        "workers": [[0, 0, 0, True], [1, 4, 4, False], [2, 4, 4, False]],
        "next_worker": 0,
        "skipped": [1, 0],
    }

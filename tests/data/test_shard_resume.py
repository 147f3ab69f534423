"""ShardDataModule resumes training mid-epoch: the batches after a restored state are those an uninterrupted run
yields next, in order (workers included), and the skip counts go on from the checkpoint without counting twice."""

import dataclasses
import glob
import itertools
import json
import logging
import random
import tarfile
from types import SimpleNamespace

import pytest
import torch
import webdataset as wds
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from app.data import ShardDataModule
from app.data.shard_stream import ShardLoader, ShardStream, SkipCounts, StreamBatch
from app.data.shards import encode_sample, write_samples
from app.tasks.dots import DotsDataset
from app.types import VisualSample


def _samples(n: int, start: int = 0) -> list[VisualSample]:
    dataset = DotsDataset(num_samples=start + n, seed=0, image_size=16)
    out = []
    for i in range(start, start + n):
        sample = dataset[i]
        sample.meta["index"] = i
        out.append(sample)
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    """Five shards of four samples (indices 0-19)."""
    out = tmp_path_factory.mktemp("resume")
    write_samples(_samples(20), out, "r", max_per_shard=4)
    return f"{out}/r-*.tar"


@pytest.fixture(scope="module")
def bad_shards(tmp_path_factory) -> str:
    """Three good shards, one that is no tar, and one with an undecodable sample and a cut-off end."""
    out = tmp_path_factory.mktemp("resume-bad")
    write_samples(_samples(12), out, "a", max_per_shard=4)
    (out / "b-garbage.tar").write_bytes(random.Random(0).randbytes(3000))
    with wds.TarWriter(str(out / "c-bad.tar")) as sink:
        for i, sample in enumerate(_samples(4, start=12)):
            record = encode_sample(sample, f"c-{i}")
            if i == 1:
                record["json"] = b"{not json"
            sink.write(record)
    data = (out / "c-bad.tar").read_bytes()
    (out / "c-bad.tar").write_bytes(data[: data.rindex(b"c-3.json")])  # cut inside the last sample's members
    return f"{out}/*.tar"


class Tag:
    """An augmentation that tags each sample with a draw of its rng (seeded from seed, epoch and key)."""

    def __call__(self, sample: VisualSample, rng: random.Random) -> VisualSample:
        return dataclasses.replace(sample, meta={**sample.meta, "draw": rng.random()})


def _module(urls: str, **kwargs) -> ShardDataModule:
    dm = ShardDataModule(train_urls=urls, **{"batch_size": 3, "shuffle_buffer": 6, "seed": 7, **kwargs})
    dm.setup("fit")
    return dm


def _ids(batch) -> list:
    return [(s.meta["index"], s.meta.get("draw")) for s in batch]


def _interrupted(urls: str, batches: int, **kwargs) -> tuple[dict, list]:
    """Consume ``batches`` batches, then return the JSON round trip of the state and the batches consumed."""
    dm = _module(urls, **kwargs)
    stream = iter(dm.train_dataloader())
    consumed = [_ids(next(stream)) for _ in range(batches)]
    state = json.loads(json.dumps(dm.state_dict()))
    del stream  # the interrupted run ends here
    return state, consumed


def _resumed(urls: str, state: dict, **kwargs) -> tuple[list, ShardDataModule]:
    dm = _module(urls, **kwargs)
    dm.load_state_dict(state)
    return [_ids(b) for b in dm.train_dataloader()], dm


SETTINGS = {
    "finite": {"augment": Tag()},
    "capped": {"epoch_size": 14},
    "resampled": {"resampled": True, "epoch_size": 10},
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_resumed_epoch_yields_what_the_uninterrupted_epoch_yields_next(shards, setting, num_workers):
    kwargs = {**SETTINGS[setting], "num_workers": num_workers}
    full = [_ids(b) for b in _module(shards, **kwargs).train_dataloader()]
    assert len(full) >= 4
    for k in (1, 3) if num_workers else range(len(full) + 1):
        state, consumed = _interrupted(shards, k, **kwargs)
        assert consumed == full[:k]
        assert state["train"]["positions"][0]["batches"] == k
        rest, _ = _resumed(shards, state, **kwargs)
        assert rest == full[k:], (setting, num_workers, k)


def test_without_a_trainer_a_later_pass_resumes_in_its_own_epoch(shards):
    dm = _module(shards, augment=Tag())
    loader = dm.train_dataloader()
    epoch0 = [_ids(b) for b in loader]
    epoch1 = [_ids(b) for b in loader]
    assert epoch0 != epoch1  # shard order, buffer and augmentation all change with the epoch

    dm = _module(shards, augment=Tag())
    loader = dm.train_dataloader()
    assert [_ids(b) for b in loader] == epoch0
    stream = iter(loader)
    assert [_ids(next(stream)), _ids(next(stream))] == epoch1[:2]
    state = json.loads(json.dumps(dm.state_dict()))
    assert state["train"]["positions"][0]["epoch"] == 1
    resumed = _module(shards, augment=Tag())
    resumed.load_state_dict(state)
    loader = resumed.train_dataloader()
    assert [_ids(b) for b in loader] == epoch1[2:]  # the pass counts on from the saved epoch
    assert [_ids(b) for b in loader] == [_ids(b) for b in _epoch(shards, 2, augment=Tag())]


def _epoch(urls: str, epoch: int, **kwargs) -> list:
    loader = _module(urls, **kwargs).train_dataloader()
    for _ in range(epoch):
        list(loader)
    return list(loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_counts_go_on_from_the_checkpoint_without_counting_the_replay_twice(bad_shards, num_workers, caplog):
    kwargs = {"num_workers": num_workers, "batch_size": 2}
    whole = _module(bad_shards, **kwargs)
    full = [_ids(b) for b in whole.train_dataloader()]
    assert whole.skipped == SkipCounts(shards=2, samples=2)  # the garbage shard, the cut one; c-1 and the cut c-3
    assert sorted(i for b in full for i, _ in b) == [*range(12), 12, 14]
    for k in range(1, len(full)):
        state, _ = _interrupted(bad_shards, k, **kwargs)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            rest, dm = _resumed(bad_shards, state, **kwargs)
        assert rest == full[k:]
        assert dm.skipped == whole.skipped and dm.skipped_by_split["train"] == whole.skipped, k
        if num_workers == 0:  # the replayed part is not logged again (workers log in their own processes)
            logged = caplog.text.count("damaged shard") + caplog.text.count("skipping")
            assert logged == len([r for r in caplog.records if r.name == "app.data.shard_stream"])


def test_a_changed_stream_restarts_the_epoch_with_a_warning(shards, caplog):
    full = [_ids(b) for b in _module(shards).train_dataloader()]
    state, _ = _interrupted(shards, 2)
    with caplog.at_level(logging.WARNING, logger="app.data.shard_datamodule"):
        rest, _ = _resumed(shards, state, seed=8)
    assert "not resuming mid-epoch: seed changed since the checkpoint" in caplog.text
    assert rest == [_ids(b) for b in _module(shards, seed=8).train_dataloader()]
    rest, _ = _resumed(shards, {})  # a checkpoint from before positions were saved: the epoch restarts
    assert rest == full


def test_a_state_this_class_did_not_save_is_a_clear_error(shards):
    dm = _module(shards)
    with pytest.raises(ValueError, match=r"^ShardDataModule.load_state_dict: not a state this class saved \(KeyError"):
        dm.load_state_dict({"positions": [0]})
    state, _ = _interrupted(shards, 1)
    with pytest.raises(ValueError, match="'train' must hold a 'config' dict and a 'positions' list"):
        dm.load_state_dict({**state, "train": {"config": {}, "positions": 3}})


def test_state_is_the_skip_counts_and_each_ranks_position(shards, monkeypatch):
    """Two fake ranks: the state gathers both positions, and each rank resumes its own stream."""
    fulls, streams, dms = [], [], []
    for rank in range(2):
        trainer = SimpleNamespace(global_rank=rank, world_size=2, current_epoch=0, loggers=[])
        dm = _module(shards, resampled=True, epoch_size=12)
        dm.trainer = trainer
        fulls.append([_ids(b) for b in dm.train_dataloader()])
        dm = _module(shards, resampled=True, epoch_size=12)
        dm.trainer = trainer
        streams.append(iter(dm.train_dataloader()))
        dms.append(dm)
    assert fulls[0] != fulls[1]
    for rank in range(2):
        for _ in range(rank + 1):
            next(streams[rank])
    positions = [dm._train_loader.position() for dm in dms]
    gathered = []

    def all_gather_object(out: list, obj: dict) -> None:
        gathered.append(obj)
        out[:] = positions

    with monkeypatch.context() as patch:  # a process group only while the state is taken (loaders would ask it too)
        patch.setattr(torch.distributed, "is_initialized", lambda: True)
        patch.setattr(torch.distributed, "all_gather_object", all_gather_object)
        state = json.loads(json.dumps(dms[1].state_dict()))
    assert gathered == [positions[1]]
    assert state["skipped"] == [0, 0] and state["skipped_by_split"]["train"] == [0, 0]
    assert state["train"]["config"]["world_size"] == 2 and len(state["train"]["positions"]) == 2
    for rank in range(2):
        dm = _module(shards, resampled=True, epoch_size=12)
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2, current_epoch=0, loggers=[])
        dm.load_state_dict(state)
        assert [_ids(b) for b in dm.train_dataloader()] == fulls[rank][rank + 1 :]


def _on_rank(urls: str, rank: int, world: int, **kwargs) -> ShardDataModule:
    dm = _module(urls, **kwargs)
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world, current_epoch=0, loggers=[])
    return dm


def _gathered_state(dms: list[ShardDataModule], monkeypatch) -> dict:
    """The state rank 0 saves for ``dms`` (one per fake rank), every rank's position gathered."""
    positions = [dm._train_loader.position() for dm in dms]
    with monkeypatch.context() as patch:
        patch.setattr(torch.distributed, "is_initialized", lambda: True)
        patch.setattr(torch.distributed, "all_gather_object", lambda out, obj: out.__setitem__(slice(None), positions))
        return json.loads(json.dumps(dms[0].state_dict()))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("world", [1, 4])
def test_a_resampled_stream_saved_on_two_ranks_resumes_on_another_number_of_ranks(
    shards, monkeypatch, world, num_workers
):
    """A resampled stream is a function of (seed, epoch, rank, worker), not of the number of ranks: resumed on
    ``world`` ranks, the ranks that existed continue their own streams where they stood, a new rank draws its own
    stream from its start, and every rank yields as many batches as the saved ranks had left."""
    kwargs = {"resampled": True, "epoch_size": 12, "num_workers": num_workers}  # 4 batches of 3 per rank and epoch
    fulls = [[_ids(b) for b in _on_rank(shards, rank, max(world, 2), **kwargs).train_dataloader()] for rank in range(4)]
    assert len({json.dumps(full) for full in fulls}) == 4 and {len(full) for full in fulls} == {4}
    saved = [_on_rank(shards, rank, 2, **kwargs) for rank in range(2)]
    streams = [iter(dm.train_dataloader()) for dm in saved]
    for stream in streams:  # both ranks trained 2 batches
        next(stream), next(stream)
    state = _gathered_state(saved, monkeypatch)
    del streams
    for rank in range(world):
        dm = _on_rank(shards, rank, world, **kwargs)
        dm.load_state_dict(state)
        expected = fulls[rank][2:] if rank < 2 else fulls[rank][:2]
        assert [_ids(b) for b in dm.train_dataloader()] == expected, f"rank {rank}"


def test_a_finite_stream_saved_on_two_ranks_restarts_its_epoch_on_another_number(shards, monkeypatch, caplog):
    """A finite stream splits the shards by rank: on another number of ranks each rank's share of the epoch changes,
    so there is no position to continue from; the epoch restarts, with a warning naming why."""
    saved = [_on_rank(shards, rank, 2) for rank in range(2)]
    streams = [iter(dm.train_dataloader()) for dm in saved]
    for stream in streams:
        next(stream)
    state = _gathered_state(saved, monkeypatch)
    dm = _on_rank(shards, 0, 1)
    with caplog.at_level(logging.WARNING, logger="app.data.shard_datamodule"):
        dm.load_state_dict(state)
        rest = [_ids(b) for b in dm.train_dataloader()]
    assert "not resuming mid-epoch: replicas, world_size changed since the checkpoint" in caplog.text
    assert rest == [_ids(b) for b in _module(shards).train_dataloader()]


class _Seen(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(_ids(batch))
        return (self.weight - 1.0).pow(2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, checkpoint_every: int | None = None, **kwargs) -> Trainer:
    callbacks = (
        []
        if checkpoint_every is None
        else [ModelCheckpoint(tmp_path, "{step}", every_n_train_steps=checkpoint_every, save_top_k=-1)]
    )
    return Trainer(
        default_root_dir=tmp_path,
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


@pytest.mark.parametrize("setting", ["finite", "resampled"])
def test_fit_resumed_from_a_mid_epoch_checkpoint_trains_on_what_the_uninterrupted_fit_did(shards, tmp_path, setting):
    """Checkpoints written during training (at a batch's end, while Lightning has already fetched the next batch of a
    finite stream): a fit resumed from one trains on exactly the batches the uninterrupted fit trained on after it."""
    kwargs = {**SETTINGS[setting], "batch_size": 2}
    whole = _Seen()
    _trainer(tmp_path, checkpoint_every=3, max_epochs=2).fit(whole, datamodule=_module(shards, **kwargs))
    steps = len(whole.seen)
    assert steps == (20 if setting == "finite" else 10)  # two epochs of 10 or 5 batches
    for step in (3, 6, 12) if setting == "finite" else (3, 6, 9):  # mid-epoch: epoch 0, and epoch 1
        resumed = _Seen()
        trainer = _trainer(tmp_path / f"from-{step}", max_epochs=2)
        trainer.fit(resumed, datamodule=_module(shards, **kwargs), ckpt_path=tmp_path / f"step={step}.ckpt")
        assert resumed.seen == whole.seen[step:], step


# ------------------------------------------------------------------- ShardStream's own accounting (no loader, worker 0)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> list[str]:
    """Eight raw records, in this order: a garbage shard, samples 0-3, another garbage shard, samples 4-7 (5 does not
    decode). Record ``n`` (from 1) is sample ``n - 1``; the garbage shards are met while reading records 1 and 5."""
    out = tmp_path_factory.mktemp("mixed")
    (good,) = write_samples(_samples(4), out, "a", max_per_shard=4)
    with wds.TarWriter(str(out / "c.tar")) as sink:
        for i, sample in enumerate(_samples(4, start=4), start=4):
            record = encode_sample(sample, f"c-{i}")
            if i == 5:
                record["json"] = b"{not json"
            sink.write(record)
    for name in ("g0.tar", "g1.tar"):
        (out / name).write_bytes(random.Random(name).randbytes(3000))
    return [str(out / "g0.tar"), str(good), str(out / "g1.tar"), str(out / "c.tar")]


def _drain(
    urls: list[str], caplog, resume: tuple | None = None, worker_offset: int = 0, epoch_size: int | None = None
) -> tuple[list, list[str]]:
    """The stream's items as ``(worker, records, items, final, skipped, indices)`` and the warnings it logged."""
    stream = ShardStream(urls, batch_size=2, epoch_size=epoch_size)
    stream.worker_offset = worker_offset
    if resume is not None:
        stream.resume_from = {0: resume}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.data.shard_stream"):
        items = [
            (i.worker, i.records, i.items, i.final, i.skipped, [s.meta["index"] for s in i.samples]) for i in stream
        ]
    return items, [r.getMessage() for r in caplog.records if r.name == "app.data.shard_stream"]


def _label(message: str, urls: list[str]) -> str:
    """``g0`` / ``g1`` for a garbage shard's warning, ``c-5`` for the undecodable sample's, else the message."""
    for name, url in zip(("g0", "g1"), (urls[0], urls[2]), strict=True):
        if message.startswith(f"skipping the rest of shard {url}: ReadError: not a tar archive"):
            return name
    return "c-5" if message.startswith("skipping sample c-5 of ") else message


def test_items_say_how_many_raw_records_and_items_the_worker_had_drawn(mixed, caplog):
    items, messages = _drain(mixed, caplog)
    assert items == [
        (0, 2, 2, False, SkipCounts(shards=1), [0, 1]),  # g0 was met before record 1
        (0, 4, 4, False, SkipCounts(), [2, 3]),
        (0, 7, 6, False, SkipCounts(shards=1, samples=1), [4, 6]),  # g1, and record 6 (sample 5) did not decode
        (0, 8, 7, True, SkipCounts(), [7]),
    ]
    assert [_label(m, mixed) for m in messages] == ["g0", "g1", "c-5"]


def test_a_worker_ending_on_a_full_batch_yields_a_final_item_only_to_report_late_skips(mixed, caplog):
    """The final item is a partial batch or the counts of skips met after the last batch; never an empty extra item."""
    good = mixed[1]  # samples 0-3: two full batches of 2
    items, _ = _drain([good], caplog)
    assert items == [(0, 2, 2, False, SkipCounts(), [0, 1]), (0, 4, 4, False, SkipCounts(), [2, 3])]
    items, messages = _drain([good, mixed[0]], caplog)  # then a garbage shard
    assert items[-1] == (0, 4, 4, True, SkipCounts(shards=1), []) and len(items) == 3
    assert [_label(m, mixed) for m in messages] == ["g0"]


@pytest.mark.parametrize("records", range(10))
def test_a_resumed_stream_logs_and_counts_only_what_follows_its_resume_point(mixed, caplog, records):
    """Resumed after ``records`` raw records, a worker drops them undecoded, does not log or report again the skips met
    while reading them, and logs and reports those after; a resume point past the end is a warning, not an error."""
    decoded_before = len([n for n in range(1, records + 1) if n <= 8 and n != 6])
    items, messages = _drain(mixed, caplog, resume=(records, decoded_before, False))
    assert [i for item in items for i in item[5]] == [n - 1 for n in range(records + 1, 9) if n != 6]
    skipped = sum((item[4] for item in items), SkipCounts())
    labels = [_label(m, mixed) for m in messages]
    if records == 0:
        assert (labels, skipped) == (["g0", "g1", "c-5"], SkipCounts(shards=2, samples=1))
    elif records <= 4:  # g0 was met before record 1: logged and counted by the interrupted run
        assert (labels, skipped) == (["g1", "c-5"], SkipCounts(shards=1, samples=1))
    elif records == 5:  # and g1 before record 5
        assert (labels, skipped) == (["c-5"], SkipCounts(samples=1))
    elif records <= 8:  # and record 6 was dropped undecoded; resuming at the last record is no error
        assert (labels, skipped) == ([], SkipCounts())
    else:
        assert labels == [
            "worker 0: cannot resume at record 9: this epoch's stream ends at record 8 (the shards changed?)"
        ]
    if records < 8:
        assert items[-1][1:3] == (8, 7)
    elif records == 8:
        assert items == []


def test_an_epoch_capped_worker_stops_at_its_share_and_resumed_at_its_end_yields_nothing(mixed, caplog):
    """``epoch_size`` 4 over samples 0-7: the worker yields its share, samples 0-3, in two full batches (no final item:
    no skip was met); resumed where the last one left it, it has nothing left to yield in this epoch."""
    urls = [mixed[1], mixed[3]]  # samples 0-3, then 4-7
    items, _ = _drain(urls, caplog, epoch_size=4)
    assert items == [(0, 2, 2, False, SkipCounts(), [0, 1]), (0, 4, 4, False, SkipCounts(), [2, 3])]
    assert _drain(urls, caplog, resume=(2, 2, False), epoch_size=4)[0] == items[1:]
    assert _drain(urls, caplog, resume=(4, 4, False), epoch_size=4)[0] == []


def test_a_stream_with_no_records_ends_without_a_resume_warning(mixed, caplog):
    items, messages = _drain(mixed[:1], caplog)
    assert items == [(0, 0, 0, True, SkipCounts(shards=1), [])]
    assert [_label(m, mixed) for m in messages] == ["g0"]


@pytest.mark.parametrize("loader_worker, offset, worker", [(0, 0, 0), (0, 2, 2), (2, 2, 1), (1, 2, 0), (1, 1, 2)])
def test_loader_worker_i_plays_worker_i_plus_offset(shards, caplog, monkeypatch, loader_worker, offset, worker):
    """Three workers over five shards of four samples: worker ``w`` reads shards ``w`` and ``w + 3``."""
    info = SimpleNamespace(id=loader_worker, num_workers=3)
    monkeypatch.setattr("app.data.shard_stream.get_worker_info", lambda: info)
    urls = sorted(glob.glob(shards))
    items, _ = _drain(urls, caplog, worker_offset=offset)
    assert {item[0] for item in items} == {worker}
    assert [i for item in items for i in item[5]] == [
        i for s in (worker, worker + 3) if s < 5 for i in range(4 * s, 4 * s + 4)
    ]


def test_a_damaged_shard_that_then_fails_counts_once(tmp_path, caplog):
    """A corrupt header (sample 1 loses its JSON), then a duplicate member that ends the shard: one shard skipped."""
    path = tmp_path / "damaged-then-failed.tar"
    with wds.TarWriter(str(path)) as sink:
        for i, sample in enumerate([*_samples(4), _samples(1, start=3)[0]]):
            sink.write(encode_sample(sample, f"d-{min(i, 3)}"))  # the fifth record repeats key d-3
    with tarfile.open(path) as tar:
        offset = tar.getmember("d-1.json").offset_data - tarfile.BLOCKSIZE
    data = bytearray(path.read_bytes())
    data[offset + 148 : offset + 150] = b"99"  # the member header's checksum
    path.write_bytes(bytes(data))
    items, messages = _drain([str(path)], caplog)
    assert [i for item in items for i in item[5]] == [0, 2, 3]
    assert sum((item[4] for item in items), SkipCounts()) == SkipCounts(shards=1, samples=1)
    assert [m.split(" ", 2)[:2] for m in messages] == [
        ["damaged", "shard"],
        ["skipping", "sample"],
        ["skipping", "the"],
    ]
    assert messages[-1].startswith(f"skipping the rest of shard {path}: ValueError: duplicate member 'd-3.")
    assert messages[-1].endswith("(worker 0: 1 shards, 1 samples skipped this epoch)")


def test_a_resampled_worker_yields_its_share_of_the_epoch_and_stops(shards):
    """``epoch_size`` 5 in batches of 2 from endlessly resampled shards: two full batches, a final one of 1, no more
    (read through a bound, so that a stream that never ended would fail here instead of hanging)."""
    stream = ShardStream(sorted(glob.glob(shards)), batch_size=2, seed=3, resampled=True, epoch_size=5)
    items = list(itertools.islice(stream, 10))
    assert [(len(i.samples), i.items, i.final) for i in items] == [(2, 2, False), (2, 4, False), (1, 5, True)]


# ------------------------------------------------------------------------ ShardLoader's positions (no data module)


def _batch_indices(batches) -> list[list[int]]:
    return [[s.meta["index"] for s in batch] for batch in batches]


def test_before_any_pass_the_position_is_the_start_of_the_next_pass(shards):
    urls = sorted(glob.glob(shards))
    start = {"epoch": 0, "batches": 0, "workers": [], "next_worker": 0, "skipped": [0, 0]}
    assert ShardLoader(ShardStream(urls, batch_size=2)).position() == start  # no epoch_fn: passes count from 0
    assert ShardLoader(ShardStream(urls, batch_size=2), epoch_fn=lambda: None).position() == start
    assert ShardLoader(ShardStream(urls, batch_size=2), epoch_fn=lambda: 3).position() == {**start, "epoch": 3}
    loader = ShardLoader(ShardStream(urls, batch_size=2), epoch_fn=lambda: 3)
    pending = {**start, "epoch": 3, "batches": 2, "workers": [[0, 4, 4, False]]}
    loader.resume(pending)
    assert loader.position() == pending  # a resume pending: where the next pass starts


def test_a_batch_count_with_no_position_gives_where_the_pass_started_with_a_warning(shards, caplog):
    """A pass of epoch 2 resumed after batch 1 yields batches 2 and 3; it has no position after batch 7 (nor after
    batch 0, which came before its start): it answers with its start, so that a resumed run repeats but loses
    nothing."""
    urls = sorted(glob.glob(shards))
    first = ShardLoader(ShardStream(urls, batch_size=2), epoch_fn=lambda: 2)
    next(iter(first))
    start = first.position()
    assert start == {"epoch": 2, "batches": 1, "workers": [[0, 2, 2, False]], "next_worker": 0, "skipped": [0, 0]}
    loader = ShardLoader(ShardStream(urls, batch_size=2), epoch_fn=lambda: 2)
    loader.resume(start)
    batches = iter(loader)
    with caplog.at_level(logging.INFO, logger="app.data.shard_stream"):
        assert _batch_indices([next(batches), next(batches)]) == [[2, 3], [4, 5]]
    assert [r.getMessage() for r in caplog.records] == ["shard loader: resuming epoch 2 after batch 1"]
    assert loader.position(3)["batches"] == loader.position()["batches"] == 3
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.data.shard_stream"):
        assert loader.position(7) == start
        assert loader.position(0) == start
    assert [r.getMessage() for r in caplog.records] == [
        f"shard loader: no position after {n} batches of epoch 2 (it yielded 3, keeps the last 32); a resumed run "
        "will replay this epoch from batch 1"
        for n in (7, 0)
    ]


def test_a_position_from_another_epoch_starts_that_epoch_afresh_with_a_message(shards, caplog):
    urls = sorted(glob.glob(shards))
    epoch1 = _batch_indices(ShardLoader(ShardStream(urls, batch_size=2, shuffle=True), epoch_fn=lambda: 1))
    first = ShardLoader(ShardStream(urls, batch_size=2, shuffle=True), epoch_fn=lambda: 0)
    next(iter(first))
    loader = ShardLoader(ShardStream(urls, batch_size=2, shuffle=True), epoch_fn=lambda: 1)
    loader.resume(first.position())
    with caplog.at_level(logging.INFO, logger="app.data.shard_stream"):
        assert _batch_indices(loader) == epoch1
    assert "shard loader: the saved position is in epoch 0; epoch 1 starts afresh" in [
        r.getMessage() for r in caplog.records
    ]


def test_skipped_since_counts_the_skips_of_this_pass_after_one_of_its_positions(mixed):
    """Over ``mixed`` in batches of 2, the pass reports a garbage shard with batch 1, then another and an undecodable
    sample with batch 3. Only a position of the pass running now, in its epoch, has skips after it."""
    loader = ShardLoader(ShardStream(mixed, batch_size=2))
    checkpoint = {"epoch": 0, "batches": 3, "workers": [[0, 7, 6, False]], "next_worker": 0, "skipped": [2, 1]}
    assert loader.skipped_since(checkpoint) == SkipCounts()  # no pass started: nothing reported since
    assert _batch_indices(loader) == [[0, 1], [2, 3], [4, 6], [7]]
    after = [loader.position(n) for n in range(5)]
    assert [p["skipped"] for p in after] == [[0, 0], [1, 0], [1, 0], [2, 1], [2, 1]]
    assert [loader.skipped_since(p) for p in after] == [
        SkipCounts(2, 1),
        SkipCounts(1, 1),
        SkipCounts(1, 1),
        SkipCounts(),
        SkipCounts(),
    ]
    assert loader.skipped_since({**after[1], "epoch": 1}) == SkipCounts()  # a position of another epoch
    loader.resume(after[1])
    assert loader.skipped_since(after[1]) == SkipCounts()  # a resume pending: the next pass reports from there


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # no worker starts: the items are given
def test_a_position_holds_each_workers_progress_whose_turn_is_next_and_the_skips_so_far(shards):
    """Three workers' items, as the data loader hands them over in turn: a batch from each, then worker 1's final
    counts-only item. Each batch's position keeps where every worker stood then; the counts-only item adds none."""
    sample = VisualSample(images=[], question="q", task="toy")
    skips = []
    loader = ShardLoader(ShardStream(sorted(glob.glob(shards)), batch_size=2), num_workers=3, on_skip=skips.append)
    loader.loader = [
        StreamBatch([sample, sample], SkipCounts(), worker=0, records=2, items=2),
        StreamBatch([sample, sample], SkipCounts(shards=1), worker=1, records=3, items=2),
        StreamBatch([sample], SkipCounts(), worker=2, records=1, items=1, final=True),
        StreamBatch([], SkipCounts(samples=1), worker=1, records=4, items=2, final=True),
    ]
    assert [len(batch) for batch in loader] == [2, 2, 1]
    progress = [[0, 2, 2, False], [1, 3, 2, False], [2, 1, 1, True]]
    assert [loader.position(n) for n in (1, 2, 3)] == [
        {"epoch": 0, "batches": 1, "workers": progress[:1], "next_worker": 1, "skipped": [0, 0]},
        {"epoch": 0, "batches": 2, "workers": progress[:2], "next_worker": 2, "skipped": [1, 0]},
        {"epoch": 0, "batches": 3, "workers": progress, "next_worker": 0, "skipped": [1, 0]},
    ]
    assert loader.position() == loader.position(3)
    assert skips == [SkipCounts(shards=1), SkipCounts(samples=1)]
    assert loader.skipped == loader.skipped_this_pass == SkipCounts(shards=1, samples=1)


def test_a_loader_keeps_the_positions_of_its_last_history_batches_only(shards, caplog):
    """With ``HISTORY`` 3, a pass of 10 batches answers for batches 8-10; older counts (0 included: its position left
    the history too) give the start with a warning. Before any pass, nothing is skipped."""
    loader = ShardLoader(ShardStream(sorted(glob.glob(shards)), batch_size=2))
    assert loader.skipped_this_pass == loader.skipped == SkipCounts()
    loader.HISTORY = 3
    assert len(list(loader)) == 10
    assert [loader.position(n)["batches"] for n in (8, 9, 10)] == [8, 9, 10]
    with caplog.at_level(logging.WARNING, logger="app.data.shard_stream"):
        assert [loader.position(n)["batches"] for n in (1, 6, 7)] == [0, 0, 0]
    assert len(caplog.records) == 3 and "keeps the last 3" in caplog.records[0].getMessage()

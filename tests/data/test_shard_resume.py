"""ShardDataModule resumes training mid-epoch: the batches after a restored state are those an uninterrupted run
yields next, in order (workers included), and the skip counts go on from the checkpoint without counting twice."""

import dataclasses
import json
import logging
import random
from types import SimpleNamespace

import pytest
import torch
import webdataset as wds
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from app.data import ShardDataModule
from app.data.shard_stream import SkipCounts
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
    callbacks = [] if checkpoint_every is None else [
        ModelCheckpoint(tmp_path, "{step}", every_n_train_steps=checkpoint_every, save_top_k=-1)
    ]  # fmt: skip
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

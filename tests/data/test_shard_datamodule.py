import dataclasses
import io
import itertools
import json
import logging
import os
import random
import re
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import webdataset as wds
import yaml
from jsonargparse import ArgumentParser
from lightning import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from PIL import Image

from app.data import ShardDataModule
from app.data.shard_stream import ShardLoader, ShardStream, SkipCounts, derive_seed, epoch_share
from app.data.shards import encode_sample, write_samples
from app.tasks.dots import DotsDataset
from app.types import VisualSample

NUM_SHARDS, PER_SHARD = 4, 4
NUM_SAMPLES = NUM_SHARDS * PER_SHARD


def _samples(n: int, start: int = 0) -> list[VisualSample]:
    dataset = DotsDataset(num_samples=start + n, seed=0, image_size=32)
    out = []
    for i in range(start, start + n):
        sample = dataset[i]
        sample.meta["index"] = i  # an identity to follow samples through the stream
        out.append(sample)
    return out


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    write_samples(_samples(NUM_SAMPLES), out, "good", max_per_shard=PER_SHARD)
    return out


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory, shard_dir):
    """Two good shards (indices 0-7) and four bad ones, one of each kind."""
    out = tmp_path_factory.mktemp("bad")
    for i in range(2):
        (out / f"a-good-{i}.tar").write_bytes((shard_dir / f"good-{i:06d}.tar").read_bytes())
    (out / "b-garbage.tar").write_bytes(random.Random(0).randbytes(6000))
    # A tar cut inside the image of its third sample: its first two samples survive.
    data = (shard_dir / "good-000002.tar").read_bytes()
    with tarfile.open(shard_dir / "good-000002.tar") as tar:
        cut = next(m for m in tar.getmembers() if m.name == "good-000000010.img0.png").offset_data + 10
    (out / "c-truncated.tar").write_bytes(data[:cut])
    # One sample with an undecodable PNG and one with bad JSON among good ones (indices 12, 14 survive).
    import webdataset as wds

    with wds.TarWriter(str(out / "d-bad-members.tar")) as sink:
        for i, sample in enumerate(_samples(4, start=12)):
            record = encode_sample(sample, f"bad-{i}")
            if i == 1:
                record["img0.png"] = b"\x89PNG\r\n\x1a\n truncated"
            if i == 3:
                record["json"] = b'{"schema": 1, "task": '
            sink.write(record)
    return out


def _indices(batches) -> list[int]:
    return [s.meta["index"] for batch in batches for s in batch]


def _module(urls, **kwargs) -> ShardDataModule:
    dm = ShardDataModule(train_urls=urls, **{"batch_size": 3, "shuffle_buffer": 8, **kwargs})
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("num_workers", [0, 2])
def test_finite_epoch_yields_every_sample_once(shard_dir, num_workers):
    dm = _module(f"{shard_dir}/good-{{000000..000003}}.tar", num_workers=num_workers)
    batches = list(dm.train_dataloader())
    assert sorted(_indices(batches)) == list(range(NUM_SAMPLES))
    assert all(isinstance(s, VisualSample) and s.images[0].size == (32, 32) for b in batches for s in b)
    assert all(1 <= len(b) <= 3 for b in batches)
    assert dm.skipped == SkipCounts()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_order_is_deterministic_for_a_seed_and_changes_with_seed_and_epoch(shard_dir, num_workers):
    def order(seed: int, epochs: int = 1) -> list[list[int]]:
        loader = _module(f"{shard_dir}/good-*.tar", seed=seed, num_workers=num_workers).train_dataloader()
        return [_indices(loader) for _ in range(epochs)]

    first, second = order(0, epochs=2)
    assert order(0) == [first]
    assert first != second and sorted(first) == sorted(second)
    assert order(1)[0] != first


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_shards_and_samples_are_skipped_and_counted(bad_dir, num_workers, caplog):
    dm = _module(f"{bad_dir}/*.tar", num_workers=num_workers, val_urls=f"{bad_dir}/d-*.tar")
    with caplog.at_level(logging.WARNING):
        got = _indices(dm.train_dataloader())
    assert sorted(got) == [*range(8), 8, 9, 12, 14]  # good shards whole, the truncated tar's first two, good members
    assert dm.skipped == SkipCounts(shards=2, samples=2)
    if num_workers == 0:  # worker processes log in their own process
        assert "garbage.tar" in caplog.text and "truncated.tar" in caplog.text
        assert "'bad-1': cannot decode image 'img0.png'" in caplog.text
        assert "'bad-3': member 'json' is not valid JSON" in caplog.text
    assert "skipped 2 bad shards and 2 bad samples so far" in caplog.text
    assert sorted(_indices(dm.val_dataloader())) == [12, 14]
    assert dm.skipped == SkipCounts(shards=2, samples=4)
    assert dm.skipped_by_split["val"] == SkipCounts(shards=0, samples=2)


def test_wrong_pattern_fails_in_setup_naming_it(tmp_path, shard_dir):
    with pytest.raises(FileNotFoundError, match=r"train_urls: shard pattern '.*nope-\*.tar' matches no files"):
        _module(f"{tmp_path}/nope-*.tar")
    dm = ShardDataModule(train_urls=f"{shard_dir}/good-*.tar", val_urls=f"{tmp_path}/val-{{0..3}}.tar")
    with pytest.raises(FileNotFoundError, match=r"val_urls: shard pattern '.*val-\{0..3\}.tar'"):
        dm.setup("fit")
    with pytest.raises(ValueError, match="train_urls"):
        ShardDataModule(train_urls="").setup("fit")
    with pytest.raises(ValueError, match="needs train_urls to fit"):
        ShardDataModule().setup("fit")
    with pytest.raises(ValueError, match="set epoch_size"):
        ShardDataModule(train_urls=f"{shard_dir}/good-*.tar", resampled=True)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resampled_epoch_has_exactly_epoch_size_samples(shard_dir, num_workers):
    dm = _module(f"{shard_dir}/good-*.tar", resampled=True, epoch_size=10, batch_size=4, num_workers=num_workers)
    loader = dm.train_dataloader()
    assert len(loader) == 3
    for _ in range(2):
        batches = list(itertools.islice(loader, 10))  # bounded: a stream that never ended would fail, not hang
        assert sorted(len(b) for b in batches) == [2, 4, 4]
        assert set(_indices(batches)) <= set(range(NUM_SAMPLES))


def test_epoch_shares_sum_to_epoch_size_with_one_partial_batch():
    for epoch_size, batch_size, workers in [(10, 4, 2), (7, 3, 3), (100, 8, 5), (3, 8, 2)]:
        shares = [epoch_share(epoch_size, batch_size, w, workers) for w in range(workers)]
        assert sum(shares) == epoch_size
        assert sum(s % batch_size != 0 for s in shares) <= 1


def test_two_ranks_see_disjoint_samples_covering_all(shard_dir, monkeypatch):
    train, val = [], []
    for rank in range(2):
        dm = _module(f"{shard_dir}/good-*.tar", val_urls=f"{shard_dir}/good-000003.tar")
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2, current_epoch=0, loggers=[])
        train.append(_indices(dm.train_dataloader()))
        val.append(_indices(dm.val_dataloader()))
    assert len(train[0]) == len(train[1]) == NUM_SAMPLES // 2
    assert sorted(train[0] + train[1]) == list(range(NUM_SAMPLES))
    # Evaluation splits by sample, so two ranks share even a single shard.
    assert val == [[12, 14], [13, 15]]
    # Without a trainer, the rank comes from torch.distributed.
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    assert sorted(_indices(_module(f"{shard_dir}/good-*.tar").train_dataloader())) == sorted(train[1])
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 8)
    with pytest.raises(ValueError, match="train_urls: 4 shards for 8 ranks"):
        _module(f"{shard_dir}/good-*.tar").train_dataloader()


class HFlipTwin:
    """A test augmentation: the sample and its mirror image, tagged with a draw from the rng."""

    def __init__(self, tag: str = "twin") -> None:
        self.tag = tag

    def __call__(self, sample: VisualSample, rng: random.Random) -> tuple[VisualSample, VisualSample]:
        draw = rng.random()
        twin = dataclasses.replace(
            sample,
            images=[sample.images[0].transpose(Image.Transpose.FLIP_LEFT_RIGHT)],
            meta={**sample.meta, "role": self.tag, "draw": draw},
        )
        return dataclasses.replace(sample, meta={**sample.meta, "draw": draw}), twin


@pytest.mark.parametrize("num_workers", [0, 2])
def test_augment_tuples_are_flattened_adjacent_and_reproducible(shard_dir, num_workers):
    def run(epochs: int = 1):
        dm = _module(f"{shard_dir}/good-*.tar", augment=HFlipTwin(), num_workers=num_workers, val_urls=f"{shard_dir}/*")
        loader = dm.train_dataloader()
        return [[s for b in loader for s in b] for _ in range(epochs)], dm

    (first, second), dm = run(epochs=2)
    assert len(first) == 2 * NUM_SAMPLES
    for x, twin in zip(first[::2], first[1::2], strict=True):
        assert twin.meta["role"] == "twin" and "role" not in x.meta
        assert twin.meta["index"] == x.meta["index"] and twin.meta["draw"] == x.meta["draw"]
        assert np.array_equal(np.asarray(twin.images[0]), np.asarray(x.images[0])[:, ::-1])
    draws = {s.meta["index"]: s.meta["draw"] for s in first}
    assert draws == {s.meta["index"]: s.meta["draw"] for s in run()[0][0]}  # seeded from (seed, epoch, key)
    assert draws != {s.meta["index"]: s.meta["draw"] for s in second}
    assert all("role" not in s.meta for b in dm.val_dataloader() for s in b)  # augment_eval=False


def test_bad_augment_output_is_a_clear_error(shard_dir):
    dm = _module(f"{shard_dir}/good-*.tar", augment=lambda sample, rng: "oops")
    with pytest.raises(TypeError, match="must return a VisualSample or a tuple of them, got 'oops'"):
        next(iter(dm.train_dataloader()))


def test_strip_labels_removes_answers_after_decoding_and_augment(shard_dir):
    def relabel(sample, rng):
        return dataclasses.replace(sample, answer="yes", meta={**sample.meta, "ground_truth": "yes"})

    dm = _module(f"{shard_dir}/good-*.tar", strip_labels=True, augment=relabel)
    samples = [s for b in dm.train_dataloader() for s in b]
    assert len(samples) == NUM_SAMPLES
    assert all(s.answer is None and s.reasoning is None and "ground_truth" not in s.meta for s in samples)


def test_a_yaml_config_with_a_class_path_augment_builds(shard_dir):
    config = yaml.safe_load(
        f"""
        data:
          class_path: app.data.ShardDataModule
          init_args:
            train_urls: {shard_dir}/good-{{000000..000003}}.tar
            batch_size: 2
            resampled: true
            epoch_size: 4
            augment:
              class_path: {__name__}.HFlipTwin
              init_args:
                tag: mirrored
        """
    )
    parser = ArgumentParser()
    parser.add_subclass_arguments(ShardDataModule, "data")
    dm = parser.instantiate(parser.parse_object(config)).data
    assert isinstance(dm, ShardDataModule) and isinstance(dm.augment, HFlipTwin) and dm.augment.tag == "mirrored"
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert [len(b) for b in batches] == [4, 4]
    assert [s.meta.get("role") for s in batches[0]] == [None, "mirrored"] * 2


def test_app_cli_parses_a_shard_data_config_with_an_augment(shard_dir, tmp_path, capsys):
    from app.command_line.commands import AppCLI

    config = yaml.safe_load((Path(__file__).parents[1] / "fixtures" / "tiny_grpo.yaml").read_text())
    data = {"train_urls": f"{shard_dir}/good-*.tar", "augment": {"class_path": f"{__name__}.HFlipTwin"}}
    config["data"] = {"class_path": "app.data.ShardDataModule", "init_args": data}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)["data"]["init_args"]
    assert printed["augment"]["class_path"] == f"{__name__}.HFlipTwin"
    data["augment"] = {"class_path": "app.data.shard_stream.SkipCounts"}  # a class whose instances are not callable
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit):
        AppCLI(args=["fit", "--config", str(path), "--print_config"])
    assert 'Parser key "augment"' in capsys.readouterr().err


class _CountingModule(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        self.seen += [s.meta["index"] for s in batch]
        return (self.weight - 1.0).pow(2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_fit_logs_skip_counts_through_the_trainers_logger(bad_dir, tmp_path):
    dm = ShardDataModule(train_urls=f"{bad_dir}/*.tar", batch_size=4, num_workers=0)
    module = _CountingModule()
    trainer = Trainer(
        max_epochs=1,
        logger=CSVLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(module, datamodule=dm)
    assert sorted(module.seen) == [*range(8), 8, 9, 12, 14]
    assert dm.skipped == SkipCounts(shards=2, samples=2)
    metrics = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    header, *rows = metrics.strip().splitlines()
    column = header.split(",").index("data/skipped_samples")
    assert max(float(r.split(",")[column]) for r in rows if r.split(",")[column]) == 2.0
    state = json.loads(json.dumps(dm.state_dict()))  # saved in checkpoints (resuming: tests/data/test_shard_resume.py)
    assert state["skipped"] == [2, 2] and state["skipped_by_split"] == {"train": [2, 2], "val": [0, 0], "test": [0, 0]}
    (position,) = state["train"]["positions"]
    assert position["epoch"] == 0 and position["batches"] == 3 and position["skipped"] == [2, 2]  # the whole epoch


def test_no_val_urls_means_no_validation(shard_dir):
    dm = _module(f"{shard_dir}/good-*.tar")
    assert dm.val_dataloader() == [] and dm.test_dataloader() == []
    assert os.path.basename(dm.urls["train"][0]) == "good-000000.tar"


# ShardStream on its own, in the main process (worker 0 of 1 unless a test fakes the worker info).


def _seed(*parts: object) -> int:
    """The documented seed recipe: 63 random bits seeded by the parts joined with ':'."""
    return random.Random(":".join(str(p) for p in parts)).getrandbits(63)


STREAM_BOUND = 200  # more batches than any stream here yields: one that never ends fails instead of hanging


def _stream_items(stream: ShardStream) -> list[tuple[list[int], SkipCounts]]:
    items = list(itertools.islice(stream, STREAM_BOUND + 1))
    assert len(items) <= STREAM_BOUND, "the stream did not end"
    return [([s.meta["index"] for s in item.samples], item.skipped) for item in items]


def _stream_indices(stream: ShardStream) -> list[int]:
    return [i for indices, _ in _stream_items(stream) for i in indices]


def _fake_worker(monkeypatch, worker: int, num_workers: int) -> None:
    info = SimpleNamespace(id=worker, num_workers=num_workers)
    monkeypatch.setattr("app.data.shard_stream.get_worker_info", lambda: info)


@pytest.fixture(scope="module")
def single_urls(tmp_path_factory) -> list[str]:
    """Twelve shards of one sample each: shard ``i`` holds sample ``i``, so sample order shows shard order."""
    out = tmp_path_factory.mktemp("single")
    return [str(p) for p in write_samples(_samples(12), out, "one", max_per_shard=1)]


def test_skip_counts_add_field_by_field_and_are_false_only_when_empty():
    assert SkipCounts(1, 2) + SkipCounts(3, 5) == SkipCounts(shards=4, samples=7)
    assert not SkipCounts() and SkipCounts(shards=1) and SkipCounts(samples=1)


def test_derive_seed_is_the_63_bit_draw_of_the_joined_parts():
    for parts in [(0,), (0, 1, "shards"), (7, 3, 1, 2, "buffer")]:
        assert derive_seed(*parts) == _seed(*parts)
    assert max(derive_seed(i) for i in range(64)).bit_length() == 63


def _shard_order(seed: int, epoch: int, num_shards: int = 12) -> list[int]:
    order = list(range(num_shards))
    random.Random(_seed(seed, epoch, "shards")).shuffle(order)
    return order


def test_shard_order_is_shuffled_by_seed_and_epoch_only_when_shuffling(single_urls):
    for seed, epoch in [(0, 0), (0, 1), (5, 0)]:
        stream = ShardStream(single_urls, batch_size=5, seed=seed, shuffle=True)
        stream.epoch = epoch
        assert _stream_indices(stream) == _shard_order(seed, epoch)
    # By default: seed 0 and epoch 0 (until a ShardLoader sets it).
    assert _stream_indices(ShardStream(single_urls, batch_size=5, shuffle=True)) == _shard_order(0, 0)
    unshuffled = ShardStream(single_urls, batch_size=5, seed=3, shuffle=False, shuffle_buffer=8)
    unshuffled.epoch = 2
    assert _stream_indices(unshuffled) == list(range(12))


def test_loader_sets_the_epoch_from_epoch_fn_or_else_counts_passes(single_urls):
    def epochs(epoch_fn=None) -> list[list[int]]:
        loader = ShardLoader(ShardStream(single_urls, batch_size=12, shuffle=True), epoch_fn=epoch_fn)
        return [_indices(loader) for _ in range(3)]

    assert epochs() == [_shard_order(0, e) for e in range(3)]
    assert epochs(lambda: 7) == [_shard_order(0, 7)] * 3
    assert epochs(lambda: None) == [_shard_order(0, e) for e in range(3)]  # a trainer without an epoch yet


def test_ranks_split_by_shard_unless_split_by_sample(shard_dir):
    urls = [str(p) for p in sorted(shard_dir.glob("good-*.tar"))]
    assert _stream_indices(ShardStream(urls, 16)) == list(range(NUM_SAMPLES))
    assert _stream_indices(ShardStream(urls, 16, rank=1, world_size=2)) == [4, 5, 6, 7, 12, 13, 14, 15]
    assert _stream_indices(ShardStream(urls, 16, rank=1, world_size=2, split_by_sample=True)) == list(range(1, 16, 2))


def test_loader_streams_in_this_process_by_default_and_workers_take_every_other_shard(single_urls):
    augmented_here = []

    def spy(sample: VisualSample, rng: random.Random) -> VisualSample:
        augmented_here.append(sample.meta["index"])
        return sample

    assert _indices(ShardLoader(ShardStream(single_urls[:8], 2, augment=spy))) == list(range(8))
    assert augmented_here == list(range(8))  # not in a worker process's copy of the stream
    batches = list(ShardLoader(ShardStream(single_urls[:8], 2), num_workers=2))
    assert [[s.meta["index"] for s in b] for b in batches] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_resampled_stream_needs_an_epoch_size(single_urls):
    with pytest.raises(ValueError, match="^resampled streams never end: give epoch_size$"):
        ShardStream(single_urls, 2, resampled=True)


def test_resampled_shards_are_drawn_per_seed_epoch_rank_and_worker(single_urls, monkeypatch):
    def draws(seed: int, epoch: int, rank: int, worker: int) -> list[int]:
        _fake_worker(monkeypatch, worker, 2)
        stream = ShardStream(single_urls, 5, rank, 2, seed=seed, resampled=True, epoch_size=10)
        stream.epoch = epoch
        return _stream_indices(stream)

    def expected(seed: int, epoch: int, rank: int, worker: int) -> list[int]:
        shards = wds.ResampledShards(
            single_urls,
            seed=_seed(seed, epoch, "resample"),
            worker_seed=lambda: _seed(rank, worker),
            deterministic=True,
        )
        return [single_urls.index(s["url"]) for s in itertools.islice(shards, 5)]

    runs = {args: draws(*args) for args in [(0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (4, 0, 0, 0)]}
    for args, got in runs.items():
        assert got == expected(*args), args  # each worker yields its 5 of the rank's 10 samples
    assert len({tuple(got) for got in runs.values()}) == len(runs)
    assert draws(0, 0, 0, 1) == runs[(0, 0, 0, 1)]  # reproducible


def test_shuffle_buffer_is_seeded_by_seed_epoch_rank_and_worker(shard_dir):
    urls = [str(p) for p in sorted(shard_dir.glob("good-*.tar"))]
    for seed, epoch in [(0, 0), (2, 1)]:
        stream = ShardStream(urls, batch_size=4, seed=seed, shuffle=True, shuffle_buffer=5)
        stream.epoch = epoch
        records = [shard * PER_SHARD + i for shard in _shard_order(seed, epoch, NUM_SHARDS) for i in range(PER_SHARD)]
        buffer = wds.shuffle(5, rng=random.Random(_seed(seed, epoch, 0, 0, "buffer")))
        assert _stream_indices(stream) == list(buffer(iter(records)))


def test_skips_ride_with_the_batch_they_happened_in_and_are_logged(bad_dir, caplog):
    urls = [str(p) for p in sorted(bad_dir.glob("*.tar"))]
    with caplog.at_level(logging.WARNING, logger="app.data.shard_stream"):
        items = _stream_items(ShardStream(urls, batch_size=2))
    messages = [r.getMessage() for r in caplog.records]
    none = SkipCounts()
    assert items == [
        ([0, 1], none),
        ([2, 3], none),
        ([4, 5], none),
        ([6, 7], none),
        ([8, 9], SkipCounts(shards=2)),  # the garbage shard, and the truncated one (it fails before 9 is yielded)
        ([12, 14], SkipCounts(samples=1)),  # sample bad-1
        ([], SkipCounts(samples=1)),  # bad-3, the last record: a counts-only item
    ]
    assert _stream_items(ShardStream(urls[:2], batch_size=2))[-1] == ([6, 7], none)  # no counts-only item when clean
    deltas: list[SkipCounts] = []
    loader = ShardLoader(ShardStream(urls, batch_size=2), on_skip=deltas.append)
    assert [len(b) for b in loader] == [2] * 6  # the counts-only item is no batch
    assert deltas == [SkipCounts(shards=2), SkipCounts(samples=1), SkipCounts(samples=1)]
    assert loader.skipped == SkipCounts(shards=2, samples=2)
    shard_log = "skipping the rest of shard {}: ReadError: {} \\(worker 0: {} shards, 0 samples skipped this epoch\\)"
    sample_log = (
        "skipping sample {0} of {1}: sample '{0}': {2} \\(worker 0: 2 shards, {3} samples skipped this epoch\\)"
    )
    expected = [
        shard_log.format(re.escape(urls[2]), "not a tar archive: no valid member header in its 6000 bytes", 1),
        shard_log.format(re.escape(urls[3]), "unexpected end of data", 2),
        sample_log.format("bad-1", re.escape(urls[4]), "cannot decode image 'img0.png': .+", 1),
        sample_log.format("bad-3", re.escape(urls[4]), "member 'json' is not valid JSON: .+", 2),
    ]
    assert len(messages) == len(expected)
    for pattern, message in zip(expected, messages, strict=True):
        assert re.fullmatch(pattern, message), (pattern, message)


def test_members_without_a_suffix_are_ignored_and_a_duplicate_member_ends_the_shard(tmp_path, caplog):
    """A member named like no sample is passed over; one sample's member twice ends the shard after that sample."""
    members = [("README", b"not a sample")]
    for i, sample in enumerate(_samples(3)):
        record = encode_sample(sample, f"s{i}")
        members += [(f"s{i}.{suffix}", record[suffix]) for suffix in ("json", "img0.png")]
    members.insert(5, members[3])  # s1.json, s1.img0.png, s1.json again, then s2
    path = tmp_path / "odd.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with caplog.at_level(logging.WARNING, logger="app.data.shard_stream"):
        items = _stream_items(ShardStream([str(path)], batch_size=4))
    assert items == [([0, 1], SkipCounts(shards=1))]
    assert [r.getMessage() for r in caplog.records] == [
        f"skipping the rest of shard {path}: ValueError: duplicate member 's1.json' "
        "(worker 0: 1 shards, 0 samples skipped this epoch)"
    ]


def test_strip_labels_applies_before_augment_and_only_when_asked(shard_dir):
    urls = [str(p) for p in sorted(shard_dir.glob("good-*.tar"))]
    seen = []

    def spy(sample: VisualSample, rng: random.Random) -> VisualSample:
        seen.append(sample.answer)
        return sample

    stripped = [s for item in ShardStream(urls, 4, augment=spy, strip_labels=True) for s in item.samples]
    assert len(seen) == len(stripped) == NUM_SAMPLES and set(seen) == {None}
    kept = [s for item in ShardStream(urls, 4) for s in item.samples]
    assert all(s.answer is not None for s in kept) and [s.answer for s in kept] == [s.answer for s in _samples(16)]


def test_only_resampled_loaders_know_their_length(shard_dir):
    urls = [str(p) for p in sorted(shard_dir.glob("good-*.tar"))]
    assert len(ShardLoader(ShardStream(urls, 4, resampled=True, epoch_size=9))) == 3
    with pytest.raises(TypeError, match="^a finite shard stream has no length known in advance$"):
        len(ShardLoader(ShardStream(urls, 4)))

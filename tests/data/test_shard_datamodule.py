import dataclasses
import json
import logging
import os
import random
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from jsonargparse import ArgumentParser
from lightning import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from PIL import Image

from app.data import DotsDataset, ShardDataModule
from app.data.shard_stream import SkipCounts, epoch_share
from app.data.shards import encode_sample, write_samples
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
        batches = list(loader)
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
    dm = parser.instantiate_classes(parser.parse_object(config)).data
    assert isinstance(dm, ShardDataModule) and isinstance(dm.augment, HFlipTwin) and dm.augment.tag == "mirrored"
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert [len(b) for b in batches] == [4, 4]
    assert [s.meta.get("role") for s in batches[0]] == [None, "mirrored"] * 2


def test_app_cli_parses_a_shard_data_config_with_an_augment(shard_dir, tmp_path, capsys):
    from app.cli import AppCLI

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
    assert json.loads(json.dumps(dm.state_dict())) == {}


def test_no_val_urls_means_no_validation(shard_dir):
    dm = _module(f"{shard_dir}/good-*.tar")
    assert dm.val_dataloader() == [] and dm.test_dataloader() == []
    assert os.path.basename(dm.urls["train"][0]) == "good-000000.tar"

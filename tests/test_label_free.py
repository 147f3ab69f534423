"""Label-free consistency training end to end: shards written without answers, twins made on the fly, two GRPO steps
from configs/quickstart/consistency_dots_shards.yaml, and proof that nothing on the training path read a label."""

import math
import tarfile
from pathlib import Path

import pytest
import torch

from app.command_line.commands import AppCLI
from app.data.shards import LABEL_META_KEYS
from app.rewards.consistency import ConsistencyReward
from app.tasks.__main__ import main as data_main
from app.types import VisualSample

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "quickstart/consistency_dots_shards.yaml"


class LabelTrap(VisualSample):
    """A sample whose label fields raise on read: a reward or module that looks at one fails the test."""

    @property
    def answer(self):
        raise AssertionError(f"a label was read on the training path ({self.task})")

    @answer.setter
    def answer(self, value):
        if value is not None:
            raise AssertionError("a training sample carried an answer")

    @property
    def reasoning(self):
        raise AssertionError("a reasoning label was read on the training path")

    @reasoning.setter
    def reasoning(self, value):
        if value is not None:
            raise AssertionError("a training sample carried a reasoning")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("dots-shards")
    common = ["--image-size", "64", "--dot-radius", "12", "--max-per-shard", "8"]
    data_main(["dots", "--out", str(root / "train"), "--num", "24", "--seed", "0", "--strip-labels", *common])
    data_main(["dots", "--out", str(root / "val"), "--num", "4", "--seed", "1", *common])
    return root


def test_label_free_shards_hold_no_label(shards):
    records = []
    for path in sorted((shards / "train").glob("*.tar")):
        with tarfile.open(path) as tar:
            records += [tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith(".json")]
    assert len(records) == 24
    for record in records:
        assert '"answer"' not in record and '"reasoning"' not in record
        assert not any(f'"{key}"' in record for key in LABEL_META_KEYS)
    with tarfile.open(next((shards / "val").glob("*.tar"))) as tar:  # validation keeps its labels
        assert any(b'"answer"' in tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".json"))


def test_consistency_grpo_trains_on_label_free_shards_without_reading_a_label(shards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(CONFIG), "--model.init_args.policy.init_args.model", "tiny-qwen3-vl"]
    args += [
        "--trainer.max_steps",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--validate_before_and_after",
        "false",
    ]
    args += ["--data.init_args.train_urls", str(shards / "train" / "dots-*.tar")]
    args += ["--data.init_args.val_urls", str(shards / "val" / "dots-*.tar"), "--data.init_args.batch_size", "2"]
    cli = AppCLI(args=args, run=False)
    seen: list[list[VisualSample]] = []
    score = ConsistencyReward.score

    def trapped(self, completions, samples, group_size=None):
        # Rebuild every row as a LabelTrap sharing the group structure (same object per group), then score.
        traps: dict[int, LabelTrap] = {}
        for s in samples:
            if id(s) not in traps:
                assert s.answer is None and s.reasoning is None, "a training sample carried a label"
                assert not set(LABEL_META_KEYS) & set(s.meta), f"label meta {set(LABEL_META_KEYS) & set(s.meta)}"
                traps[id(s)] = LabelTrap(s.images, s.question, s.task, None, None, s.meta)
        rows = [traps[id(s)] for s in samples]
        seen.append(rows)
        return score(self, completions, rows, group_size=group_size)

    monkeypatch.setattr(ConsistencyReward, "score", trapped)

    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    assert cli.trainer.global_step == 2 and len(seen) == 2
    k = cli.model.sampling.group_size
    for rows in seen:
        assert len(rows) == 2 * 2 * k  # 2 pairs x (x, x') x K completions, all on this rank
        pair_ids = [rows[i].meta["pair_id"] for i in range(0, len(rows), k)]
        assert pair_ids[0] == pair_ids[1] and pair_ids[2] == pair_ids[3] and pair_ids[0] != pair_ids[2]
        assert {rows[k].meta["relation"], rows[3 * k].meta["relation"]} <= {"identity", "negation"}
    assert math.isfinite(float(cli.trainer.callback_metrics["train/reward/consistency"]))
    # (The random tiny model rarely writes a parseable answer, so its weights may not move in two steps; the recipe's
    # own run from the SFT policy is what shows learning.)


def test_spatial_label_free_shards_stream_as_scored_pairs(tmp_path):
    """The spatial recipe's data path: label-free shards -> twins on the fly -> the mixed-type consistency reward."""
    from app.data import ShardDataModule
    from app.tasks.spatial import SpatialPairAugmenter

    data_main(
        [
            "spatial",
            "--out",
            str(tmp_path),
            "--num",
            "8",
            "--seed",
            "0",
            "--image-size",
            "96",
            "--strip-labels",
            "--tasks",
            "orientation",
            "depth",
            "counting",
        ]
    )
    dm = ShardDataModule(str(tmp_path / "spatial-*.tar"), batch_size=4, augment=SpatialPairAugmenter(), seed=0)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 8 and all(s.answer is None for s in batch)
    assert not any(set(LABEL_META_KEYS) & set(s.meta) for s in batch)
    k = 2
    rows = [s for s in batch for _ in range(k)]
    texts = ["<think>t</think><answer>yes</answer>", "<think>t</think><answer>2</answer>"] * (len(rows) // 2)
    scores = ConsistencyReward(answer_type="from_meta").score(texts, rows)
    assert scores.shape == (len(rows),) and torch.isfinite(scores).all()

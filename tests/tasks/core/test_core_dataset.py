"""CoreTripletDataset: TriSR scores the target as perfect, determinism, JSON meta, label-free mode, data module, CLI."""

import functools
import json
import random

import numpy as np
import pytest

from app.data import VisualTaskDataModule, read_samples
from app.formats import format_triplet_response
from app.rewards.trisr import TripletOverallAccuracy, TriSRReward
from app.rewards.trisr_scores import triplet_consistency_reward
from app.tasks.__main__ import main
from app.tasks.core import CoreTripletDataset, NumericRule, make_core_triplet


@pytest.fixture(scope="module")
def dataset():
    return CoreTripletDataset(8, seed=5, image_size=96)


@pytest.fixture(scope="module")
def samples(dataset):
    return [dataset[i] for i in range(len(dataset))]


def _response(reasoning: str, answer: str) -> str:
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


def test_tasks_cycle_and_samples_are_triplets(samples):
    assert [s.task for s in samples] == ["core_counting", "core_depth", "core_distance", "core_spatial"] * 2
    for s in samples:
        assert len(s.images) == 3 and all(im.size == (96, 96) and im.mode == "RGB" for im in s.images)
        assert s.meta["task"] == s.task.removeprefix("core_")
        assert s.meta["answer_type"] == ("categorical" if s.meta["task"] == "spatial" else "ordinal")
        json.loads(json.dumps(s.meta))  # plain JSON: no tuples or numpy values survive the round trip unequal
        assert json.loads(json.dumps(s.meta)) == s.meta


def test_ground_truth_follows_the_metric_values(samples):
    for s in samples:
        values, gt = s.meta["ground_truth"]["metric_values"], s.meta["ground_truth"]
        for pair, answer in s.meta["pair_answers"].items():
            a, b = values[int(pair[0]) - 1], values[int(pair[2]) - 1]
            if s.meta["task"] == "spatial":
                assert answer == ("same" if a == b else "different")
            else:
                assert answer == (pair[0] if (a > b) == (s.meta["direction"] == "larger") else pair[2])
            assert s.meta["options"][pair][gt["answer_positions"][pair]] == answer
        if s.meta["task"] == "counting":
            assert s.meta["attributes"] == values == [len(a["points"]) for a in gt["annotations"]]
        if s.meta["task"] == "depth":
            assert len(s.meta["regions"]) == 3
            # the boxed object in each image is red-outlined exactly where meta says
            for image, (x0, y0, x1, _) in zip(s.images, s.meta["regions"], strict=True):
                assert (np.asarray(image)[y0 - 2, x0:x1] == (230, 25, 25)).all()


def test_trisr_scores_the_target_best_and_a_wrong_response_lower(samples):
    reward, overall = TriSRReward(), TripletOverallAccuracy()
    for s in samples:
        target = _response(s.reasoning, s.answer)
        tc = triplet_consistency_reward([target], s.meta["answer_type"]).item()
        best = 1.4 + 0.3 * tc  # every term at its maximum; R_tc is 0 where the answers imply nothing (or categorical)
        assert reward.score([target], [s]).item() == pytest.approx(best) and overall.score([target], [s]).item() == 1
        if s.meta["task"] == "spatial":
            assert tc == 0.0
        # flip the 1-2 answer to the other option and misstate image 1's attribute
        wrong_answers = dict(s.meta["pair_answers"])
        options = s.meta["options"]["1-2"]
        wrong_answers["1-2"] = options[1 - options.index(wrong_answers["1-2"])]
        attributes = [s.meta["attributes"][0] * 2 + 1, *s.meta["attributes"][1:]]
        wrong = _response(*format_triplet_response(attributes, wrong_answers, wrong_answers))
        # at least 1/3 of R_task lost; a flip can make the answers consistent (+0.3 R_tc) but never make up for it
        assert reward.score([wrong], [s]).item() < best - 0.05
        assert overall.score([wrong], [s]).item() == 0


def test_deterministic_per_seed_and_index(dataset, samples):
    again = CoreTripletDataset(8, seed=5, image_size=96)[5]
    assert again.meta == samples[5].meta and again.question == samples[5].question
    assert all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(again.images, samples[5].images, strict=True)
    )
    other = CoreTripletDataset(8, seed=6, image_size=96)[5]
    assert other.meta["ground_truth"] != samples[5].meta["ground_truth"]
    assert dataset[-3].meta == samples[5].meta
    with pytest.raises(IndexError):
        dataset[8]


def test_quality_stats_and_rejections(dataset, samples):
    summary = dataset.stats.summary()
    assert sum(v["accepted"] for v in summary.values()) >= 8
    assert sum(s.meta["qc_rejections"] for s in samples) <= dataset.stats.num_rejected()
    with pytest.raises(RuntimeError, match="rejected 3 counting triplets in a row"):
        make_core_triplet("counting", random.Random(0), 96, NumericRule(50, 60), max_attempts=3)


def test_unlabeled_and_arguments():
    s = CoreTripletDataset(2, seed=0, image_size=96, tasks=("spatial",), labeled=False)[1]
    assert s.answer is None and s.reasoning is None
    assert not {"attributes", "pair_answers", "ground_truth"} & set(s.meta)
    assert s.meta["answer_type"] == "categorical" and s.meta["options"]
    with pytest.raises(ValueError, match="subset of"):
        CoreTripletDataset(2, seed=0, tasks=("size",))
    with pytest.raises(ValueError, match="image_size"):
        CoreTripletDataset(2, seed=0, image_size=32)


def test_data_module_and_cli_round_trip(tmp_path, capsys):
    depth = functools.partial(CoreTripletDataset, tasks=["depth"])
    data = VisualTaskDataModule(depth, 2, 1, 1, batch_size=2, image_size=96)
    batch = next(iter(data.train_dataloader()))
    assert len(batch) == 2 and all(s.task == "core_depth" for s in batch)

    main(["core", "--out", str(tmp_path), "--num", "3", "--seed", "2", "--tasks", "counting", "distance"])
    assert "wrote 3 triplets" in capsys.readouterr().out
    read = list(read_samples(str(tmp_path / "core-*.tar")))
    expected = CoreTripletDataset(3, seed=2, tasks=("counting", "distance"))
    assert [s.meta for s in read] == [expected[i].meta for i in range(3)]
    assert np.array_equal(np.asarray(read[1].images[2]), np.asarray(expected[1].images[2]))
    quality = json.loads((tmp_path / "core-quality.json").read_text())
    assert quality["counting"]["accepted"] == 2 and quality["distance"]["accepted"] == 1

"""Reason-RFT visual counting: programs whose answers follow from the scene, in-domain vs domain-shift splits, CoT
text, rewards, determinism, JSON meta and the shard CLI."""

import importlib.util
import json
from collections import Counter

import pytest

from app.rewards.numeric import NumericToleranceReward
from app.tasks.reason_rft import counting
from app.tasks.reason_rft.counting import (
    DOMAIN_SHIFT_TYPES,
    IN_DOMAIN_TYPES,
    SPLITS,
    VisualCountingDataset,
    make_sample,
)
from app.tasks.reason_rft.programs import AmbiguousProgram, CountingProgram, Filter, Operation, execute
from app.tasks.reason_rft.scene import NEW_SHAPES, SHAPES

SIZE = 48
N = 16


@pytest.fixture(scope="module")
def samples():
    return {split: [make_sample(0, split, i, SIZE) for i in range(N)] for split in SPLITS}


def matches(item, target):
    # every program is decidable, so an attribute an added object leaves unsaid never decides a match alone
    return all(item.get(name) == value for name, value in target.items())


def recount(attributes, program):
    """The answer computed from the scene description and the program, independently of the package."""
    items = [dict(a) for a in attributes]
    for op in program["operations"]:
        if op["kind"] == "subtract":
            items = [item for item in items if not matches(item, op["target"])]
        else:
            items += [dict(op["target"])] * op["count"]
    for item in items:  # decidability: an unsaid attribute is only ever met alongside a contradicting one
        for target in [op["target"] for op in program["operations"] if op["kind"] == "subtract"] + [program["query"]]:
            missing = [n for n in target if n not in item]
            assert not missing or any(item.get(n) not in (None, v) for n, v in target.items())
    return sum(matches(item, program["query"]) for item in items)


def test_filter_matching_and_wording():
    red_cubes = Filter(color="red", shape="cube")
    assert red_cubes.matches({"size": "large", "color": "red", "material": "metal", "shape": "cube"}) is True
    assert red_cubes.matches({"color": "blue"}) is False  # a contradiction decides even with attributes unsaid
    assert red_cubes.matches({"color": "red"}) is None  # the shape is unsaid
    assert red_cubes.phrase() == "red cubes" and red_cubes.phrase(1) == "1 red cube"
    assert Filter(size="large", material="metal").phrase(2) == "2 large metal objects"
    assert Filter().phrase() == "objects"


def test_execute_counts_operations_on_a_known_scene():
    scene = [
        {"size": "large", "color": "red", "material": "metal", "shape": "cube"},
        {"size": "large", "color": "blue", "material": "rubber", "shape": "cube"},
        {"size": "small", "color": "red", "material": "rubber", "shape": "sphere"},
        {"size": "small", "color": "gray", "material": "rubber", "shape": "cylinder"},
    ]
    sub = CountingProgram((Operation("subtract", Filter(size="large", shape="cube")),), Filter(), "subtraction")
    assert sub.question() == "Subtract all large cubes. How many objects are left?"
    result = execute(scene, sub)
    assert (result.initial, result.steps[0].affected, result.answer) == (4, 2, 2)
    # the second subtraction only counts what the first left: the red cube is gone already
    hop = CountingProgram(
        (Operation("subtract", Filter(shape="cube")), Operation("subtract", Filter(color="red"))), Filter(), "multihop"
    )
    assert [s.total for s in execute(scene, hop).steps] == [2, 1]
    add = CountingProgram(
        (Operation("add", Filter(color="red", shape="cylinder"), 2),), Filter(shape="cylinder"), "addition"
    )
    assert add.question() == "Add 2 red cylinders. How many cylinders are there?"
    result = execute(scene, add)
    assert (result.query_from_scene, result.query_from_added, result.answer) == (1, 2, 3)
    unsaid = CountingProgram((Operation("add", Filter(shape="cylinder"), 1),), Filter(material="metal"), "addition")
    with pytest.raises(AmbiguousProgram, match="metal objects is undecided"):
        execute(scene, unsaid)


@pytest.mark.parametrize("split", SPLITS)
def test_answers_follow_from_the_scene_description(samples, split):
    for sample in samples[split]:
        meta = sample.meta
        assert sample.task == "rrft_counting" and len(sample.images) == 1 and sample.images[0].size == (SIZE, SIZE)
        answer = recount(meta["attributes"], meta["program"])
        assert sample.answer == str(answer) == str(meta["solution"]["answer"]) and answer >= 0
        assert 3 <= len(meta["attributes"]) == len(meta["objects"]) <= 10
        assert all(obj["box"] is not None for obj in meta["objects"])  # every object is in view
        for op in meta["program"]["operations"]:
            phrase = Filter(**op["target"]).phrase(op["count"] if op["kind"] == "add" else None)
            assert phrase in sample.question


def test_in_domain_and_domain_shift_question_types_and_shapes(samples):
    for split in ("train", "test_in_domain", "cot_sft"):
        for sample in samples[split]:
            assert sample.meta["question_type"] in IN_DOMAIN_TYPES and sample.meta["subset"] == "ID"
            assert {a["shape"] for a in sample.meta["attributes"]} <= set(SHAPES)
            assert not any(shape in sample.question for shape in ("cone", "pyramid"))
    shift = samples["test_domain_shift"]
    for sample in shift:
        meta = sample.meta
        assert meta["question_type"] in DOMAIN_SHIFT_TYPES and meta["question_type"] != "adversarial"
        assert meta["subset"] == ("DS-M" if meta["question_type"] == "addition_subtraction" else "DS-D")
        assert sum(a["shape"] in NEW_SHAPES for a in meta["attributes"]) >= 2  # unseen shapes in every scene
        assert any(shape in sample.question for shape in ("cone", "pyramid"))  # and in the question
        if meta["question_type"] == "addition_subtraction":
            assert {op["kind"] for op in meta["program"]["operations"]} == {"add", "subtract"}
    all_types = {s.meta["question_type"] for split in ("train", "test_in_domain", "cot_sft") for s in samples[split]}
    assert all_types == set(IN_DOMAIN_TYPES)


def test_adversarial_questions_leave_the_asked_count_untouched():
    found = 0
    for i in range(60):
        sample = make_sample(1, "train", i, 32)
        if sample.meta["question_type"] != "adversarial":
            continue
        found += 1
        meta = sample.meta
        query = meta["program"]["query"]
        before = sum(matches(a, query) for a in meta["attributes"])
        assert int(sample.answer) == before  # the trick: the operation does not change what is asked
    assert found >= 5


def test_the_target_answer_earns_the_full_reward(samples):
    everything = [s for split in SPLITS for s in samples[split]]
    completions = [f"<think>counting</think><answer>{s.answer}</answer>" for s in everything]
    assert NumericToleranceReward().score(completions, everything).tolist() == [1.0] * len(everything)
    off_by_three = [f"<answer>{int(s.answer) + 3}</answer>" for s in everything]
    assert max(NumericToleranceReward().score(off_by_three, everything).tolist()) < 1.0


def test_cot_mentions_the_right_numbers(samples):
    for sample in samples["cot_sft"]:
        text, meta = sample.reasoning, sample.meta
        n = len(meta["attributes"])
        assert text.startswith(f"There {'is' if n == 1 else 'are'} {n} object")
        for shape in Counter(a["shape"] for a in meta["attributes"]):
            assert shape in text  # the scene listing names every shape
        for op, total in zip(meta["program"]["operations"], meta["solution"]["totals"], strict=True):
            sign = "-" if op["kind"] == "subtract" else "+"
            assert f"{sign} " in text and f"= {total}" in text or f"leaves all {total}" in text
        assert text.endswith(f"The answer is {sample.answer}.")
    for split in ("train", "test_in_domain", "test_domain_shift"):
        assert all(s.reasoning is None for s in samples[split])  # only the CoT-SFT set carries reasoning


def test_cot_text_for_a_subtraction():
    sample = next(
        s for i in range(40) if (s := make_sample(2, "cot_sft", i, 32)).meta["question_type"] == "subtraction"
    )
    op = sample.meta["program"]["operations"][0]
    n, left = len(sample.meta["attributes"]), sample.meta["solution"]["totals"][0]
    removed = n - left
    if removed:
        assert (
            f"{removed} of the {n} objects" in sample.reasoning
            and f"leaves {n} - {removed} = {left}." in sample.reasoning
        )
    assert Filter(**op["target"]).words(removed != 1) in sample.reasoning


def test_samples_are_deterministic_and_splits_differ(samples):
    again = make_sample(0, "train", 3, SIZE)
    first = samples["train"][3]
    assert again.images[0].tobytes() == first.images[0].tobytes()
    assert (again.question, again.answer, again.meta) == (first.question, first.answer, first.meta)
    scenes = {split: {json.dumps(s.meta["attributes"]) for s in samples[split]} for split in SPLITS}
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not scenes[a] & scenes[b], f"{a} and {b} share scenes"
    assert make_sample(1, "train", 3, SIZE).meta != first.meta


def test_meta_is_json_serialisable(samples):
    for split in SPLITS:
        for sample in samples[split]:
            assert json.loads(json.dumps(sample.meta)) == sample.meta


def test_dataset_and_unlabeled_samples():
    dataset = VisualCountingDataset(num_samples=3, seed=0, image_size=32, split="test_domain_shift", labeled=False)
    assert len(dataset) == 3
    sample = dataset[2]
    assert sample.answer is None and sample.reasoning is None and sample.meta["subset"].startswith("DS")
    labeled = VisualCountingDataset(3, 0, 32, split="test_domain_shift")[2]
    assert labeled.images[0].tobytes() == sample.images[0].tobytes() and labeled.answer is not None
    with pytest.raises(IndexError, match="index 3 out of range"):
        dataset[3]
    with pytest.raises(ValueError, match="unknown split 'val'"):
        VisualCountingDataset(1, 0, split="val")


@pytest.mark.skipif(importlib.util.find_spec("app.data.shards") is None, reason="needs app.data.shards")
def test_cli_round_trip(tmp_path):
    from app.data.shards import read_samples
    from app.tasks.__main__ import main

    main(
        [
            "reason_rft",
            "--suite",
            "counting",
            "--split",
            "test_domain_shift",
            "--num",
            "3",
            "--seed",
            "4",
            "--out",
            str(tmp_path),
            "--image-size",
            "32",
            "--max-per-shard",
            "2",
        ]
    )
    shards = sorted(tmp_path.glob("rrft_counting-test_domain_shift-*.tar"))
    assert len(shards) == 2
    read = list(read_samples([str(p) for p in shards]))
    expected = list(counting.make_samples(3, 4, "test_domain_shift", 32))
    assert [(s.question, s.answer, s.meta) for s in read] == [(s.question, s.answer, s.meta) for s in expected]
    assert [s.images[0].tobytes() for s in read] == [s.images[0].tobytes() for s in expected]
    with pytest.raises(SystemExit, match="no split 'test_left'"):
        main(["reason_rft", "--suite", "counting", "--split", "test_left", "--num", "1", "--out", str(tmp_path)])

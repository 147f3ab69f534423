"""Reason-RFT spatial transformation: step sequences that explain the final scene, the function-sequence reward,
Left / Right viewpoints, CoT text, determinism, JSON meta and the shard CLI."""

import importlib.util
import json
import math

import numpy as np
import pytest

from app.rewards.function_sequence import FunctionSequenceReward
from app.rewards.parsing import parse_steps
from app.tasks.reason_rft import transformation
from app.tasks.reason_rft.render import Camera, visible_fractions
from app.tasks.reason_rft.scene import SceneObject
from app.tasks.reason_rft.transformation import (
    DIRECTIONS,
    FUNCTIONS,
    MAX_STEPS,
    MIN_VISIBLE,
    MOVE_DISTANCE,
    SPLITS,
    VALUES,
    SpatialTransformationDataset,
    apply_step,
    make_sample,
)

SIZE = 48
N = 12


@pytest.fixture(scope="module")
def samples():
    return {split: [make_sample(0, split, i, SIZE) for i in range(N)] for split in SPLITS}


def scene(records):
    return [SceneObject(**{k: r[k] for k in ("shape", "color", "size", "material", "x", "y", "yaw")}) for r in records]


def test_apply_step_changes_one_attribute_or_moves_by_the_fixed_distance():
    obj = SceneObject("cube", "red", "small", "rubber", 0.5, -0.5, 10.0)
    assert apply_step(obj, "change_color", "blue") == SceneObject("cube", "blue", "small", "rubber", 0.5, -0.5, 10.0)
    assert apply_step(obj, "change_material", "metal").material == "metal"
    front = apply_step(obj, "change_position", "front")
    assert (front.x, front.y) == pytest.approx((0.5, -0.5 - MOVE_DISTANCE))  # front is toward the front camera
    diagonal = apply_step(obj, "change_position", "behind_left")
    assert diagonal.x < obj.x and diagonal.y > obj.y
    assert math.hypot(diagonal.x - obj.x, diagonal.y - obj.y) == pytest.approx(MOVE_DISTANCE, abs=2e-3)
    with pytest.raises(ValueError, match=r"unknown transformation change_color\('pink'\)"):
        apply_step(obj, "change_color", "pink")
    with pytest.raises(ValueError, match="known functions: change_size"):
        apply_step(obj, "change_texture", "wood")


def test_vocabulary_is_trance_s():
    assert FUNCTIONS == ("change_size", "change_color", "change_material", "change_shape", "change_position")
    assert VALUES["change_size"] == ("small", "medium", "large") and len(VALUES["change_color"]) == 8
    assert set(DIRECTIONS) == {
        "front",
        "behind",
        "left",
        "right",
        "front_left",
        "front_right",
        "behind_left",
        "behind_right",
    }


@pytest.mark.parametrize("split", SPLITS)
def test_the_steps_turn_the_initial_scene_into_the_final_one(samples, split):
    for sample in samples[split]:
        meta = sample.meta
        initial, final = scene(meta["objects"]), scene(meta["target"]["objects"])
        steps = parse_steps(sample.answer)
        assert steps is not None and 1 <= len(steps) == meta["level"] <= MAX_STEPS
        assert [(s.function, s.obj, s.value) for s in steps] == [
            (s["function"], s["object"], s["value"]) for s in meta["solution"]
        ]
        expected = list(initial)
        for step in steps:
            index = int(step.obj.removeprefix("obj_")) - 1
            assert expected[index] == initial[index], "an object changes at most once"
            assert step.value != (
                None if step.function == "change_position" else getattr(initial[index], step.function[7:])
            )
            expected[index] = apply_step(initial[index], step.function, step.value)
        assert expected == final
        for i, obj in enumerate(initial):
            assert f"obj_{i + 1}: {obj.describe()}" in sample.question  # every object is named in the question


def test_objects_are_numbered_left_to_right_in_the_initial_image(samples):
    camera = Camera.view("front")
    for sample in samples["train"]:
        xs = [camera.project((o["x"], o["y"], 0.0), 1)[0] for o in sample.meta["objects"]]
        assert xs == sorted(xs)
        assert [o["id"] for o in sample.meta["objects"]] == [f"obj_{i + 1}" for i in range(len(xs))]


def test_every_object_is_visible_in_both_images_from_every_view(samples):
    for sample in samples["test_in_domain"][:6]:
        assert min(visible_fractions(scene(sample.meta["objects"]), "front", 64)) >= MIN_VISIBLE
        for view in ("front", "left", "right"):
            assert min(visible_fractions(scene(sample.meta["target"]["objects"]), view, 64)) >= MIN_VISIBLE


def test_changed_objects_change_pixels(samples):
    for sample in samples["test_in_domain"]:
        before, after = (np.asarray(im).astype(int) for im in sample.images)
        diff = np.abs(before - after).sum(axis=-1)
        for step in sample.meta["solution"]:
            index = int(step["object"].removeprefix("obj_")) - 1
            boxes = [sample.meta["objects"][index]["box"], sample.meta["target"]["objects"][index]["box"]]
            assert any(diff[y0:y1, x0:x1].max() > 30 for x0, y0, x1, y1 in boxes), step


def test_the_target_answer_earns_the_full_reward(samples):
    everything = [s for split in SPLITS for s in samples[split]]
    completions = [f"<think>compare</think><answer>{s.answer}</answer>" for s in everything]
    for alpha, beta in ((0.0, 0.0), (0.5, 0.25), (-0.25, -0.5)):
        scores = FunctionSequenceReward(alpha=alpha, beta=beta).score(completions, everything)
        assert scores.tolist() == [1.0] * len(everything)
    wrong = [f"<answer>{s.answer.replace('obj_1,', 'obj_9,')}, change_shape(obj_9, cube)</answer>" for s in everything]
    assert max(FunctionSequenceReward().score(wrong, everything).tolist()) < 1.0


def test_left_and_right_splits_show_the_same_test_scenes_from_other_viewpoints(samples):
    front, left, right, shift = (samples[s] for s in ("test_in_domain", "test_left", "test_right", "test_domain_shift"))
    for i in range(N):
        assert front[i].answer == left[i].answer == right[i].answer == shift[i].answer
        assert front[i].meta["target"] == {**left[i].meta["target"], "objects": front[i].meta["target"]["objects"]}
        assert front[i].images[0].tobytes() == left[i].images[0].tobytes() == right[i].images[0].tobytes()
        finals = {s.images[1].tobytes() for s in (front[i], left[i], right[i])}
        assert len(finals) == 3
        views = [s.meta["view_final"] for s in (front[i], left[i], right[i], shift[i])]
        assert views == ["front", "left", "right", "left" if i % 2 == 0 else "right"]
        assert shift[i].images[1].tobytes() == (left[i] if i % 2 == 0 else right[i]).images[1].tobytes()
        assert "from the left side" in left[i].question and "from the right side" in right[i].question
    for split in ("train", "cot_sft", "test_in_domain"):
        assert all(s.meta["view_final"] == "front" for s in samples[split])


def test_levels_and_functions_are_all_used():
    many = [make_sample(3, "train", i, 24) for i in range(40)]
    assert {s.meta["level"] for s in many} == set(range(1, MAX_STEPS + 1))
    assert {step["function"] for s in many for step in s.meta["solution"]} == set(FUNCTIONS)


def test_cot_walks_every_object_and_names_every_step(samples):
    for sample in samples["cot_sft"]:
        text = sample.reasoning
        for i in range(len(sample.meta["objects"])):
            assert f"obj_{i + 1}" in text
        for step in parse_steps(sample.answer):
            assert f"{step.function}({step.obj}, {step.value})" in text
        assert text.endswith(f"the final one: {sample.answer}.")
        unchanged = len(sample.meta["objects"]) - sample.meta["level"]
        assert text.count("looks the same and stays in place") == unchanged
    for split in ("train", "test_in_domain", "test_left", "test_right", "test_domain_shift"):
        assert all(s.reasoning is None for s in samples[split])


def test_samples_are_deterministic_and_seed_streams_are_disjoint(samples):
    again = make_sample(0, "train", 5, SIZE)
    first = samples["train"][5]
    assert [im.tobytes() for im in again.images] == [im.tobytes() for im in first.images]
    assert (again.question, again.answer, again.meta) == (first.question, first.answer, first.meta)
    streams = {
        split: {json.dumps(s.meta["objects"]) for s in samples[split]}
        for split in ("train", "cot_sft", "test_in_domain")
    }
    assert not streams["train"] & streams["cot_sft"] and not streams["train"] & streams["test_in_domain"]
    assert not streams["cot_sft"] & streams["test_in_domain"]


def test_meta_is_json_serialisable(samples):
    for split in SPLITS:
        for sample in samples[split]:
            assert json.loads(json.dumps(sample.meta)) == sample.meta


def test_dataset_and_unlabeled_samples():
    dataset = SpatialTransformationDataset(num_samples=2, seed=0, image_size=32, split="test_right", labeled=False)
    assert len(dataset) == 2
    sample = dataset[1]
    assert sample.answer is None and sample.reasoning is None and sample.meta["view_final"] == "right"
    with pytest.raises(ValueError, match="unknown split 'test_top'"):
        SpatialTransformationDataset(1, 0, split="test_top")


@pytest.mark.skipif(importlib.util.find_spec("app.data.shards") is None, reason="needs app.data.shards")
def test_cli_round_trip_and_label_free_shards(tmp_path):
    from app.data.shards import read_samples
    from app.tasks.__main__ import main

    args = ["reason_rft", "--suite", "transformation", "--split", "test_left", "--num", "2", "--image-size", "32"]
    main([*args, "--out", str(tmp_path / "labeled")])
    read = list(
        read_samples(sorted(str(p) for p in (tmp_path / "labeled").glob("rrft_transformation-test_left-*.tar")))
    )
    expected = list(transformation.make_samples(2, 0, "test_left", 32))
    assert [(s.question, s.answer, s.meta) for s in read] == [(s.question, s.answer, s.meta) for s in expected]
    assert [[im.tobytes() for im in s.images] for s in read] == [[im.tobytes() for im in s.images] for s in expected]
    main([*args, "--out", str(tmp_path / "free"), "--unlabeled"])
    free = list(read_samples(sorted(str(p) for p in (tmp_path / "free").glob("*.tar"))))
    assert all(s.answer is None and "target" not in s.meta and "solution" not in s.meta for s in free)
    assert [s.meta["objects"] for s in free] == [s.meta["objects"] for s in expected]  # the question's objects stay

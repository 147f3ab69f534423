"""Spatial augmentations: the twin's ground truth, recomputed from its transformed scene, is the relation applied to the
original's; flips and crops move pixels and metadata together; label-free samples pair without answers."""

import functools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.data.datamodule import VisualTaskDataModule
from app.data.shards import LABEL_META_KEYS
from app.rewards.consistency import consistency_rewards
from app.rewards.groups import pair_groups
from app.tasks.dots.dots import DotsDataset
from app.tasks.spatial import TASK_NAMES, TRANSFORMS, SpatialPairAugmenter, SpatialVQADataset, answer_from_meta, effect
from app.tasks.spatial.markers import MARKER_COLORS
from app.tasks.spatial.templates import render_question

POOL = [
    SpatialVQADataset(12, seed=s, image_size=96, tasks=TASK_NAMES, domain=d)[i]
    for s, d in ((0, "indoor"), (1, "outdoor"))
    for i in range(12)
]
"""Two samples of every task in each domain."""

NEGATING = {"relation_swap", "order_swap"}  # for boolean tasks; hflip negates orientation only


def expected_relation(task, transforms):
    negations = sum(t in NEGATING for t in transforms) if task not in ("counting", "distance") else 0
    negations += task == "orientation" and "hflip" in transforms
    return "negation" if negations % 2 else "identity"


def negate_if(relation, answer):
    return {"yes": "no", "no": "yes"}[answer] if relation == "negation" else answer


@given(
    index=st.integers(0, len(POOL) - 1),
    transforms=st.lists(st.sampled_from(TRANSFORMS), unique=True),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=100, deadline=None)
def test_twin_ground_truth_from_the_transformed_scene_is_the_relation_of_the_original(index, transforms, seed):
    sample = POOL[index]
    task = sample.meta["spatial_task"]
    transforms = [t for t in transforms if effect(task, t) is not None]
    x, twin = SpatialPairAugmenter().pair(sample, transforms, random.Random(seed))
    relation = twin.meta["relation"]
    assert relation == expected_relation(task, transforms)
    truth = answer_from_meta(x.meta)
    assert truth == sample.answer
    assert answer_from_meta(twin.meta) == negate_if(relation, truth)  # recomputed from the twin's scene metadata
    assert twin.answer == twin.meta["answer"] == negate_if(relation, sample.answer)
    assert twin.question == render_question(twin.meta)
    assert x.meta["pair_id"] == twin.meta["pair_id"] and twin.meta["transforms"] == [
        t for t in TRANSFORMS if t in transforms
    ]
    width, height = twin.images[0].size
    assert twin.meta["image_size"] == [width, height]
    for i in twin.meta["refs"]:  # every referenced object stays wholly inside the image
        x0, y0, x1, y1 = twin.meta["objects"][i]["bbox2d"]
        assert 0 <= x0 <= x1 <= width and 0 <= y0 <= y1 <= height


def test_numeric_tasks_take_only_invariant_transforms():
    assert effect("counting", "relation_swap") is None and effect("counting", "order_swap") is None
    assert effect("distance", "relation_swap") is None and effect("distance", "order_swap") == "identity"
    assert {effect("depth", t) for t in ("hflip", "crop", "color_jitter", "template")} == {"identity"}
    assert effect("orientation", "hflip") == "negation"
    counting = next(s for s in POOL if s.meta["spatial_task"] == "counting")
    with pytest.raises(ValueError, match="'relation_swap' does not apply to the 'counting' task"):
        SpatialPairAugmenter().pair(counting, ["relation_swap"], random.Random(0))
    for seed in range(20):
        _, twin = SpatialPairAugmenter(prob=1.0)(counting, random.Random(seed))
        assert twin.meta["relation"] == "identity" and "relation_swap" not in twin.meta["transforms"]


def dot_markers(sample):
    return [m for m in sample.meta["markers"] if m["kind"] == "dot"]


def test_flip_moves_the_marker_pixels_to_the_mirrored_place():
    sample = next(s for s in POOL if s.meta["spatial_task"] == "orientation")
    x, twin = SpatialPairAugmenter().pair(sample, ["hflip"], random.Random(0))
    before, after = np.asarray(x.images[0]), np.asarray(twin.images[0])
    assert np.array_equal(after, before[:, ::-1])
    width = before.shape[1]
    for old, new in zip(dot_markers(x), dot_markers(twin), strict=True):
        assert new["xy"] == [width - old["xy"][0], old["xy"][1]]
        assert tuple(after[int(new["xy"][1]), int(new["xy"][0])]) == MARKER_COLORS[new["color"]]
        assert tuple(before[int(new["xy"][1]), int(new["xy"][0])]) != MARKER_COLORS[new["color"]]
    assert twin.answer != x.answer and twin.question == x.question


@pytest.mark.parametrize("seed", range(6))
def test_crop_keeps_every_referenced_box_inside_and_its_pixels(seed):
    for sample in POOL[seed::6]:
        x, twin = SpatialPairAugmenter().pair(sample, ["crop"], random.Random(seed))
        left = x.meta["K"][0][2] - twin.meta["K"][0][2]
        top = x.meta["K"][1][2] - twin.meta["K"][1][2]
        width, height = twin.images[0].size
        assert left == int(left) and top == int(top) and 0.7 * 96 - 1 <= min(width, height)
        crop = np.asarray(x.images[0])[int(top) : int(top) + height, int(left) : int(left) + width]
        assert np.array_equal(np.asarray(twin.images[0]), crop)
        for old, new in zip(x.meta["objects"], twin.meta["objects"], strict=True):
            assert new["bbox2d"] == [
                old["bbox2d"][0] - left,
                old["bbox2d"][1] - top,
                old["bbox2d"][2] - left,
                old["bbox2d"][3] - top,
            ]
        for marker in dot_markers(twin):
            assert (
                tuple(np.asarray(twin.images[0])[int(marker["xy"][1]), int(marker["xy"][0])])
                == MARKER_COLORS[marker["color"]]
            )
        assert twin.answer == x.answer


def test_label_free_samples_pair_without_answers():
    free = SpatialVQADataset(6, seed=7, image_size=96, labeled=False)
    labeled = SpatialVQADataset(6, seed=7, image_size=96)
    for i in range(len(free)):
        rng_seed = 100 + i
        x, twin = SpatialPairAugmenter(prob=0.7)(free[i], random.Random(rng_seed))
        _, twin_labeled = SpatialPairAugmenter(prob=0.7)(labeled[i], random.Random(rng_seed))
        assert x.answer is None and twin.answer is None and twin.reasoning is None
        assert not (set(twin.meta) | set(x.meta)) & set(LABEL_META_KEYS)
        assert twin.question == twin_labeled.question and twin.meta["relation"] == twin_labeled.meta["relation"]
        assert answer_from_meta(twin.meta) == twin_labeled.answer


def test_augmenter_is_deterministic_for_an_rng_and_validates_its_arguments():
    sample = POOL[0]
    a = SpatialPairAugmenter()(sample, random.Random(3))[1]
    b = SpatialPairAugmenter()(sample, random.Random(3))[1]
    assert a.meta == b.meta and np.array_equal(np.asarray(a.images[0]), np.asarray(b.images[0]))
    with pytest.raises(ValueError, match="prob must be in"):
        SpatialPairAugmenter(prob=1.5)
    with pytest.raises(ValueError, match="unknown transforms"):
        SpatialPairAugmenter(transforms=["rotate"])
    with pytest.raises(ValueError, match="needs spatial samples .* got a 'dots_left_of' sample"):
        SpatialPairAugmenter()(DotsDataset(1, seed=0)[0], random.Random(0))


def test_paired_data_set_feeds_the_consistency_reward():
    module = VisualTaskDataModule(
        dataset=functools.partial(SpatialVQADataset, paired=True, labeled=False),
        train_size=4,
        val_size=2,
        test_size=2,
        batch_size=2,
        image_size=64,
    )
    batch = next(iter(module.train_dataloader()))
    assert len(batch) == 4
    rows = [s for s in batch for _ in range(2)]  # K = 2 completions per prompt
    pairs = pair_groups(rows)
    assert len(pairs) == 2
    # A consistent model: the twin answers what the relation says.
    completions = []
    for (_, _, relation), x in zip(pairs, batch[0::2], strict=True):
        truth = answer_from_meta(x.meta)
        completions += [f"<answer>{truth}</answer>"] * 2 + [f"<answer>{negate_if(relation, truth)}</answer>"] * 2
    assert consistency_rewards(completions, rows).tolist() == [1.0] * 8

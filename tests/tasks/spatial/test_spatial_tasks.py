"""Spatial tasks: filters reject what they should, answers follow the metrics, data sets are balanced and deterministic,
markers sit where the objects project, and label-free samples hold no answer."""

import json
import random

import numpy as np
import pytest

from app.data.shards import LABEL_META_KEYS
from app.tasks.spatial import BOOL_TASKS, SpatialVQADataset, answer_from_meta, build_question
from app.tasks.spatial.geometry import box_center, box_corners, project
from app.tasks.spatial.markers import MARKER_COLORS
from app.tasks.spatial.omni3d import ImageRecord, Object3D
from app.tasks.spatial.tasks import SelectionConfig, candidates, object_reject_reason, pair_reject_reason

K = [[200.0, 0.0, 100.0], [0.0, 200.0, 100.0], [0.0, 0.0, 1.0]]


def obj(category, x, z, dims=(0.5, 0.9, 0.5), box=None, **kwargs):
    """An upright object centred at ``(x, 0.5, z)``; its 2D box is the projection of its 3D box unless given."""
    center = [x, 0.5, z]
    if box is None:
        uv = project(box_corners(center, dims, np.eye(3)), K)
        box = [*uv.min(axis=0).tolist(), *uv.max(axis=0).tolist()]
    return Object3D(category, center, list(dims), np.eye(3).tolist(), bbox2d_tight=box, **kwargs)


def record(*objects):
    return ImageRecord(None, K, 200, 200, list(objects), "hand", "indoor")


# ------------------------------------------------------------------------------------------------------- filters
@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"visibility": 0.2}, "visibility 0.20 below"),
        ({"truncation": 0.8}, "truncation 0.80 above"),
        ({"valid3d": False}, "no usable 3D box"),
        ({"behind_camera": True}, "no usable 3D box"),
        ({"box": [10, 10, 13, 13]}, "2D box too small"),
        ({"box": [0, 0, 200, 190]}, "2D box too large"),
        ({"box": [300, 300, 320, 320]}, "no 2D box inside the image"),
        ({"center_visible": False}, "shows another object"),
    ],
)
def test_object_filters_name_what_fails(kwargs, reason):
    target = obj("chair", 0.0, 3.0, **kwargs)
    assert reason in object_reject_reason(record(target), target)


def test_object_filters_pass_a_clear_object_and_unknown_visibility():
    target = obj("chair", 0.0, 3.0, visibility=None, truncation=None)
    assert object_reject_reason(record(target), target) is None


def test_pair_filters_are_stricter_for_the_same_category():
    meta = lambda category, box: {"category": category, "bbox2d": box}  # noqa: E731
    a, b = [0, 0, 10, 10], [6, 0, 16, 10]  # IoU 0.25
    assert pair_reject_reason(meta("chair", a), meta("table", b)) is None
    assert "IoU 0.25 above 0.15 (same category)" in pair_reject_reason(meta("chair", a), meta("chair", b))
    inside = [2, 2, 5, 5]  # small box wholly inside a big one: low IoU, full coverage
    assert "coverage 1.00" in pair_reject_reason(meta("lamp", inside), meta("sofa", [0, 0, 20, 20]))
    near = meta("lamp", [20, 0, 30, 10]), meta("sofa", [31, 0, 41, 10])  # apart, but centres 11 px apart
    assert pair_reject_reason(*near) is None
    assert "markers would touch" in pair_reject_reason(*near, image_side=200)


def test_depth_needs_a_minimum_gap():
    close = record(obj("chair", -1.0, 3.0), obj("table", 1.0, 3.1))
    far = record(obj("chair", -1.0, 3.0), obj("table", 1.0, 5.0))
    assert candidates(close, "depth") == []
    assert [c.objects for c in candidates(far, "depth")] == [(0, 1)]


def test_orientation_needs_separated_centres_and_size_a_volume_ratio():
    stacked = record(obj("chair", 0.0, 3.0), obj("table", 0.05, 6.0))
    assert candidates(stacked, "orientation") == []
    similar = record(obj("chair", -1.0, 3.0, dims=(0.5, 0.9, 0.5)), obj("chair", 1.0, 3.0, dims=(0.55, 0.9, 0.5)))
    assert candidates(similar, "size") == []
    assert len(candidates(similar, "orientation")) == 1


def test_relative_distance_picks_the_anchor_with_the_largest_gap():
    scene = record(
        obj("chair", -1.5, 4.0), obj("table", 1.5, 4.0), obj("lamp", -1.5, 6.5), obj("sofa", 0.0, 7.0, dims=(1, 1, 1))
    )
    triples = {c.objects[:2]: c.objects[2] for c in candidates(scene, "relative_distance")}
    assert triples[(0, 1)] == 2  # the lamp is much nearer the chair than the table; the sofa is equidistant


def test_counting_skips_categories_with_a_hidden_instance():
    chairs = [obj("chair", x, 3.0) for x in (-1.0, 0.0, 1.0)]
    assert [len(c.objects) for c in candidates(record(*chairs), "counting")] == [3]
    chairs[1] = obj("chair", 0.0, 3.0, visibility=0.1)
    assert candidates(record(*chairs), "counting") == []


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="unknown spatial task 'height'"):
        candidates(record(), "height")


# ------------------------------------------------------------------------------------------------------- answers
@pytest.mark.parametrize(
    ("task", "phrase0_means"),
    [("orientation", "chair left"), ("depth", "chair closer"), ("size", "table bigger")],
)
def test_answers_follow_the_metric_and_the_phrase(task, phrase0_means):
    # chair: left, near, small; table: right, far, big
    scene = record(obj("chair", -1.0, 3.0), obj("table", 1.0, 5.0, dims=(1.2, 0.75, 0.8)))
    for answer in ("yes", "no"):
        meta = build_question(scene, task, random.Random(answer), answer)
        first = meta["objects"][meta["refs"][0]]["category"]
        phrase0_true = (first == phrase0_means.split()[0]) == (meta["phrase_id"] == 0)
        assert meta["answer"] == answer == ("yes" if phrase0_true else "no")


def test_numeric_answers():
    scene = record(obj("chair", -1.0, 3.0), obj("table", 0.5, 3.0), obj("table", 2.2, 5.0))
    distance = build_question(scene, "distance", random.Random(0))
    a, b = (distance["objects"][i]["center_cam"] for i in distance["refs"])
    assert distance["answer"] == f"{np.linalg.norm(np.subtract(a, b)):.1f}" and distance["answer_type"] == "distance"
    counting = build_question(scene, "counting", random.Random(0), "2")
    assert counting["answer"] == "2" and counting["answer_type"] == "count" and counting["markers"] == []
    assert build_question(scene, "counting", random.Random(0), "4") is None


# ---------------------------------------------------------------------------------------------------- data sets
def test_answers_are_balanced_exactly_per_task_and_domain():
    dataset = SpatialVQADataset(32, seed=3, image_size=64, domain="both")
    by_key = {}
    for i in range(len(dataset)):
        task, domain, answer = dataset.spec(i)
        by_key.setdefault((task, domain), []).append(answer)
    assert len(by_key) == 8
    assert all(answers.count("yes") == answers.count("no") == 2 for answers in by_key.values())
    assert [dataset[i].answer for i in range(8)] == [dataset.spec(i)[2] for i in range(8)]


def test_counts_cycle_through_two_to_five():
    dataset = SpatialVQADataset(8, seed=0, image_size=64, tasks=["counting"])
    assert sorted(dataset.spec(i)[2] for i in range(8)) == ["2", "2", "3", "3", "4", "4", "5", "5"]
    assert dataset[0].answer == dataset.spec(0)[2]


def test_samples_are_deterministic_and_json_ready():
    a, b = SpatialVQADataset(4, seed=1, image_size=64)[2], SpatialVQADataset(4, seed=1, image_size=64)[2]
    assert np.array_equal(np.asarray(a.images[0]), np.asarray(b.images[0]))
    assert (a.question, a.answer, a.meta) == (b.question, b.answer, b.meta)
    assert json.loads(json.dumps(a.meta, allow_nan=False)) == a.meta
    other = SpatialVQADataset(4, seed=2, image_size=64)[2]
    assert not np.array_equal(np.asarray(a.images[0]), np.asarray(other.images[0]))


@pytest.mark.parametrize("index", range(8))
def test_markers_sit_where_the_objects_project(index):
    dataset = SpatialVQADataset(8, seed=4, image_size=128, domain="both")
    sample = dataset[index]
    meta, pixels = sample.meta, np.asarray(sample.images[0])
    assert sample.task == f"spatial_{meta['spatial_task']}"
    assert {m["object"] for m in meta["markers"]} == set(meta["refs"])
    for marker in meta["markers"]:
        target = meta["objects"][marker["object"]]
        colour = MARKER_COLORS[marker["color"]]
        assert marker["color"] in sample.question and target["category"] in sample.question
        corners = box_corners(target["center_cam"], target["dimensions"], target["R_cam"])
        uv = project(corners, meta["K"])
        if marker["kind"] == "dot":
            x, y = marker["xy"]
            assert (x, y) == box_center(target["bbox2d"])
            assert uv[:, 0].min() - 1 <= x <= uv[:, 0].max() + 1 and uv[:, 1].min() - 1 <= y <= uv[:, 1].max() + 1
            assert tuple(pixels[int(y), int(x)]) == colour
        else:
            x0, y0, x1, y1 = (round(c) for c in marker["box"])
            assert marker["box"] == target["bbox2d"]
            assert tuple(pixels[(y0 + y1) // 2, x0]) == colour and tuple(pixels[y0, (x0 + x1) // 2]) == colour
    assert meta["spatial_task"] in BOOL_TASKS and answer_from_meta(meta) == sample.answer


def test_label_free_samples_hold_no_answer():
    labeled = SpatialVQADataset(4, seed=5, image_size=64)[1]
    free = SpatialVQADataset(4, seed=5, image_size=64, labeled=False)[1]
    assert free.answer is None and free.reasoning is None
    assert not set(free.meta) & set(LABEL_META_KEYS)
    assert free.question == labeled.question
    assert np.array_equal(np.asarray(free.images[0]), np.asarray(labeled.images[0]))
    assert answer_from_meta(free.meta) == labeled.answer  # scene metadata still suffices for verifiers


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="tasks must be a non-empty subset"):
        SpatialVQADataset(2, seed=0, tasks=["height"])
    with pytest.raises(ValueError, match="domain must be one of"):
        SpatialVQADataset(2, seed=0, domain="moon")
    with pytest.raises(IndexError, match="out of range"):
        SpatialVQADataset(2, seed=0)[2]
    with pytest.raises(ValueError, match="answer of a boolean task must be 'yes', 'no'"):
        build_question(record(obj("chair", -1.0, 3.0), obj("table", 1.0, 5.0)), "depth", random.Random(0), "maybe")


def test_config_thresholds_change_what_passes():
    scene = record(obj("chair", -1.0, 3.0), obj("table", 1.0, 3.5))
    assert candidates(scene, "depth") != []
    assert candidates(scene, "depth", SelectionConfig(min_depth_gap=(1.0, 0.1))) == []

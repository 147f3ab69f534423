"""Omni3D input and the ``spatial`` data CLI: a real-format file loads unchanged and yields questions, malformed files
fail with errors that name the entry and field, and shards (labeled or label-free) round-trip into the augmenter."""

import copy
import json
import random

import numpy as np
import pytest
from PIL import Image

from app.data.shards import LABEL_META_KEYS, read_samples
from app.tasks.__main__ import main
from app.tasks.spatial import (
    BOOL_TASKS,
    SpatialPairAugmenter,
    answer_from_meta,
    load_omni3d,
    omni3d_samples,
    parse_omni3d,
)
from app.tasks.spatial.geometry import box_corners, project

K = [[500.0, 0.0, 320.0], [0.0, 500.0, 240.0], [0.0, 0.0, 1.0]]
FILE_PATH = "SUNRGBD/kv1/NYUdata/NYU0001/image/NYU0001.jpg"


def annotation(ann_id, category_id, name, center, dims, **overrides):
    """An annotation as Omni3D writes it (boxes projected from the 3D box, the extra fields it carries)."""
    uv = project(box_corners(center, dims, np.eye(3)), K)
    proj = [*uv.min(axis=0).tolist(), *uv.max(axis=0).tolist()]
    entry = {
        "id": ann_id,
        "image_id": 10,
        "category_id": category_id,
        "category_name": name,
        "valid3D": True,
        "bbox2D_tight": [proj[0] + 2, proj[1] + 2, proj[2] - 2, proj[3] - 2],
        "bbox2D_proj": proj,
        "bbox2D_trunc": [max(proj[0], 0), max(proj[1], 0), min(proj[2], 640), min(proj[3], 480)],
        "bbox3D_cam": box_corners(center, dims, np.eye(3)).tolist(),
        "center_cam": list(center),
        "dimensions": list(dims),
        "R_cam": np.eye(3).tolist(),
        "behind_camera": False,
        "visibility": 0.95,
        "truncation": 0.0,
        "segmentation_pts": -1,
        "lidar_pts": -1,
        "depth_error": -1,
    }
    entry.update(overrides)
    return entry


def omni3d_document():
    return {
        "info": {"id": 3, "source": "SUNRGBD", "name": "SUNRGBD Train", "split": "Train", "version": "0.1"},
        "images": [
            {
                "width": 640,
                "height": 480,
                "file_path": FILE_PATH,
                "K": K,
                "src_90_rotate": 0,
                "src_flagged": False,
                "id": 10,
                "dataset_id": 3,
            }
        ],
        "categories": [
            {"id": 1, "name": "chair", "supercategory": ""},
            {"id": 2, "name": "table", "supercategory": ""},
            {"id": 3, "name": "sofa", "supercategory": ""},
            {"id": 4, "name": "lamp", "supercategory": ""},
            {"id": 5, "name": "bookcase", "supercategory": ""},
        ],
        "annotations": [
            annotation(0, 1, "chair", (-1.2, 0.6, 3.0), (0.5, 0.9, 0.5)),
            annotation(1, 2, "table", (1.0, 0.8, 4.5), (1.2, 0.75, 0.8)),
            annotation(2, 3, "sofa", (0.0, 0.6, 7.0), (2.0, 0.85, 0.9), visibility=-1),
            annotation(3, 5, "bookcase", (2.6, 0.0, 6.0), (0.8, 1.8, 0.4), bbox2D_tight=[-1, -1, -1, -1]),
            annotation(4, 4, "lamp", (-2.0, 0.0, 5.0), (-1, -1, -1), valid3D=False),
            annotation(5, 1, "chair", (0.4, 0.6, 2.0), (0.5, 0.9, 0.5), behind_camera=True),
        ],
    }


@pytest.fixture
def omni3d_files(tmp_path):
    path = tmp_path / "SUNRGBD_train.json"
    path.write_text(json.dumps(omni3d_document()))
    image_root = tmp_path / "datasets"
    (image_root / FILE_PATH).parent.mkdir(parents=True)
    Image.new("RGB", (640, 480), (120, 110, 100)).save(image_root / FILE_PATH)
    return path, image_root


def test_real_format_file_loads_unchanged(omni3d_files):
    path, _ = omni3d_files
    (record,) = load_omni3d(path, domain="indoor")
    assert (record.width, record.height, record.image, record.source_id) == (640, 480, FILE_PATH, 10)
    chair, table, sofa, bookcase, lamp, hidden_chair = record.objects
    assert [o.category for o in record.objects] == ["chair", "table", "sofa", "bookcase", "lamp", "chair"]
    assert chair.center == [-1.2, 0.6, 3.0] and chair.usable_3d and chair.visibility == 0.95
    assert sofa.visibility is None  # -1: unknown
    assert bookcase.bbox2d_tight is None and record.box2d(bookcase) == bookcase.bbox2d_trunc  # falls back
    assert not lamp.usable_3d and not hidden_chair.usable_3d


def test_real_format_file_yields_questions_about_valid_objects_only(omni3d_files):
    path, image_root = omni3d_files
    records = load_omni3d(path, domain="indoor")
    samples = list(omni3d_samples(records, 8, seed=0, tasks=BOOL_TASKS, image_root=image_root))
    assert [s.meta["spatial_task"] for s in samples] == list(BOOL_TASKS) * 2
    for task in BOOL_TASKS:
        assert sorted(s.answer for s in samples if s.meta["spatial_task"] == task) == ["no", "yes"]
    for sample in samples:
        assert sample.images[0].size == (640, 480)
        assert {o["annotation_id"] for o in sample.meta["objects"]} <= {0, 1, 2, 3}  # never the lamp or hidden chair
        assert answer_from_meta(sample.meta) == sample.answer and sample.meta["source_id"] == 10
        assert "?" in sample.question and all(m["color"] in sample.question for m in sample.meta["markers"])
    counting = list(omni3d_samples(records, 1, seed=0, tasks=["distance"], image_root=image_root))
    assert float(counting[0].answer) > 0


def test_missing_images_and_tasks_without_questions_are_named(omni3d_files, tmp_path):
    path, _ = omni3d_files
    records = load_omni3d(path)
    with pytest.raises(FileNotFoundError, match="not found: .*NYU0001.jpg"):
        next(omni3d_samples(records, 1, seed=0, image_root=tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="yields a 'counting' question"):
        next(omni3d_samples(records, 1, seed=0, tasks=["counting"]))


def broken(edit):
    document = omni3d_document()
    edit(document)
    return document


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("images"), "missing the field 'images'"),
        (
            lambda d: d["images"][0].update(K=[[1, 0, 0], [0, 1, 0]]),
            r"images\[0\]\['K'\] must have shape \[3, 3\], got \[2, 3\]",
        ),
        (lambda d: d["images"][0].pop("width"), r"images\[0\] is missing the field 'width'"),
        (lambda d: d["annotations"][1].pop("center_cam"), r"annotations\[1\] is missing the field 'center_cam'"),
        (lambda d: d["annotations"][0].update(image_id=99), r"annotations\[0\] refers to image_id 99"),
        (lambda d: d["annotations"][2].update(R_cam="identity"), r"annotations\[2\]\['R_cam'\] must be numbers"),
        (lambda d: d["annotations"][0].update(visibility="high"), r"annotations\[0\]\['visibility'\] must be a number"),
        (
            lambda d: (d["annotations"][0].update(category_id=42), d["annotations"][0].pop("category_name")),
            r"annotations\[0\] has category_id 42, which is not in 'categories'",
        ),
        (lambda d: d["images"].append(copy.deepcopy(d["images"][0])), r"images\[1\] repeats the image id 10"),
    ],
)
def test_malformed_documents_raise_naming_the_entry_and_field(edit, message):
    with pytest.raises(ValueError, match=message):
        parse_omni3d(broken(edit))


def test_non_json_file_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        load_omni3d(path)


def test_cli_writes_label_free_shards_that_pair_without_answers(tmp_path):
    main(
        [
            "spatial",
            "--out",
            str(tmp_path / "free"),
            "--num",
            "8",
            "--seed",
            "0",
            "--image-size",
            "64",
            "--strip-labels",
            "--max-per-shard",
            "4",
        ]
    )
    shards = sorted((tmp_path / "free").glob("spatial-*.tar"))
    assert len(shards) == 2
    samples = list(read_samples([str(p) for p in shards]))
    assert len(samples) == 8
    for sample in samples:
        assert sample.answer is None and sample.reasoning is None and not set(sample.meta) & set(LABEL_META_KEYS)
        x, twin = SpatialPairAugmenter(prob=1.0)(sample, random.Random(0))  # works on decoded JSON meta
        assert twin.meta["pair_id"] == x.meta["pair_id"] and twin.answer is None


def test_cli_labeled_shards_are_balanced_and_omni3d_input_works(tmp_path, omni3d_files):
    main(
        [
            "spatial",
            "--out",
            str(tmp_path / "lab"),
            "--num",
            "8",
            "--seed",
            "0",
            "--image-size",
            "64",
            "--domain",
            "outdoor",
        ]
    )
    samples = list(read_samples(str(tmp_path / "lab" / "spatial-000000.tar")))
    assert sorted(s.answer for s in samples) == ["no"] * 4 + ["yes"] * 4
    assert all(answer_from_meta(s.meta) == s.answer and s.meta["domain"] == "outdoor" for s in samples)
    path, image_root = omni3d_files
    main(
        [
            "spatial",
            "--out",
            str(tmp_path / "real"),
            "--num",
            "4",
            "--omni3d",
            str(path),
            "--image-root",
            str(image_root),
            "--tasks",
            "depth",
            "size",
        ]
    )
    real = list(read_samples(str(tmp_path / "real" / "spatial-000000.tar")))
    assert [s.meta["spatial_task"] for s in real] == ["depth", "size"] * 2 and real[0].images[0].size == (640, 480)

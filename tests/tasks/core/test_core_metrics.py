"""CoRe metric extraction experts on hand-built annotations with known values."""

import math

import numpy as np
import pytest
from PIL import Image

from app.tasks.core import Box2D, ImageAnnotation, Object3D, measure
from app.tasks.core.metrics import count_instances, ego_distance, median_depth, spatial_relation


def test_count_instances():
    assert count_instances([[10.0, 5.0], [3.0, 4.0], [7.5, 8.5]]) == 3
    assert count_instances(np.zeros((5, 2))) == 5
    assert count_instances([]) == 0
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        count_instances([1.0, 2.0, 3.0])


def test_median_depth_over_mask_and_box():
    depth = np.full((8, 10), 9.0, dtype=np.float32)
    depth[2:5, 3:6] = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 100.0]]
    mask = np.zeros((8, 10), dtype=bool)
    mask[2:5, 3:6] = True
    assert median_depth(depth, mask) == 5.0
    assert median_depth(depth, (3, 2, 6, 5)) == 5.0  # the same region as a box, x1 / y1 exclusive
    assert median_depth(depth, (3, 2, 5, 4)) == 3.0  # [1, 2, 4, 5]
    assert median_depth(depth, (-5, -5, 1, 1)) == 9.0  # clipped to the image


def test_median_depth_skips_invalid_pixels():
    depth = np.array([[0.0, np.nan, 4.0], [np.inf, 6.0, 0.0]], dtype=np.float32)
    assert median_depth(depth, np.ones((2, 3), dtype=bool)) == 5.0
    assert median_depth(depth, (0, 0, 1, 1)) is None  # only a 0 (invalid) pixel
    with pytest.raises(ValueError, match="does not match"):
        median_depth(depth, np.ones((3, 3), dtype=bool))
    with pytest.raises(ValueError, match="bool mask"):
        median_depth(depth, (0, 0, 1))


def test_ego_distance():
    objects = [Object3D("yellow cube", (3.0, -4.0, 12.0), (1, 1, 1)), Object3D("blue ball", (0.0, 1.0, 2.0), (1, 1, 1))]
    assert ego_distance(objects, "yellow cube") == pytest.approx(13.0)
    assert ego_distance(objects, "blue ball") == pytest.approx(math.sqrt(5.0))
    assert ego_distance(objects, "green ball") is None
    assert ego_distance(objects + [Object3D("blue ball", (1, 1, 1), (1, 1, 1))], "blue ball") is None  # not unique


@pytest.mark.parametrize(
    ("subject_box", "relation"),
    [
        ((0, 40, 20, 60), "left"),  # overlaps the reference vertically, ends 10 px before it starts
        ((60, 40, 80, 60), "right"),
        ((30, 0, 50, 20), "above"),
        ((30, 70, 50, 90), "below"),
        ((0, 0, 20, 20), None),  # diagonal: left and above both hold
        ((25, 45, 45, 65), None),  # overlapping boxes
        ((10, 40, 29, 60), None),  # left by only 1 px, under the 2 px margin
    ],
)
def test_spatial_relation(subject_box, relation):
    boxes = [Box2D("green cube", (30, 40, 50, 60)), Box2D("white ball", subject_box), Box2D("blue cube", (0, 0, 5, 5))]
    assert spatial_relation(boxes, "white ball", "green cube") == relation


def test_spatial_relation_needs_both_objects_once():
    boxes = [Box2D("green cube", (30, 40, 50, 60)), Box2D("white ball", (0, 40, 20, 60))]
    assert spatial_relation(boxes, "white ball", "purple cube") is None
    assert spatial_relation(boxes + [Box2D("white ball", (60, 0, 70, 10))], "white ball", "green cube") is None


def test_measure_dispatches_on_the_task():
    depth = np.full((4, 4), 2.5, dtype=np.float32)
    annotation = ImageAnnotation(
        image=Image.new("RGB", (4, 4)),
        points=[(1.0, 1.0), (2.0, 2.0)],
        depth=depth,
        region=(0, 0, 2, 2),
        objects=[Object3D("white ball", (0.0, 0.0, 4.0), (1, 1, 1))],
        boxes=[Box2D("white ball", (0, 0, 1, 1)), Box2D("green cube", (0, 3, 1, 4))],
    )
    assert measure("counting", annotation) == 2
    assert measure("depth", annotation) == 2.5
    assert measure("distance", annotation, "white ball") == 4.0
    assert measure("spatial", annotation, "white ball", "green cube") == "above"
    with pytest.raises(ValueError, match="unknown CoRe task 'size'"):
        measure("size", annotation)
    with pytest.raises(ValueError, match="annotation.region"):
        measure("depth", ImageAnnotation(image=annotation.image, depth=depth))

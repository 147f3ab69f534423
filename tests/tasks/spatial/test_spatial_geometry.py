"""3D box geometry: corners, metrics, pinhole projection, 2D overlaps, and what flips and crops do to them."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.tasks.spatial.geometry import (
    box_corners,
    box_volume,
    center_distance,
    clip_box,
    coverage,
    flip_box,
    flip_intrinsics,
    flip_pose,
    iou,
    min_depth,
    project,
    shift_box,
    shift_intrinsics,
)
from app.tasks.spatial.scenes import rotation_x, rotation_y

K = np.array([[100.0, 0.0, 50.0], [0.0, 120.0, 40.0], [0.0, 0.0, 1.0]])


def test_projection_values():
    uv = project(np.array([[1.0, 2.0, 4.0], [0.0, 0.0, 10.0]]), K)
    np.testing.assert_allclose(uv, [[75.0, 100.0], [50.0, 40.0]])


def test_projection_rejects_points_behind_the_camera():
    with pytest.raises(ValueError, match="behind the camera"):
        project(np.array([[0.0, 0.0, -1.0]]), K)


def test_corners_of_an_axis_aligned_box():
    corners = box_corners([1.0, 0.5, 4.0], [2.0, 1.0, 3.0], np.eye(3))
    assert corners.shape == (8, 3)
    np.testing.assert_allclose(corners.min(axis=0), [0.0, 0.0, 2.5])
    np.testing.assert_allclose(corners.max(axis=0), [2.0, 1.0, 5.5])
    assert len({tuple(c) for c in corners}) == 8


def test_yaw_by_90_degrees_swaps_width_and_length_extents():
    corners = box_corners([0.0, 0.0, 5.0], [2.0, 1.0, 4.0], rotation_y(math.pi / 2))
    extent = corners.max(axis=0) - corners.min(axis=0)
    np.testing.assert_allclose(extent, [4.0, 1.0, 2.0], atol=1e-12)


def test_min_depth_is_the_nearest_corner_not_the_centre():
    assert min_depth([0.0, 0.0, 5.0], [2.0, 1.0, 4.0], np.eye(3)) == pytest.approx(3.0)
    # rotated 45 degrees about y: the nearest corner is half the footprint diagonal in front of the centre
    assert min_depth([0.0, 0.0, 5.0], [2.0, 2.0, 2.0], rotation_y(math.pi / 4)) == pytest.approx(5.0 - math.sqrt(2))


def test_volume_and_distance():
    assert box_volume([0.5, 2.0, 3.0]) == pytest.approx(3.0)
    assert center_distance([0, 0, 0], [3, 4, 0]) == pytest.approx(5.0)


def test_iou_and_coverage():
    a, b = [0, 0, 10, 10], [5, 0, 15, 10]
    assert iou(a, b) == pytest.approx(50 / 150)
    small, big = [2, 2, 4, 4], [0, 0, 10, 10]
    assert coverage(small, big) == pytest.approx(1.0)
    assert coverage(big, small) == pytest.approx(0.04)
    assert iou(a, [20, 20, 30, 30]) == 0.0


def test_clip_box():
    assert clip_box([-5, 2, 30, 8], 20, 10) == [0.0, 2.0, 20.0, 8.0]
    assert clip_box([25, 2, 30, 8], 20, 10) is None


poses = st.tuples(
    st.floats(-3, 3), st.floats(-1, 1), st.floats(4, 10), st.floats(-math.pi, math.pi), st.floats(-0.3, 0.3)
)


@given(pose=poses, dims=st.tuples(st.floats(0.2, 2), st.floats(0.2, 2), st.floats(0.2, 2)))
@settings(max_examples=60, deadline=None)
def test_flip_mirrors_the_projection_and_keeps_the_metrics(pose, dims):
    x, y, z, yaw, pitch = pose
    rotation = rotation_x(pitch) @ rotation_y(yaw)
    width = 100.0
    corners = box_corners([x, y, z], dims, rotation)
    center2, rotation2 = flip_pose([x, y, z], rotation)
    corners2 = box_corners(center2, dims, rotation2)
    np.testing.assert_allclose(np.linalg.det(rotation2), 1.0)  # still a rotation
    uv, uv2 = project(corners, K), project(corners2, flip_intrinsics(K, width))
    # the flipped corner set is the mirrored corner set: compare sorted projections
    mirrored = np.stack([width - uv[:, 0], uv[:, 1]], axis=1)
    np.testing.assert_allclose(np.sort(uv2, axis=0), np.sort(mirrored, axis=0), atol=1e-9)
    assert min_depth(center2, dims, rotation2) == pytest.approx(min_depth([x, y, z], dims, rotation))
    box = [uv[:, 0].min(), uv[:, 1].min(), uv[:, 0].max(), uv[:, 1].max()]
    box2 = [uv2[:, 0].min(), uv2[:, 1].min(), uv2[:, 0].max(), uv2[:, 1].max()]
    np.testing.assert_allclose(flip_box(box, width), box2, atol=1e-9)


def test_crop_shifts_projections_by_the_crop_corner():
    points = np.array([[0.3, -0.2, 3.0], [1.0, 0.4, 6.0]])
    np.testing.assert_allclose(project(points, shift_intrinsics(K, 7, 11)), project(points, K) - [7, 11])
    assert shift_box([10, 20, 30, 40], 7, 11) == [3, 9, 23, 29]

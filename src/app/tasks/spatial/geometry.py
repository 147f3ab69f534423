"""3D box geometry in the Omni3D camera frame (OT-GRPO, Appendix D.1-D.2, docs/algorithms.md#papers): x right, y down, z
forward, metres.

A box is ``center`` ``[3]``, ``dimensions`` ``[w, h, l]`` and a rotation ``R`` ``[3, 3]`` (object -> camera) as in
Omni3D: the object's local x extent is ``w``, y is ``h`` and z is ``l``, so the corners are
``center + R @ (s * dimensions / 2)`` for the eight sign vectors ``s``. Corner ``i`` has signs from the bits of ``i``
(x: bit 2, y: bit 1, z: bit 0; 0 -> minus), which :data:`FACES` indexes.

2D boxes are ``[x0, y0, x1, y1]`` in continuous pixel coordinates: pixel ``(i, j)`` covers ``[i, i + 1) x [j, j + 1)``,
so mirroring an image of width W maps ``x -> W - x`` and a pinhole camera ``K`` with principal point ``cx`` to one with
``W - cx``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Box2D = Sequence[float]
"""``[x0, y0, x1, y1]`` pixels, ``x0 <= x1`` and ``y0 <= y1``."""

_SIGNS = np.array([[(i >> 2) & 1, (i >> 1) & 1, i & 1] for i in range(8)], dtype=np.float64) * 2 - 1  # [8, 3]
FACES = (
    ((0, 1, 3, 2), (-1, 0, 0)),
    ((4, 5, 7, 6), (1, 0, 0)),
    ((0, 1, 5, 4), (0, -1, 0)),
    ((2, 3, 7, 6), (0, 1, 0)),
    ((0, 2, 6, 4), (0, 0, -1)),
    ((1, 3, 7, 5), (0, 0, 1)),
)
"""The six faces of a box: corner indices in cyclic order and the outward normal in the object frame."""

MIRROR_X = np.diag([-1.0, 1.0, 1.0])
"""Reflection of the camera frame across its y-z plane: what a horizontal image flip does to the 3D scene."""


def box_corners(center: Sequence[float], dimensions: Sequence[float], rotation: np.ndarray | Sequence) -> np.ndarray:
    """``[8, 3]`` corners of a 3D box in camera coordinates (see the module docstring for their order)."""
    half = _SIGNS * (np.asarray(dimensions, dtype=np.float64) / 2)  # [8, 3]
    return np.asarray(center, dtype=np.float64) + half @ np.asarray(rotation, dtype=np.float64).T


def box_volume(dimensions: Sequence[float]) -> float:
    """``w * h * l`` in cubic metres (the size task's metric, Appendix D.2)."""
    width, height, length = (float(d) for d in dimensions)
    return width * height * length


def min_depth(center: Sequence[float], dimensions: Sequence[float], rotation: np.ndarray | Sequence) -> float:
    """The smallest z over the eight corners: the depth task's metric, which handles objects reaching toward the
    camera better than the centre's z (Appendix D.2)."""
    return float(box_corners(center, dimensions, rotation)[:, 2].min())


def center_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """Euclidean distance between two 3D centres, in metres."""
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)))


def project(points: np.ndarray, K: np.ndarray | Sequence) -> np.ndarray:
    """``[N, 2]`` pixel coordinates of ``[N, 3]`` camera-frame points (all with ``z > 0``) through intrinsics ``K``."""
    points = np.asarray(points, dtype=np.float64)
    if np.any(points[:, 2] <= 0):
        raise ValueError("cannot project points at or behind the camera plane (z <= 0)")
    uvw = points @ np.asarray(K, dtype=np.float64).T  # [N, 3]
    return uvw[:, :2] / uvw[:, 2:3]


def bounds(points_2d: np.ndarray) -> list[float]:
    """The axis-aligned box ``[x0, y0, x1, y1]`` around ``[N, 2]`` points."""
    lo, hi = points_2d.min(axis=0), points_2d.max(axis=0)
    return [float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1])]


def clip_box(box: Box2D, width: float, height: float) -> list[float] | None:
    """``box`` clipped to the image ``[0, width] x [0, height]``; None when nothing of it is inside."""
    x0, y0 = max(float(box[0]), 0.0), max(float(box[1]), 0.0)
    x1, y1 = min(float(box[2]), float(width)), min(float(box[3]), float(height))
    return [x0, y0, x1, y1] if x1 > x0 and y1 > y0 else None


def box_area(box: Box2D) -> float:
    return max(0.0, float(box[2]) - float(box[0])) * max(0.0, float(box[3]) - float(box[1]))


def box_center(box: Box2D) -> tuple[float, float]:
    return (float(box[0]) + float(box[2])) / 2, (float(box[1]) + float(box[3])) / 2


def intersection_area(a: Box2D, b: Box2D) -> float:
    w = min(float(a[2]), float(b[2])) - max(float(a[0]), float(b[0]))
    h = min(float(a[3]), float(b[3])) - max(float(a[1]), float(b[1]))
    return max(0.0, w) * max(0.0, h)


def iou(a: Box2D, b: Box2D) -> float:
    """Intersection over union of two 2D boxes (0 when both are empty)."""
    inter = intersection_area(a, b)
    union = box_area(a) + box_area(b) - inter
    return inter / union if union > 0 else 0.0


def coverage(a: Box2D, b: Box2D) -> float:
    """The fraction of ``a``'s area inside ``b`` (Appendix D.3's "coverage"); 0 for an empty ``a``."""
    area = box_area(a)
    return intersection_area(a, b) / area if area > 0 else 0.0


def union_box(boxes: Sequence[Box2D]) -> list[float]:
    """The smallest box holding every box of ``boxes`` (at least one)."""
    if not boxes:
        raise ValueError("union_box needs at least one box")
    return [
        min(float(b[0]) for b in boxes),
        min(float(b[1]) for b in boxes),
        max(float(b[2]) for b in boxes),
        max(float(b[3]) for b in boxes),
    ]


# ---------------------------------------------------------------------------------- what image transforms do to them
def flip_box(box: Box2D, width: float) -> list[float]:
    """A 2D box after mirroring an image of ``width`` pixels left-right."""
    return [width - float(box[2]), float(box[1]), width - float(box[0]), float(box[3])]


def flip_pose(center: Sequence[float], rotation: np.ndarray | Sequence) -> tuple[list[float], list[list[float]]]:
    """A 3D box's centre and rotation after mirroring the image: ``x -> -x``, ``R -> M R M`` with ``M`` the mirror.

    ``M R M`` is again a rotation, and since ``M`` permutes the corner signs the flipped box's corners are exactly the
    mirrored corners; depths, volumes and distances are unchanged.
    """
    center = np.asarray(center, dtype=np.float64)
    rotation = np.asarray(rotation, dtype=np.float64)
    return (MIRROR_X @ center).tolist(), (MIRROR_X @ rotation @ MIRROR_X).tolist()


def flip_intrinsics(K: np.ndarray | Sequence, width: float) -> list[list[float]]:
    """Intrinsics after mirroring the image: ``cx -> width - cx`` and the skew changes sign."""
    K = np.array(K, dtype=np.float64)
    K[0, 1], K[0, 2] = -K[0, 1], width - K[0, 2]
    return K.tolist()


def shift_box(box: Box2D, dx: float, dy: float) -> list[float]:
    """A 2D box after cropping the image at top-left corner ``(dx, dy)``."""
    return [float(box[0]) - dx, float(box[1]) - dy, float(box[2]) - dx, float(box[3]) - dy]


def shift_intrinsics(K: np.ndarray | Sequence, dx: float, dy: float) -> list[list[float]]:
    """Intrinsics after cropping the image at top-left corner ``(dx, dy)``: the principal point moves."""
    K = np.array(K, dtype=np.float64)
    K[0, 2] -= dx
    K[1, 2] -= dy
    return K.tolist()

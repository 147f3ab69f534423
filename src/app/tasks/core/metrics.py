"""Metric Extraction Experts ``f_m(I_k, A_k) -> v_k`` of CoRe (CoRe section 3.2, docs/algorithms.md#papers): small pure
functions from one image's annotations (:mod:`app.tasks.core.annotations`) to the value its task compares.

- counting: the number of instance points of a crowd annotation;
- depth: the median of the depth map over the queried region (a box or a mask), invalid pixels (0, non-finite) left out;
- distance: the Euclidean norm of the object's camera-frame centre (ego-to-object distance);
- spatial: the relation of a subject to a reference object in the picture, from their 2D boxes: ``"left"``,
  ``"right"``, ``"above"`` or ``"below"``.

An expert returns ``None`` when the annotation does not define the value (no valid depth in the region, the object
missing or not unique, boxes that overlap or sit diagonally); quality control then rejects the triplet. Malformed input
(wrong shapes) raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.tasks.core.annotations import Box2D, ImageAnnotation, Object3D

RELATIONS = ("left", "right", "above", "below")
"""Spatial relation labels, read "the subject is <label> the reference" (left of, right of, above, below)."""
TASKS = ("counting", "depth", "distance", "spatial")
"""The four CoRe task dimensions."""


def count_instances(points: Sequence[Sequence[float]] | np.ndarray) -> int:
    """Counting: one instance per annotated point (``[N, 2]`` pixel points)."""
    array = np.asarray(points, dtype=float)
    if array.size == 0:
        return 0
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(f"crowd points must be [N, 2] (x, y) pixel points, got shape {array.shape}")
    return int(array.shape[0])


def median_depth(depth: np.ndarray, region: np.ndarray | Sequence[float]) -> float | None:
    """Depth: the median depth (metres) of ``depth`` ``[H, W]`` over ``region``, a bool mask ``[H, W]`` or a box
    ``(x0, y0, x1, y1)`` in pixels (``x1``, ``y1`` exclusive; clipped to the image). ``None`` if no valid pixel."""
    depth = np.asarray(depth)
    if depth.ndim != 2:
        raise ValueError(f"depth map must be [H, W], got shape {depth.shape}")
    region = np.asarray(region)
    if region.dtype == bool:
        if region.shape != depth.shape:
            raise ValueError(f"region mask shape {region.shape} does not match the depth map {depth.shape}")
        values = depth[region]
    elif region.shape == (4,):
        h, w = depth.shape
        x0, y0, x1, y1 = (int(round(float(v))) for v in region)
        values = depth[max(0, y0) : min(h, y1), max(0, x0) : min(w, x1)].ravel()
    else:
        raise ValueError(f"region must be a bool mask [H, W] or a box (x0, y0, x1, y1), got shape {region.shape}")
    values = values[np.isfinite(values) & (values > 0)]
    return float(np.median(values)) if values.size else None


def _unique(items: Sequence, category: str):
    matches = [item for item in items if item.category == category]
    return matches[0] if len(matches) == 1 else None


def ego_distance(objects: Sequence[Object3D], category: str) -> float | None:
    """Distance: ``||centre||`` (metres) of the one object of ``category`` (camera at the origin); ``None`` if there is
    no such object or more than one."""
    obj = _unique(objects, category)
    return None if obj is None else float(np.linalg.norm(np.asarray(obj.center, dtype=float)))


def spatial_relation(boxes: Sequence[Box2D], subject: str, reference: str, margin: float = 2.0) -> str | None:
    """Spatial relation: where the box of ``subject`` lies relative to the box of ``reference`` in the picture.

    The relation is defined only when exactly one of the four holds, each with a gap of at least ``margin`` pixels:
    ``left`` (subject ends left of where the reference starts), ``right``, ``above``, ``below``. Overlapping boxes
    (none holds), diagonal placements (two hold) and a missing or repeated category give ``None``.

    >>> boxes = [Box2D("blue ball", (10, 40, 30, 60)), Box2D("green cube", (50, 45, 70, 65))]
    >>> spatial_relation(boxes, "blue ball", "green cube"), spatial_relation(boxes, "green cube", "blue ball")
    ('left', 'right')
    """
    sub, ref = _unique(boxes, subject), _unique(boxes, reference)
    if sub is None or ref is None:
        return None
    (sx0, sy0, sx1, sy1), (rx0, ry0, rx1, ry1) = sub.box, ref.box
    holds = {
        "left": sx1 + margin <= rx0,
        "right": rx1 + margin <= sx0,
        "above": sy1 + margin <= ry0,
        "below": ry1 + margin <= sy0,
    }
    found = [label for label in RELATIONS if holds[label]]
    return found[0] if len(found) == 1 else None


def measure(
    task: str, annotation: ImageAnnotation, subject: str | None = None, reference: str | None = None
) -> float | str | None:
    """``f_m``: the value of ``task`` for one annotated image (``subject`` names the object of the distance and
    spatial tasks, ``reference`` the second object of the spatial task)."""
    if task == "counting":
        return count_instances(annotation.points)
    if task == "depth":
        if annotation.depth is None or annotation.region is None:
            raise ValueError("the depth expert needs annotation.depth and annotation.region")
        return median_depth(annotation.depth, annotation.region)
    if task == "distance":
        return ego_distance(annotation.objects, subject)
    if task == "spatial":
        return spatial_relation(annotation.boxes, subject, reference)
    raise ValueError(f"unknown CoRe task {task!r}; known tasks: {', '.join(TASKS)}")

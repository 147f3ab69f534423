"""Per-image annotation formats that the CoRe metric experts read (CoRe section 3.2, "heterogeneous annotation
formats"; docs/algorithms.md#papers): crowd points, a dense depth map with a queried region, 3D object annotations
and 2D boxes with categories.

They mirror what real sources provide (crowd-counting head points, NYU/KITTI-style depth maps, Omni3D-style camera-frame
3D boxes, COCO-style 2D boxes), so the experts in :mod:`app.tasks.core.metrics` work on either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class Box2D:
    """A 2D box ``[x0, y0, x1, y1]`` in pixels (x right, y down; ``x0 < x1``, ``y0 < y1``) and its category."""

    category: str
    box: tuple[float, float, float, float]


@dataclass(frozen=True)
class Object3D:
    """A 3D object: its category, centre ``(x, y, z)`` in the camera frame (metres; x right, y down, z forward) and
    full extents ``(width, height, depth)`` in metres."""

    category: str
    center: tuple[float, float, float]
    size: tuple[float, float, float]


@dataclass
class ImageAnnotation:
    """One image and its annotations; a source fills the fields it has.

    Attributes:
        image: the RGB image.
        points: crowd annotation, one ``(x, y)`` pixel point per instance (a head).
        depth: ``[H, W]`` float32 depth in metres; 0 or non-finite marks invalid pixels.
        region: the queried region of the depth map: a bool mask ``[H, W]`` or a box ``(x0, y0, x1, y1)``.
        objects: 3D object annotations.
        boxes: 2D boxes with categories.
    """

    image: Image.Image
    points: list[tuple[float, float]] = field(default_factory=list)
    depth: np.ndarray | None = None
    region: np.ndarray | tuple[int, int, int, int] | None = None
    objects: list[Object3D] = field(default_factory=list)
    boxes: list[Box2D] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The annotations as plain JSON (no image, depth map or mask): what shards keep for verifiers."""
        out: dict[str, Any] = {}
        if self.points:
            out["points"] = [[round(float(x), 1), round(float(y), 1)] for x, y in self.points]
        if self.objects:
            out["objects"] = [
                {"category": o.category, "center": _floats(o.center), "size": _floats(o.size)} for o in self.objects
            ]
        if self.boxes:
            out["boxes"] = [{"category": b.category, "box": _floats(b.box)} for b in self.boxes]
        return out


def _floats(values) -> list[float]:
    return [round(float(v), 3) for v in values]

"""Coloured markers that point the question at objects (OT-GRPO, Appendix D.2, docs/algorithms.md#papers).

Orientation, size and both distance tasks mark objects with dots at their 2D box centres, so the marker reveals neither
the object's extent (size) nor more of its position than the object itself; depth marks them with box outlines, since
2D box size correlates only weakly with depth. The paper does not say how distance objects are marked; dots are used
(a box's extent would hint at depth, which distances depend on). Counting marks nothing.

A marker is a JSON-ready dict: ``{"object": i, "kind": "dot", "color": "red", "xy": [x, y], "size": radius}`` or
``{"object": i, "kind": "box", "color": "red", "box": [x0, y0, x1, y1], "size": line_width}``, ``i`` indexing
``meta["objects"]``. Image transforms move markers with the image (:func:`flip_marker`, :func:`shift_marker`); the
question names objects by category and marker colour (:mod:`app.tasks.spatial.templates`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from PIL import Image, ImageDraw

from app.tasks.spatial.geometry import box_center, flip_box, shift_box

MARKER_COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "blue": (30, 90, 235),
    "yellow": (250, 220, 20),
    "magenta": (220, 40, 220),
}
"""Marker colours by the name the question uses; saturated hues that no scene category uses."""
_OUTLINE = (255, 255, 255)

Marker = dict[str, Any]


def make_markers(
    rng: random.Random, kind: str, boxes: Sequence[Sequence[float]], width: int, height: int
) -> list[Marker]:
    """One marker of ``kind`` (``"dot"`` or ``"box"``) per 2D box, in distinct colours drawn from ``rng``."""
    if kind not in ("dot", "box"):
        raise ValueError(f"marker kind must be 'dot' or 'box', got {kind!r}")
    if len(boxes) > len(MARKER_COLORS):
        raise ValueError(f"at most {len(MARKER_COLORS)} objects can be marked, got {len(boxes)}")
    colors = rng.sample(list(MARKER_COLORS), len(boxes))
    side = min(width, height)
    markers = []
    for i, (box, color) in enumerate(zip(boxes, colors, strict=True)):
        if kind == "dot":
            markers.append(
                {
                    "object": i,
                    "kind": "dot",
                    "color": color,
                    "xy": list(box_center(box)),
                    "size": max(3, round(side / 45)),
                }
            )
        else:
            markers.append(
                {
                    "object": i,
                    "kind": "box",
                    "color": color,
                    "box": [float(c) for c in box],
                    "size": max(2, round(side / 110)),
                }
            )
    return markers


def marker_extent(marker: Marker) -> list[float]:
    """The 2D box a drawn marker covers (its white ring included)."""
    if marker["kind"] == "dot":
        (x, y), r = marker["xy"], marker["size"] + 1
        return [x - r, y - r, x + r, y + r]
    return [float(c) for c in marker["box"]]


def draw_markers(image: Image.Image, markers: Sequence[Marker]) -> Image.Image:
    """A copy of ``image`` with the markers drawn: dots ringed in white, boxes as outlines inside the 2D box."""
    image = image.copy()
    draw = ImageDraw.Draw(image)
    for marker in markers:
        rgb = MARKER_COLORS[marker["color"]]
        if marker["kind"] == "dot":
            (x, y), r = marker["xy"], marker["size"]
            draw.ellipse((x - r - 1, y - r - 1, x + r + 1, y + r + 1), fill=_OUTLINE)
            draw.ellipse((x - r, y - r, x + r, y + r), fill=rgb)
        else:
            x0, y0, x1, y1 = (round(c) for c in marker["box"])
            draw.rectangle((x0, y0, x1 - 1, y1 - 1), outline=rgb, width=marker["size"])
    return image


def flip_marker(marker: Marker, width: float) -> Marker:
    """The marker after mirroring the image left-right."""
    if marker["kind"] == "dot":
        return {**marker, "xy": [width - marker["xy"][0], marker["xy"][1]]}
    return {**marker, "box": flip_box(marker["box"], width)}


def shift_marker(marker: Marker, dx: float, dy: float) -> Marker:
    """The marker after cropping the image at top-left corner ``(dx, dy)``."""
    if marker["kind"] == "dot":
        return {**marker, "xy": [marker["xy"][0] - dx, marker["xy"][1] - dy]}
    return {**marker, "box": shift_box(marker["box"], dx, dy)}

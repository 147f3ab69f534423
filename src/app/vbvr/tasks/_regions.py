"""Helpers shared by the colour-mixing, symmetry, pattern and rotation scorers: name the dominant palette colour of an
image region by nearest palette hue (so purple, violet and magenta are told apart even where their ``color_mask``
tolerances overlap), and draw / read square grid cells.

>>> import numpy as np
>>> from app.vbvr.cv import PALETTE
>>> image = np.full((8, 8, 3), PALETTE["violet"], dtype=np.uint8)
>>> dominant_color(image, np.ones((8, 8), bool))
('violet', 1.0)
"""

from __future__ import annotations

import cv2
import numpy as np

from app.vbvr.cv import BACKGROUND, PALETTE, palette_hue

_NAMES = tuple(PALETTE)
_MIN_SATURATION, _MIN_VALUE, _MAX_HUE_DISTANCE = 90, 70, 12


def palette_labels(image: np.ndarray) -> np.ndarray:
    """``[H, W]`` int array: index into ``PALETTE`` of each pixel's nearest palette hue, -1 for unsaturated, dark or
    off-palette pixels."""
    hsv = cv2.cvtColor(np.ascontiguousarray(image, dtype=np.uint8), cv2.COLOR_RGB2HSV)
    hue = hsv[..., 0].astype(np.int16)[..., None]
    targets = np.array([palette_hue(n) for n in _NAMES], dtype=np.int16)
    distance = np.abs(hue - targets)
    distance = np.minimum(distance, 180 - distance)
    labels = distance.argmin(axis=-1)
    valid = (
        (distance.min(axis=-1) <= _MAX_HUE_DISTANCE) & (hsv[..., 1] >= _MIN_SATURATION) & (hsv[..., 2] >= _MIN_VALUE)
    )
    return np.where(valid, labels, -1)


def dominant_color(image: np.ndarray, region: np.ndarray, labels: np.ndarray | None = None) -> tuple[str | None, float]:
    """The most frequent palette colour inside boolean ``region`` and the fraction of the region it covers
    (``(None, 0.0)`` if no pixel of the region is a palette colour)."""
    labels = palette_labels(image) if labels is None else labels
    inside = labels[region]
    inside = inside[inside >= 0]
    total = max(int(region.sum()), 1)
    if inside.size == 0:
        return None, 0.0
    counts = np.bincount(inside, minlength=len(_NAMES))
    best = int(counts.argmax())
    return _NAMES[best], round(float(counts[best]) / total, 6)


def disk(shape: tuple[int, ...], center: tuple[float, float], radius: float) -> np.ndarray:
    """Boolean ``shape[:2]`` mask of a disk."""
    ys, xs = np.mgrid[0 : shape[0], 0 : shape[1]]
    return (xs + 0.5 - center[0]) ** 2 + (ys + 0.5 - center[1]) ** 2 <= radius**2


def box(shape: tuple[int, ...], x0: float, y0: float, x1: float, y1: float, inset: float = 0.25) -> np.ndarray:
    """Boolean ``shape[:2]`` mask of the central part of the box ``(x0, y0)-(x1, y1)``: ``inset`` of its width and
    height is trimmed off each side (the part of a cell that blur and JPEG leave intact)."""
    dx, dy = (x1 - x0) * inset, (y1 - y0) * inset
    mask = np.zeros(shape[:2], dtype=bool)
    mask[
        int(round(y0 + dy)) : max(int(round(y1 - dy)), int(round(y0 + dy)) + 1),
        int(round(x0 + dx)) : max(int(round(x1 - dx)), int(round(x0 + dx)) + 1),
    ] = True
    return mask


def read_cell(
    image: np.ndarray, labels: np.ndarray, x0: float, y0: float, x1: float, y1: float, min_cover: float = 0.5
) -> str | None:
    """The palette colour filling the cell ``(x0, y0)-(x1, y1)``, or None when at most ``min_cover`` of its centre is
    one palette colour (an empty cell)."""
    name, cover = dominant_color(image, box(image.shape, x0, y0, x1, y1), labels)
    return name if cover > min_cover else None


def foreground(image: np.ndarray, min_difference: int = 60) -> np.ndarray:
    """Boolean mask of pixels that differ clearly from the background colour (objects, outlines)."""
    difference = np.abs(image.astype(np.int16) - np.array(BACKGROUND, dtype=np.int16)).max(axis=-1)
    return difference > min_difference


def classify_shape(mask: np.ndarray) -> str | None:
    """``circle``, ``square`` or ``triangle`` (apex up, as ``draw.draw_shape`` draws it): the template, fitted to the
    bounding box of the mask's largest component, that overlaps it best (IoU); None for an empty mask."""
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    if count < 2:
        return None
    largest = 1 + int(stats[1:, cv2.CC_STAT_AREA].argmax())
    x, y, w, h = (
        int(stats[largest, k]) for k in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP, cv2.CC_STAT_WIDTH, cv2.CC_STAT_HEIGHT)
    )
    component = (labels[y : y + h, x : x + w] == largest).astype(np.uint8)
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    circle = ((xs - w / 2) / (w / 2)) ** 2 + ((ys - h / 2) / (h / 2)) ** 2 <= 1.0
    triangle = np.abs(xs - w / 2) <= ys / h * w / 2
    templates = {
        "square": np.ones((h, w), np.uint8),
        "circle": circle.astype(np.uint8),
        "triangle": triangle.astype(np.uint8),
    }
    iou = {name: (t & component).sum() / max((t | component).sum(), 1) for name, t in templates.items()}
    return max(sorted(iou), key=iou.get)

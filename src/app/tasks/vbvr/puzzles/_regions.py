"""Helpers shared by the colour-mixing, symmetry, pattern and rotation scorers: name the dominant palette colour of an
image region by nearest palette hue (so purple, violet and magenta are told apart even where their ``color_mask``
tolerances overlap), and draw / read square grid cells.

>>> import numpy as np
>>> from app.cv import PALETTE
>>> image = np.full((8, 8, 3), PALETTE["violet"], dtype=np.uint8)
>>> dominant_color(image, np.ones((8, 8), bool))
('violet', 1.0)
"""

from __future__ import annotations

import cv2
import numpy as np

from app.cv import BACKGROUND, PALETTE, palette_hue

_NAMES = tuple(PALETTE)
_MIN_SATURATION, _MIN_VALUE, _MAX_HUE_DISTANCE = 90, 70, 12


def _hue_table() -> np.ndarray:
    """``[256]`` lookup: OpenCV hue -> index of the nearest palette hue, -1 when it is farther than the tolerance.
    Built once at import with the per-pixel rule (first palette colour wins a tie)."""
    hue = np.arange(256, dtype=np.int16)[:, None]
    targets = np.array([palette_hue(n) for n in _NAMES], dtype=np.int16)
    distance = np.abs(hue - targets)
    distance = np.minimum(distance, 180 - distance)
    return np.where(distance.min(axis=-1) <= _MAX_HUE_DISTANCE, distance.argmin(axis=-1), -1).astype(np.intp)


_HUE_TABLE = _hue_table()
_BACKGROUND = np.array(BACKGROUND, dtype=np.uint8)


def palette_labels(image: np.ndarray) -> np.ndarray:
    """``[H, W]`` int array: index into ``PALETTE`` of each pixel's nearest palette hue, -1 for unsaturated, dark or
    off-palette pixels."""
    hsv = cv2.cvtColor(np.ascontiguousarray(image, dtype=np.uint8), cv2.COLOR_RGB2HSV)
    valid = (hsv[..., 1] >= _MIN_SATURATION) & (hsv[..., 2] >= _MIN_VALUE)
    return np.where(valid, _HUE_TABLE[hsv[..., 0]], -1)


def box_slices(shape: tuple[int, ...], x0: float, y0: float, x1: float, y1: float, inset: float = 0.25):
    """``(rows, columns)`` slices of :func:`box`'s mask (``box(...)`` is True exactly on ``mask[rows, columns]``)."""
    dx, dy = (x1 - x0) * inset, (y1 - y0) * inset
    return (
        slice(int(round(y0 + dy)), max(int(round(y1 - dy)), int(round(y0 + dy)) + 1)),
        slice(int(round(x0 + dx)), max(int(round(x1 - dx)), int(round(x0 + dx)) + 1)),
    )


def box_label_counts(image: np.ndarray, boxes) -> list[tuple[np.ndarray, int]]:
    """For each ``(rows, columns)`` slice pair of ``boxes``: ``(counts, area)``, the number of pixels of each palette
    colour (``palette_labels``) inside the box and the box's pixel count. Labels only the rows and columns the boxes
    cover (the same per-pixel labels as :func:`palette_labels` of the whole image)."""
    height, width = image.shape[:2]
    spans = [(range(*ys.indices(height)), range(*xs.indices(width))) for ys, xs in boxes]
    rows = np.unique(np.concatenate([np.arange(r.start, r.stop) for r, _ in spans] + [np.zeros(0, int)]))
    cols = np.unique(np.concatenate([np.arange(c.start, c.stop) for _, c in spans] + [np.zeros(0, int)]))
    if rows.size and cols.size:
        labels = palette_labels(np.ascontiguousarray(image[np.ix_(rows, cols)]))
    found, k = [], len(_NAMES)
    for r, c in spans:
        if len(r) == 0 or len(c) == 0:
            found.append((np.zeros(k, np.intp), 0))
            continue
        i, j = int(np.searchsorted(rows, r.start)), int(np.searchsorted(cols, c.start))
        block = labels[i : i + len(r), j : j + len(c)]
        found.append((np.bincount(block.ravel() + 1, minlength=k + 1)[1:], len(r) * len(c)))
    return found


def dominant_from_counts(counts: np.ndarray, area: int) -> tuple[str | None, float]:
    """:func:`dominant_color`'s answer from a region's palette counts and its pixel count."""
    if not counts.any():
        return None, 0.0
    best = int(counts.argmax())
    return _NAMES[best], round(float(counts[best]) / max(area, 1), 6)


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
    mask = np.zeros(shape[:2], dtype=bool)
    mask[box_slices(shape, x0, y0, x1, y1, inset)] = True
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
    image = np.asarray(image)
    if image.dtype == np.uint8 and image.ndim == 3 and image.shape[-1] == 3:
        difference = cv2.absdiff(np.ascontiguousarray(image), np.broadcast_to(_BACKGROUND, image.shape).copy())
        return difference.max(axis=-1) > min_difference
    difference = np.abs(image.astype(np.int16) - np.array(BACKGROUND, dtype=np.int16)).max(axis=-1)
    return difference > min_difference


def disk_window(shape: tuple[int, ...], center: tuple[float, float], radius: float):
    """``(rows, columns, mask)``: slices of a window holding the whole :func:`disk` and the disk's mask inside it
    (``disk(shape, center, radius)`` is ``mask`` there and False elsewhere)."""
    height, width = shape[0], shape[1]
    pad = abs(radius) + 2
    y0, y1 = max(int(np.floor(center[1] - pad)), 0), min(int(np.ceil(center[1] + pad)), height)
    x0, x1 = max(int(np.floor(center[0] - pad)), 0), min(int(np.ceil(center[0] + pad)), width)
    y1, x1 = max(y1, y0), max(x1, x0)
    ys = np.arange(y0, y1)[:, None]
    xs = np.arange(x0, x1)[None, :]
    mask = (xs + 0.5 - center[0]) ** 2 + (ys + 0.5 - center[1]) ** 2 <= radius**2
    return slice(y0, y1), slice(x0, x1), mask


def shape_in_box(image: np.ndarray, rows: slice, columns: slice) -> str | None:
    """``classify_shape(foreground(image) & region)`` for the box ``region`` = ``mask[rows, columns]``, computed on a
    crop (aligned to even coordinates, so connected components are labelled as on the whole image)."""
    height, width = image.shape[:2]
    r, c = range(*rows.indices(height)), range(*columns.indices(width))
    if len(r) == 0 or len(c) == 0:
        return None
    r0, c0 = r.start - r.start % 2, c.start - c.start % 2
    mask = foreground(image[r0 : r.stop, c0 : c.stop])
    mask[: r.start - r0] = False
    mask[:, : c.start - c0] = False
    return classify_shape(mask)


_TEMPLATES: dict[tuple[int, int], tuple[tuple[str, np.ndarray], ...]] = {}


def _templates(h: int, w: int) -> tuple[tuple[str, np.ndarray], ...]:
    found = _TEMPLATES.get((h, w))
    if found is None:
        ys, xs = np.mgrid[0:h, 0:w] + 0.5
        circle = ((xs - w / 2) / (w / 2)) ** 2 + ((ys - h / 2) / (h / 2)) ** 2 <= 1.0
        triangle = np.abs(xs - w / 2) <= ys / h * w / 2
        found = (("circle", circle.astype(np.uint8)), ("triangle", triangle.astype(np.uint8)))
        if len(_TEMPLATES) < 4096:
            _TEMPLATES[(h, w)] = found
    return found


MIN_SHAPE_IOU = 0.6
"""Least IoU of a shape with its best template: drawn shapes, blurred or compressed, reach 0.75 or more at 64 px and
above; a checkerboard's component (half its box) reaches 0.5."""


def classify_shape(mask: np.ndarray) -> str | None:
    """``circle``, ``square`` or ``triangle`` (apex up, as ``draw.draw_shape`` draws it): the template, fitted to the
    bounding box of the mask's largest component, that overlaps it best (IoU); None for an empty mask or when no
    template overlaps it by :data:`MIN_SHAPE_IOU` (a checkerboard, a scribble)."""
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    if count < 2:
        return None
    largest = 1 + int(stats[1:, cv2.CC_STAT_AREA].argmax())
    x, y, w, h = (
        int(stats[largest, k]) for k in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP, cv2.CC_STAT_WIDTH, cv2.CC_STAT_HEIGHT)
    )
    component = (labels[y : y + h, x : x + w] == largest).astype(np.uint8)
    area = int(component.sum())
    iou = {"square": area / max(h * w, 1)}  # the square template is the whole bounding box
    for name, t in _templates(h, w):
        overlap = int(np.count_nonzero(t & component))
        iou[name] = overlap / max(int(t.sum()) + area - overlap, 1)
    best = max(sorted(iou), key=iou.get)
    return best if iou[best] >= MIN_SHAPE_IOU else None

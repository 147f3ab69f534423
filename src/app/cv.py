"""Classical computer vision shared by the renderers and the scorers: named colours in HSV, segmentation, connected
components, shape, and reading a generated rendering as uint8 frames.

Images are ``uint8`` RGB arrays ``[H, W, 3]``. Everything is deterministic (OpenCV on the CPU, no learned models).
Colours are named by hue: each name owns a hue interval (OpenCV hue, 0-179) with minimum saturation and value, wide
enough to survive blur, noise and JPEG, narrow enough that a neighbouring named hue (violet for purple) falls outside.

A neutral module: the VBVR-Pro task programs and their reward (:mod:`app.tasks.vbvr`), the shape prompts
(:mod:`app.tasks.dots.shapes`) and the image rewards (:mod:`app.rewards.color_region`) import it, and it imports none of
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor

# name -> RGB used by renderers. Neighbouring hues are 9 (purple / magenta) to ~30 OpenCV units apart; with the
# +-7 tolerance below every pair stays distinguishable, and tasks that need a firm decision label each pixel by its
# nearest palette hue (app/tasks/vbvr/puzzles/_regions.py).
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (240, 140, 20),
    "yellow": (235, 220, 30),
    "green": (40, 170, 60),
    "cyan": (30, 200, 210),
    "blue": (30, 60, 220),
    "violet": (110, 40, 230),
    "purple": (150, 40, 170),
    "magenta": (225, 40, 200),
}
BACKGROUND = (235, 235, 235)
WALL = (40, 40, 40)
_HUE_TOLERANCE = 7  # OpenCV hue units (x2 degrees) around a palette colour's hue
_MIN_SATURATION = 90
_MIN_VALUE = 70


def palette_hue(name: str) -> int:
    """OpenCV hue (0-179) of a palette colour."""
    rgb = np.uint8([[PALETTE[name]]])
    return int(cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)[0, 0, 0])


def color_mask(image: np.ndarray, name: str, tolerance: int = _HUE_TOLERANCE) -> np.ndarray:
    """Boolean ``[H, W]`` mask of pixels whose colour is the named palette colour."""
    hsv = cv2.cvtColor(np.ascontiguousarray(image, dtype=np.uint8), cv2.COLOR_RGB2HSV)
    gap = np.abs(np.subtract(hsv[..., 0], palette_hue(name), dtype=np.int16))  # int16: no uint8 wrap-around
    distance = np.minimum(gap, 180 - gap)  # hue is circular
    return (distance <= tolerance) & (hsv[..., 1] >= _MIN_SATURATION) & (hsv[..., 2] >= _MIN_VALUE)


def saturated_mask(image: np.ndarray, min_saturation: int = _MIN_SATURATION, min_value: int = _MIN_VALUE) -> np.ndarray:
    """Boolean ``[H, W]`` mask of coloured (saturated, not dark) pixels of any hue."""
    hsv = cv2.cvtColor(np.ascontiguousarray(image, dtype=np.uint8), cv2.COLOR_RGB2HSV)
    return (hsv[..., 1] >= min_saturation) & (hsv[..., 2] >= min_value)


@dataclass(frozen=True)
class Blob:
    """A connected component: pixel area, centroid (x, y), bounding box (x, y, w, h) and a shape guess."""

    area: int
    centroid: tuple[float, float]
    bbox: tuple[int, int, int, int]
    shape: str


def blobs(mask: np.ndarray, min_area: int = 12) -> list[Blob]:
    """Connected components of ``mask`` larger than ``min_area`` pixels, largest first, with a shape guess."""
    mask_u8 = mask.astype(np.uint8)
    count, labels, stats, centroids = cv2.connectedComponentsWithStats(mask_u8)  # 8-connectivity (the default)
    found = []
    for i in range(1, count):
        area = int(stats[i, cv2.CC_STAT_AREA])
        if area < min_area:
            continue
        x, y, w, h = (
            int(stats[i, k]) for k in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP, cv2.CC_STAT_WIDTH, cv2.CC_STAT_HEIGHT)
        )
        found.append(Blob(area, (float(centroids[i][0]), float(centroids[i][1])), (x, y, w, h), _shape(labels == i)))
    return sorted(found, key=lambda b: (-b.area, b.centroid))


def _shape(component: np.ndarray) -> str:
    """``circle``, ``square`` or ``triangle`` from the component's fill ratio of its bounding box and its polygon."""
    contours, _ = cv2.findContours(component.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    if not contours:
        return "unknown"
    contour = contours[0]  # the only one: an 8-connected component has one outer contour
    area = cv2.contourArea(contour)
    x, y, w, h = cv2.boundingRect(contour)
    fill = area / (w * h)  # a contour's bounding box is at least 1 x 1
    if fill > 0.88:
        return "square"
    if fill < 0.62:
        return "triangle"
    return "circle"


def to_uint8_frames(rendering: Any) -> np.ndarray:
    """A rendering as uint8 ``[T, H, W, 3]``; raises ``ValueError`` naming the shape it cannot read.

    Reads a uint8 ``[H, W, 3]`` image or ``[T, H, W, 3]`` video (numpy or PIL), or a float tensor in [0, 1] shaped
    ``[3, H, W]`` or ``[T, 3, H, W]`` (what a diffusers VAE decodes to). Empty renderings (0 x 0 images, videos of no
    frames) are refused here too, so that no OpenCV call downstream meets one.
    """
    if isinstance(rendering, Tensor):
        array = rendering.detach().float().cpu()
        if array.ndim == 3 and array.shape[0] == 3:
            array = array.permute(1, 2, 0)
        elif array.ndim == 4 and array.shape[1] == 3:
            array = array.permute(0, 2, 3, 1)
        array = (array.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    else:
        array = np.asarray(rendering)
        if array.dtype != np.uint8:
            raise ValueError(f"numpy renderings must be uint8, got {array.dtype}")
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"cannot read a rendering of shape {tuple(array.shape)}: expected [H, W, 3] or [T, H, W, 3]")
    if 0 in array.shape:
        raise ValueError(f"empty rendering of shape {tuple(array.shape)} as [T, H, W, 3]: no frames or no pixels")
    return np.ascontiguousarray(array)


def frames_at_size(frames: np.ndarray, height: int, width: int, aspect_tolerance: float = 0.01) -> np.ndarray:
    """uint8 ``frames`` ``[T, H, W, 3]`` resized to ``height x width`` (area interpolation; unchanged at that size).

    Raises ``ValueError`` when the aspect ratios differ by more than ``aspect_tolerance``: stretching would move what a
    scorer measures (a generator must draw at the problem's aspect ratio)."""
    h, w = frames.shape[1:3]
    if (h, w) == (height, width):
        return frames
    if abs((w / h) / (width / height) - 1) > aspect_tolerance:
        raise ValueError(
            f"rendering of {w}x{h} pixels does not have the problem's aspect ratio ({width}x{height}): generate at "
            "the problem's aspect ratio (the flow policy's resolution)"
        )
    return np.stack([cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA) for frame in frames])

"""Does a generated picture show "a <colour> <shape> on the <position>"? Classical CV checks, no learned model.

The picture's object is the largest connected blob of the named palette colour (HSV, :func:`app.cv.color_mask`) that
is a bounded object: at least ``min_pixels`` pixels (scattered pixels of the colour, noise, do not count) and a
bounding box that fits, as a square, in the named half (as any square or circle drawn there does). It must also be
most of the picture's colour: over half of the pixels in blobs of saturated pixels of any hue. A canvas, a half or a
checkerboard filled with the colour is no object, and neither is one square of a mosaic or of many equal squares
tiling the canvas; then all three checks score 0. The score is the mean of
three checks (each in [0, 1]):

- colour: there is such an object;
- position: its centroid lies in the named half (left / right / top / bottom);
- shape (soft): its fill of its bounding box against the shape's (square 1.0, circle pi / 4) and its aspect ratio
  (short side / long side) against 1, each with full credit within ``shape_tolerance / 2`` of the target, falling
  linearly to 0 at ``shape_tolerance``; the lower of the two counts (a filled 1 x 3 bar is no square).

Images are float tensors ``[3, H, W]`` in [0, 1] or uint8 arrays ``[H, W, 3]`` (as
:class:`app.tasks.vbvr.VBVRScorerReward` reads them); a video scores its last frame. The prompt's parts come from
``sample.meta`` (``color``, ``shape``, ``position``) or, without them, from the prompt text.

A rendering that cannot be read (wrong shape or dtype, a 0 x 0 image, an empty tensor, a video of no frames) scores the
low end of ``value_range`` (0), is counted in ``ColorRegionReward.num_malformed`` and is logged as a warning; it never
fails the batch. A prompt whose parts cannot be read scores 0 as well (not counted: the prompt is no generation).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor

from app.cv import PALETTE, Blob, blobs, color_mask, saturated_mask, to_uint8_frames
from app.rewards.base import RewardComponent
from app.types import VisualSample

log = logging.getLogger(__name__)

_PROMPT = re.compile(r"\ba (\w+) (circle|square) on the (left|right|top|bottom)\b")
_FILL = {"square": 1.0, "circle": math.pi / 4}


def parse_shape_prompt(text: str) -> dict[str, str] | None:
    match = _PROMPT.search(text.lower())
    if not match or match.group(1) not in PALETTE:
        return None
    return dict(color=match.group(1), shape=match.group(2), position=match.group(3))


def _credit(distance: float, tolerance: float) -> float:
    """Full credit within ``tolerance / 2`` of the target, falling linearly to 0 at ``tolerance``."""
    return float(np.clip(2.0 - 2.0 * distance / tolerance, 0.0, 1.0))


def _fits_half(blob: Blob, width: int, height: int, position: str) -> bool:
    """Whether the blob's bounding box fits, as a square, in the named half of a ``width x height`` canvas."""
    half_width, half_height = (width / 2, height) if position in ("left", "right") else (width, height / 2)
    return max(blob.bbox[2], blob.bbox[3]) <= min(half_width, half_height)


def color_region_checks(
    image: Any, color: str, shape: str, position: str, min_pixels: int = 12, shape_tolerance: float = 0.2
) -> dict[str, float]:
    """The three checks of one image: ``{"color", "position", "shape"}`` each in [0, 1]."""
    frame = to_uint8_frames(image)[-1]  # [H, W, 3]
    height, width = frame.shape[:2]
    found = blobs(color_mask(frame, color), min_area=min_pixels)  # scattered pixels of the colour (noise) drop out
    objects = [b for b in found if _fits_half(b, width, height, position)]
    if not objects or 2 * objects[0].area <= sum(b.area for b in blobs(saturated_mask(frame), min_area=min_pixels)):
        return {"color": 0.0, "position": 0.0, "shape": 0.0}  # no object, or most of the picture's colour is elsewhere
    largest = objects[0]
    cx, cy = largest.centroid
    inside = {"left": cx < width / 2, "right": cx > width / 2, "top": cy < height / 2, "bottom": cy > height / 2}
    w, h = largest.bbox[2], largest.bbox[3]
    fill = largest.area / max(w * h, 1)
    aspect = min(w, h) / max(w, h, 1)
    shape_score = min(_credit(abs(fill - _FILL[shape]), shape_tolerance), _credit(1.0 - aspect, shape_tolerance))
    return {"color": 1.0, "position": float(inside[position]), "shape": shape_score}


_POSITIONS = ("left", "right", "top", "bottom")


def _scores(
    images: Sequence[Any], prompts: Sequence[dict[str, str] | str | None], min_pixels: int, shape_tolerance: float
) -> tuple[list[float], list[tuple[int, str]]]:
    """The scores, and ``(index, why)`` of each image that could not be read."""
    values, malformed = [], []
    for i, (image, prompt) in enumerate(zip(images, prompts, strict=True)):
        parts = parse_shape_prompt(prompt) if isinstance(prompt, str) else prompt
        if (
            not parts
            or parts.get("color") not in PALETTE
            or parts.get("shape") not in _FILL
            or parts.get("position") not in _POSITIONS
        ):
            values.append(0.0)
            continue
        try:
            checks = color_region_checks(
                image, parts["color"], parts["shape"], parts["position"], min_pixels, shape_tolerance
            )
        except (ValueError, cv2.error) as error:  # an unreadable or degenerate rendering
            values.append(0.0)
            malformed.append((i, f"{type(error).__name__}: {error}"))
            continue
        values.append(sum(checks.values()) / len(checks))
    return values, malformed


def color_region_reward(
    images: Sequence[Any],
    prompts: Sequence[dict[str, str] | str | None],
    min_pixels: int = 12,
    shape_tolerance: float = 0.2,
) -> Tensor:
    """``[N]`` float32: the mean of the three checks per image; 0 where the prompt cannot be read or the image is
    malformed (logged as a warning). ``prompts[i]`` is a ``{"color", "shape", "position"}`` dict or the prompt text."""
    values, malformed = _scores(images, prompts, min_pixels, shape_tolerance)
    for i, why in malformed:
        log.warning("color region reward: image %d scored 0 (malformed): %s", i, why)
    return torch.tensor(values, dtype=torch.float32)


class ColorRegionReward(RewardComponent):
    """Fraction of the colour / position / shape checks a generated picture passes (see the module docstring).

    Attributes:
        num_malformed: renderings scored the low end of ``value_range`` because they could not be read (cumulative;
            each is logged as a warning).

    Args:
        min_pixels: area of the smallest blob of the named colour that counts as present.
        shape_tolerance: fill-ratio and aspect-ratio distance at which the shape credit reaches 0.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"color_region"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
    """

    completion_kinds = ("image", "array")  # text scores as malformed
    side_state = ("num_malformed",)

    def __init__(
        self, min_pixels: int = 12, shape_tolerance: float = 0.2, weight: float = 1.0, name: str | None = None, **kwargs
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.min_pixels, self.shape_tolerance = int(min_pixels), float(shape_tolerance)
        self.num_malformed = 0

    def score(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> Tensor:
        prompts = [s.meta if {"color", "shape", "position"} <= set(s.meta) else s.question for s in samples]
        values, malformed = _scores(completions, prompts, self.min_pixels, self.shape_tolerance)
        low = self.value_range[0]
        for i, why in malformed:
            values[i] = low
            self.num_malformed += 1
            log.warning(
                "color region reward: completion %d scored %s (malformed; %d so far): %s",
                i,
                low,
                self.num_malformed,
                why,
            )
        return torch.tensor(values, dtype=torch.float32)

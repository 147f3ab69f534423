"""Scoring a generated rendering in VBVR-Pro's three evaluation regimes, with the failed checks of each.

- **Last-Frame**: the last generated frame (an image model's only frame) is scored as the solved state.
- **Key-Frame**: the generated frames at the task's key steps, mapped from the instance's video onto the generated
  one by relative position (``round(i * (F - 1) / (T - 1))`` for key frame ``i`` of ``T`` source frames and ``F``
  generated frames), scored as a video.
- **Multi-Frame**: every generated frame, scored as a video.

An image (one frame) has only the Last-Frame regime. The sample's ``meta["vbvr"]`` names the task, its parameters and
configuration, and (for Key-Frame) ``key_frame_indices`` and ``num_frames`` of the instance's video.

>>> import numpy as np
>>> frames = np.zeros((5, 8, 8, 3), np.uint8)
>>> regime_renderings(frames, key_frame_indices=[0, 4, 8], num_source_frames=9)["key_frame"].shape
(3, 8, 8, 3)
>>> sorted(regime_renderings(np.zeros((1, 8, 8, 3), np.uint8)))
['last_frame']
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np

from app.cv import frames_at_size, to_uint8_frames
from app.tasks.vbvr.registry import get_task
from app.tasks.vbvr.scoring import ScoreResult

REGIMES = ("last_frame", "key_frame", "multi_frame")


def regime_renderings(
    frames: np.ndarray, key_frame_indices: Sequence[int] | None = None, num_source_frames: int | None = None
) -> dict[str, np.ndarray]:
    """The rendering each regime scores, from generated ``frames`` ``[F, H, W, 3]`` uint8."""
    out = {"last_frame": frames[-1]}
    if len(frames) == 1:
        return out
    if key_frame_indices and num_source_frames and num_source_frames > 1:
        scale = (len(frames) - 1) / (num_source_frames - 1)
        picks = sorted({min(len(frames) - 1, round(i * scale)) for i in key_frame_indices})
        out["key_frame"] = frames[picks]
    out["multi_frame"] = frames
    return out


@lru_cache(maxsize=256)
def _task(name: str, params_key: tuple):
    return get_task(name, **dict(params_key))


def problem_frames(rendering: Any, spec: dict[str, Any]) -> np.ndarray:
    """A generated ``rendering`` as uint8 ``[F, H, W, 3]`` at the problem's size (``spec["params"]["image_size"]``,
    square), where the scorer's geometry lives: a model that generates at another size of the same aspect ratio is
    resized to it; another aspect ratio is a ``ValueError`` (never stretched)."""
    frames = to_uint8_frames(rendering)
    size = dict(spec.get("params", {})).get("image_size")
    return frames if size is None else frames_at_size(frames, size, size)


def score_regimes(rendering: Any, spec: dict[str, Any]) -> dict[str, ScoreResult | None]:
    """Each applicable regime's :class:`~app.tasks.vbvr.scoring.ScoreResult` of a generated ``rendering`` (anything
    :func:`app.cv.to_uint8_frames` reads) against ``spec`` (``meta["vbvr"]``); None where the scorer cannot measure it
    (a malformed rendering scores as a failure, never an exception)."""
    task = _task(spec["task"], tuple(sorted(dict(spec.get("params", {})).items())))
    frames = problem_frames(rendering, spec)
    renderings = regime_renderings(frames, spec.get("key_frame_indices"), spec.get("num_frames"))
    results: dict[str, ScoreResult | None] = {}
    for regime, part in renderings.items():
        try:
            results[regime] = task.score(part, spec["config"])
        except (ValueError, IndexError, cv2.error):  # as the reward: an unmeasurable rendering scores 0
            results[regime] = ScoreResult(0.0, ())
    return results


def failed_check_names(result: ScoreResult | None) -> list[str]:
    """Names (without details) of the checks that did not fully pass."""
    return [] if result is None else [c.name for c in result.checks if not c.passed]

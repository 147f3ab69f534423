"""The two settings of the motion tasks: ``in_domain`` (training and in-domain evaluation) and ``shifted`` (evaluation
under a distribution shift: more frames, smaller and slower dots, diagonal drift, coloured backgrounds, higher counts).

Lengths are in pixels of a 64-pixel frame and scale with the frame size (:meth:`MotionSplit.scaled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.tasks.motion.clips import Color

SplitName = Literal["in_domain", "shifted"]


@dataclass(frozen=True)
class MotionSplit:
    """The ranges a motion task draws its clips from (each inclusive).

    Attributes:
        frames: number of frames of a clip.
        radius: dot radius, in pixels of a 64-pixel frame.
        speed: speed of a dot along its motion, in pixels per frame of a 64-pixel frame.
        drift: the direction task's sideways speed, at most this fraction of the speed (0: along the asked axis only).
        backgrounds: the background colours drawn from.
        counts: the counting task's number of appearances.
    """

    frames: tuple[int, int]
    radius: tuple[int, int]
    speed: tuple[float, float]
    drift: float
    backgrounds: tuple[Color, ...]
    counts: tuple[int, int]

    def scaled(self, image_size: int, length: float) -> float:
        """``length`` (pixels of a 64-pixel frame) in pixels of an ``image_size`` frame."""
        return length * image_size / 64


SPLITS: dict[str, MotionSplit] = {
    "in_domain": MotionSplit(
        frames=(6, 8),
        radius=(5, 7),
        speed=(2.5, 4.0),
        drift=0.0,
        backgrounds=((230, 230, 230),),
        counts=(1, 3),
    ),
    "shifted": MotionSplit(
        frames=(10, 12),
        radius=(3, 4),
        speed=(1.5, 2.5),
        drift=0.4,
        backgrounds=((245, 235, 200), (190, 225, 190), (200, 210, 240)),
        counts=(1, 5),
    ),
}
"""``in_domain``: 6-8 frames, radius 5-7, 2.5-4 px per frame along one axis, light grey background, 1-3 appearances.
``shifted``: 10-12 frames, radius 3-4, 1.5-2.5 px per frame with up to 0.4 of that sideways, cream / pale green / pale
blue backgrounds, 1-5 appearances."""

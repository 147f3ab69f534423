"""Video reasoning tasks with verifiable answers: short clips of a red and a blue dot, rendered with numpy from their
tracks (:mod:`app.tasks.motion.clips`), each sample rebuilt from ``(seed, index)``. Every sample holds one
:class:`~app.types.Video` (``images`` empty) and a question that starts with the ``<video>`` placeholder; answers are
"yes" / "no" or a number, as :class:`~app.rewards.AccuracyReward` reads them.

- :class:`DirectionDataset` (``motion_direction``): is the red dot moving to the right (left, up, down)?
- :class:`OrderDataset` (``motion_order``): does the red dot cross the grey line before the blue dot?
- :class:`EventCountDataset` (``motion_count``): how many times does the red dot appear?
- :class:`PairedDirectionDataset`, :class:`PairedOrderDataset`, :class:`PairedEventCountDataset`: each prompt with a
  twin changed in time (played backwards, cropped, at twice the frame rate) whose answer is the original's or its
  negation, for the label-free consistency reward (:mod:`app.tasks.motion.pairs`).

Each takes ``split``: ``in_domain`` (training) or ``shifted`` (more frames, smaller and slower dots, diagonal drift,
coloured backgrounds, higher counts), see :mod:`app.tasks.motion.splits`.
"""

from app.tasks.motion.clips import Clip, Track, centroids
from app.tasks.motion.pairs import (
    PairedDirectionDataset,
    PairedEventCountDataset,
    PairedMotionDataset,
    PairedOrderDataset,
)
from app.tasks.motion.splits import SPLITS, MotionSplit
from app.tasks.motion.tasks import DirectionDataset, EventCountDataset, MotionDataset, OrderDataset

__all__ = [
    "SPLITS",
    "Clip",
    "DirectionDataset",
    "EventCountDataset",
    "MotionDataset",
    "MotionSplit",
    "OrderDataset",
    "PairedDirectionDataset",
    "PairedEventCountDataset",
    "PairedMotionDataset",
    "PairedOrderDataset",
    "Track",
    "centroids",
]

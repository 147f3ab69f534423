"""Video files as :class:`~app.types.Video`: decoded with OpenCV (its bundled FFmpeg reads mp4, avi, webm, ...), with
the frames sampled the way the Qwen-VL processors expect them (``qwen-vl-utils``): ``fps`` frames per second of the
clip, at most ``max_frames``, an even number (Qwen-VL merges frame pairs into one temporal patch), spread evenly over
the clip (``linspace`` over its frame indices); each frame scaled down to at most ``max_pixels`` pixels.

The cost of a file is bounded before anything is decoded: its header (frame count, rate, size) is read first and a
video with more than ``max_source_frames`` frames or frames over ``max_source_pixels`` is refused; decoding then keeps
only the sampled frames (the others are grabbed, not converted), each scaled down as it is read, so at most
``max_frames x max_pixels x 3`` bytes are held. Errors (:class:`VideoError`) name the file.

:func:`capped_video` applies the same two caps to a :class:`~app.types.Video` already in memory (the VLM policy's
``max_video_frames`` / ``max_video_pixels``, for clips from any data set).

>>> header = VideoHeader(frames=30, fps=10.0, width=64, height=48)  # a 3 s clip
>>> sampled_indices(header, VideoLimits(fps=2.0)).tolist()  # 2 fps: 6 frames, from the first to the last
[0, 6, 12, 17, 23, 29]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.types import Video

FRAME_FACTOR = 2
"""Sampled frame counts are multiples of this: Qwen-VL's temporal patch (two frames per patch)."""


class VideoError(ValueError):
    """A video file that cannot be read or is over the limits; the message names the file.

    Attributes:
        path: the file.
        reason: what is wrong, without the file.
        limit: the :class:`VideoLimits` field the file is over, or None when it is unreadable.
    """

    def __init__(self, path: Path, reason: str, limit: str | None = None):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.limit = path, reason, limit


@dataclass(frozen=True)
class VideoLimits:
    """How a video file is sampled, and what it may cost.

    Attributes:
        fps: frames sampled per second of the clip (Qwen-VL's default is 2).
        max_frames: most frames kept (an even number of at least 2 is kept whatever the clip's length).
        max_pixels: most pixels (width x height) of a kept frame; larger frames are scaled down, aspect kept.
        max_source_frames: longest file accepted, in frames (the reader steps through the file up to its last
            sampled frame).
        max_source_pixels: largest frame of the file accepted (width x height), read from its header.
    """

    fps: float = 2.0
    max_frames: int = 32
    max_pixels: int = 448 * 448
    max_source_frames: int = 36_000
    max_source_pixels: int = 4096 * 4096

    def __post_init__(self):
        if not self.fps > 0:
            raise ValueError(f"video fps must be > 0, got {self.fps}")
        if self.max_frames < FRAME_FACTOR or self.max_pixels < 1:
            raise ValueError(
                f"max_frames must be >= {FRAME_FACTOR} and max_pixels >= 1, got {self.max_frames}, {self.max_pixels}"
            )
        if self.max_source_frames < 1 or self.max_source_pixels < 1:
            raise ValueError("max_source_frames and max_source_pixels must be >= 1")


@dataclass(frozen=True)
class VideoHeader:
    """What a video file's header says: frame count, rate and frame size."""

    frames: int
    fps: float
    width: int
    height: int


def _capture(path: Path):
    import cv2

    capture = cv2.VideoCapture(str(path))
    if not capture.isOpened():
        capture.release()
        raise VideoError(path, "unreadable video (OpenCV cannot open it)")
    return capture


def _header(capture, path: Path, limits: VideoLimits) -> VideoHeader:
    import cv2

    header = VideoHeader(
        frames=int(capture.get(cv2.CAP_PROP_FRAME_COUNT)),
        fps=float(capture.get(cv2.CAP_PROP_FPS)),
        width=int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
        height=int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
    )
    if header.frames < 1 or not header.fps > 0 or header.width < 1 or header.height < 1:
        raise VideoError(path, f"unreadable video (its header gives {header})")
    if header.frames > limits.max_source_frames:
        reason = f"{header.frames} frames, over max_source_frames={limits.max_source_frames}"
        raise VideoError(path, reason, "max_source_frames")
    if header.width * header.height > limits.max_source_pixels:
        reason = f"frames of {header.width}x{header.height} pixels, over max_source_pixels={limits.max_source_pixels}"
        raise VideoError(path, reason, "max_source_pixels")
    return header


def probe_video(path: str | Path, limits: VideoLimits | None = None) -> VideoHeader:
    """The header of the video file at ``path``, checked against ``limits``, without decoding a frame."""
    path, limits = Path(path), limits or VideoLimits()
    capture = _capture(path)
    try:
        return _header(capture, path, limits)
    finally:
        capture.release()


def sampled_indices(header: VideoHeader, limits: VideoLimits) -> np.ndarray:
    """The frame indices kept of a file: ``limits.fps`` per second of the clip, between 2 and ``limits.max_frames``,
    rounded down to an even count, spread evenly from the first frame to the last (repeats when the clip has fewer
    frames than that)."""
    wanted = header.frames / header.fps * limits.fps
    count = min(max(wanted, FRAME_FACTOR), limits.max_frames)
    count = max(FRAME_FACTOR, int(count) // FRAME_FACTOR * FRAME_FACTOR)
    return np.linspace(0, header.frames - 1, count).round().astype(np.int64)


def _scaled(frame: np.ndarray, max_pixels: int) -> np.ndarray:
    """``frame`` scaled down (area interpolation, aspect kept) to at most ``max_pixels`` pixels."""
    import cv2

    height, width = frame.shape[:2]
    if height * width <= max_pixels:
        return frame
    scale = math.sqrt(max_pixels / (height * width))
    size = (max(1, int(width * scale)), max(1, int(height * scale)))
    return cv2.resize(frame, size, interpolation=cv2.INTER_AREA)


def capped_video(video: Video, max_frames: int, max_pixels: int) -> Video:
    """``video`` with at most ``max_frames`` frames and ``max_pixels`` pixels a frame: a longer clip keeps the largest
    even count within ``max_frames`` spread evenly from its first frame to its last (its rate lowered so that it
    lasts as long), larger frames are scaled down (area interpolation, aspect kept). ``video`` itself when it is
    within both caps."""
    if max_frames < FRAME_FACTOR:
        raise ValueError(f"max_frames must be >= {FRAME_FACTOR}, got {max_frames}")
    if max_pixels < 1:
        raise ValueError(f"max_pixels must be >= 1, got {max_pixels}")
    count, (height, width) = video.num_frames, video.frames.shape[1:3]
    if count <= max_frames and height * width <= max_pixels:
        return video
    frames, fps = video.frames, video.fps
    if count > max_frames:
        kept = max_frames // FRAME_FACTOR * FRAME_FACTOR
        frames = frames[np.linspace(0, count - 1, kept).round().astype(np.int64)]
        fps = fps * kept / count
    if height * width > max_pixels:
        frames = np.stack([_scaled(frame, max_pixels) for frame in frames])
    return Video(np.ascontiguousarray(frames), fps=fps)


def read_video(path: str | Path, limits: VideoLimits | None = None) -> Video:
    """The sampled frames of the video file at ``path`` (RGB) and their rate: ``count / frames * file fps``, as
    ``qwen-vl-utils`` gives the processor. :class:`VideoError` when the file is unreadable, ends early or is over
    ``limits``."""
    import cv2

    path, limits = Path(path), limits or VideoLimits()
    capture = _capture(path)
    try:
        header = _header(capture, path, limits)
        indices = sampled_indices(header, limits)
        wanted, kept = set(indices.tolist()), {}
        for index in range(int(indices[-1]) + 1):
            if not capture.grab():
                raise VideoError(path, f"unreadable video (it ends after {index} of {header.frames} frames)")
            if index in wanted:
                ok, frame = capture.retrieve()
                if not ok:
                    raise VideoError(path, f"unreadable video (frame {index} does not decode)")
                kept[index] = _scaled(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), limits.max_pixels)
    finally:
        capture.release()
    frames = np.stack([kept[int(i)] for i in indices])  # [F, H, W, 3] uint8
    return Video(frames, fps=len(indices) / header.frames * header.fps)

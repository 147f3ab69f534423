"""Short clips of coloured dots, described by their tracks and rendered with numpy, and what can be read back from
their frames.

A :class:`Clip` is the whole ground truth of a video task: per dot (:class:`Track`) its centre and whether it is
visible in every frame. The frames are rendered from it exactly (a dot is the disc ``dx^2 + dy^2 <= r^2`` around an
integer centre, in one flat colour, never cut by the frame edge), so the centre of a dot in a frame is the centroid of
the pixels of its colour there (:func:`centroids`). The time transforms of the consistency twins (:meth:`Clip.reversed`,
:meth:`Clip.cropped`, :meth:`Clip.repeated`) act on the tracks, and the twin's frames are those of the original in the
new order: rendering commutes with them.

>>> clip = Clip(32, 4.0, (230, 230, 230), (Track(RED, 3, ((5, 16), (10, 16), (15, 16)), (True, True, True)),))
>>> clip.frames().shape, centroids(clip.frames(), RED)[-1]
((3, 32, 32, 3), (15.0, 16.0))
>>> np.array_equal(clip.reversed().frames(), clip.frames()[::-1])
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from app.types import Video

Color = tuple[int, int, int]

RED: Color = (220, 30, 30)
BLUE: Color = (30, 60, 220)
LINE: Color = (60, 60, 60)
"""The dark grey of the order task's vertical line."""


@dataclass(frozen=True)
class Track:
    """One dot through a clip.

    Attributes:
        color: its RGB colour.
        radius: its radius in pixels (>= 1).
        xy: its integer centre ``(x, y)`` in every frame (x to the right, y down), kept ``radius`` pixels inside.
        visible: whether it is drawn in every frame.
    """

    color: Color
    radius: int
    xy: tuple[tuple[int, int], ...]
    visible: tuple[bool, ...]

    def __post_init__(self):
        if len(self.xy) != len(self.visible) or not self.xy:
            raise ValueError(
                f"a track needs one centre and one visibility per frame, got {len(self.xy)} and {len(self.visible)}"
            )
        if self.radius < 1:
            raise ValueError(f"a track's radius must be >= 1, got {self.radius}")

    def select(self, frames: list[int]) -> Track:
        """The track at the given frame indices, in their order."""
        return dataclasses.replace(
            self, xy=tuple(self.xy[i] for i in frames), visible=tuple(self.visible[i] for i in frames)
        )

    def centres(self) -> list[tuple[int, int] | None]:
        """Its centre per frame, None where it is not visible."""
        return [xy if shown else None for xy, shown in zip(self.xy, self.visible, strict=True)]


@dataclass(frozen=True)
class Clip:
    """A square clip: a background, an optional vertical line, and dots drawn in order (a later one on top).

    Attributes:
        size: side of the frames in pixels.
        fps: frames per second.
        background: RGB colour of the background.
        tracks: the dots, all with the same number of frames.
        line_x: the column of a one-pixel vertical line in :data:`LINE` colour under the dots; None: no line.
    """

    size: int
    fps: float
    background: Color
    tracks: tuple[Track, ...]
    line_x: int | None = None

    def __post_init__(self):
        lengths = {len(track.xy) for track in self.tracks}
        if len(lengths) != 1:
            raise ValueError(
                f"a clip needs at least one track, all with the same number of frames, got {sorted(lengths)}"
            )
        for track in self.tracks:
            for x, y in track.xy:
                if not (track.radius <= min(x, y) and max(x, y) <= self.size - 1 - track.radius):
                    raise ValueError(f"a dot of radius {track.radius} at {(x, y)} does not fit in {self.size} px")

    @property
    def num_frames(self) -> int:
        return len(self.tracks[0].xy)

    def frames(self) -> np.ndarray:
        """The rendered ``[F, size, size, 3]`` uint8 frames."""
        frames = np.empty((self.num_frames, self.size, self.size, 3), dtype=np.uint8)
        frames[:] = self.background
        if self.line_x is not None:
            frames[:, :, self.line_x] = LINE
        ys, xs = np.mgrid[: self.size, : self.size]
        for track in self.tracks:
            for frame, centre in zip(frames, track.centres(), strict=True):
                if centre is not None:
                    frame[(xs - centre[0]) ** 2 + (ys - centre[1]) ** 2 <= track.radius**2] = track.color
        return frames

    def video(self) -> Video:
        return Video(self.frames(), fps=self.fps)

    def _select(self, frames: list[int], fps: float | None = None) -> Clip:
        tracks = tuple(track.select(frames) for track in self.tracks)
        return dataclasses.replace(self, tracks=tracks, fps=self.fps if fps is None else fps)

    def reversed(self) -> Clip:
        """The clip played backwards."""
        return self._select(list(range(self.num_frames))[::-1])

    def cropped(self, start: int, stop: int) -> Clip:
        """Frames ``start .. stop - 1`` (a temporal crop, at least one frame)."""
        if not 0 <= start < stop <= self.num_frames:
            raise ValueError(f"a crop needs 0 <= start < stop <= {self.num_frames}, got {start} and {stop}")
        return self._select(list(range(start, stop)))

    def repeated(self, factor: int) -> Clip:
        """Every frame shown ``factor`` times at ``factor`` times the frame rate: the same motion over the same
        seconds, at a higher frame rate."""
        if factor < 1:
            raise ValueError(f"the repeat factor must be >= 1, got {factor}")
        return self._select([i for i in range(self.num_frames) for _ in range(factor)], self.fps * factor)


def centroids(frames: np.ndarray, color: Color) -> list[tuple[float, float] | None]:
    """The centroid ``(x, y)`` of the pixels of exactly ``color`` in each of ``frames`` ``[F, H, W, 3]``; None in a
    frame without any."""
    out: list[tuple[float, float] | None] = []
    for frame in frames:
        ys, xs = np.nonzero(np.all(frame == np.asarray(color, dtype=np.uint8), axis=-1))
        out.append((float(xs.mean()), float(ys.mean())) if xs.size else None)
    return out


def runs(visible: list[bool] | tuple[bool, ...]) -> int:
    """The number of maximal runs of consecutive True values.

    >>> runs([False, True, True, False, True]), runs([])
    (2, 0)
    """
    return sum(1 for i, shown in enumerate(visible) if shown and (i == 0 or not visible[i - 1]))

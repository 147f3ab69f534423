"""Video reasoning tasks with verifiable answers: clips of a red and a blue dot (:mod:`app.tasks.motion.clips`), and a
question about the red one whose answer the clip decides.

- :class:`DirectionDataset` (``motion_direction``): "Is the red dot moving to the right?" (or left, up, down): yes/no.
- :class:`OrderDataset` (``motion_order``): "Does the red dot cross the grey line before the blue dot?": yes/no.
- :class:`EventCountDataset` (``motion_count``): "How many times does the red dot appear?": a number.

The answers are in the form :class:`~app.rewards.AccuracyReward` reads ("yes" / "no", an integer), and each sample's
``meta`` holds the ground truth it follows from (the centres of the dots per frame, the line, the crossings, the
visibility). A clip is kept only where its answer is decided with a margin (:meth:`MotionDataset.label` is None
otherwise, and the scene is drawn again): a direction over at least ``image_size / 16`` pixels and larger than any
sideways drift, two crossings in different frames with no dot centred on the line, a dot that appears at least once.
The yes/no answers are balanced exactly, as in :class:`~app.tasks.dots.DotsDataset`: indices ``2j`` and ``2j + 1``
hold one "yes" and one "no".

>>> sample = DirectionDataset(num_samples=2, seed=0)[0]
>>> sample.task, sample.question[:7], sample.videos[0].frames.shape[1:], sample.answer in ("yes", "no")
('motion_direction', '<video>', (64, 64, 3), True)
"""

from __future__ import annotations

import abc
import math
import random
from typing import Any, ClassVar

from app.tasks.base import SeededDataset
from app.tasks.motion.clips import BLUE, RED, Clip, Color, Track, runs
from app.tasks.motion.splits import SPLITS, SplitName
from app.types import VIDEO_TOKEN, VisualSample

Query = dict[str, Any]
"""What a question asks beyond the clip (the direction task's asked direction); empty for the other tasks."""
_MAX_SCENE_TRIES = 100

DIRECTIONS = {"right": (0, 1), "left": (0, -1), "down": (1, 1), "up": (1, -1)}
"""Asked direction -> (axis: 0 for x, 1 for y, sign along it); y grows downwards."""
_PHRASES = {"right": "to the right", "left": "to the left", "down": "down", "up": "up"}


def _direction(axis: int, sign: int) -> str:
    return next(name for name, value in DIRECTIONS.items() if value == (axis, sign))


def red_track(clip: Clip) -> Track:
    return next(track for track in clip.tracks if track.color == RED)


def blue_track(clip: Clip) -> Track:
    return next(track for track in clip.tracks if track.color == BLUE)


class MotionDataset(SeededDataset, abc.ABC):
    """A motion task: ``num_samples`` clips rendered on access; sample ``i`` depends only on ``(seed, i)`` and the
    arguments.

    Args:
        num_samples: length of the data set.
        seed: data set seed.
        image_size: side of the square frames in pixels (>= 32).
        split: ``in_domain`` or ``shifted`` (:data:`~app.tasks.motion.splits.SPLITS`): the ranges of frames, dot sizes,
            speeds, drift, backgrounds and counts the clips are drawn from.
        fps: frames per second of the clips (> 0).
        labeled: when False, ``answer`` and ``reasoning`` are None (label-free training); the clip is unchanged.

    A subclass draws a scene (:meth:`scene`), reads its answer off the clip (:meth:`label`: None where the clip does
    not decide it with a margin) and words the sample (:meth:`describe`). :attr:`reverse_relation` is what playing the
    clip backwards does to the answer.
    """

    task: ClassVar[str]
    reverse_relation: ClassVar[str]
    """``negation`` when playing the clip backwards flips the (yes/no) answer, ``identity`` when it keeps it."""

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 64,
        split: SplitName = "in_domain",
        fps: float = 4.0,
        labeled: bool = True,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        if image_size < 32:
            raise ValueError(f"image_size must be >= 32 for the motion tasks, got {image_size}")
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        super().__init__(num_samples, seed, image_size)
        self.split_name, self.split = split, SPLITS[split]
        self.fps, self.labeled = float(fps), labeled

    # ---------------------------------------------------------------------------------------------- subclasses
    @abc.abstractmethod
    def scene(self, rng: random.Random, index: int) -> tuple[Clip, Query]:
        """A clip of sample ``index`` and what its question asks, drawn from ``rng``."""

    @abc.abstractmethod
    def label(self, clip: Clip, query: Query) -> bool | int | None:
        """The answer ``clip`` gives to the question (True for "yes"), or None where it does not decide it."""

    @abc.abstractmethod
    def describe(self, clip: Clip, query: Query, value: bool | int) -> tuple[str, str, str, dict[str, Any]]:
        """The question (without the video placeholder), answer, reasoning and task-specific ``meta`` of a clip whose
        answer is ``value``."""

    # ------------------------------------------------------------------------------------------------- shared
    def answer_for(self, index: int) -> bool:
        """The yes/no answer of sample ``index``: one of each in every pair ``(2j, 2j + 1)``."""
        first_is_yes = random.Random(f"{self.stream}-pair:{self.seed}:{index // 2}").random() < 0.5
        return (index % 2 == 0) == first_is_yes

    def scene_for(self, index: int) -> tuple[Clip, Query]:
        """The clip of sample ``index`` and its query: scenes are drawn until one decides its answer."""
        rng = self.rng(index)
        for _ in range(_MAX_SCENE_TRIES):
            clip, query = self.scene(rng, index)
            if self.label(clip, query) is not None:
                return clip, query
        raise RuntimeError(
            f"{type(self).__name__}: no decided scene in {_MAX_SCENE_TRIES} draws for index {index} "
            f"(image_size={self.image_size}, split={self.split_name!r})"
        )

    def build(self, clip: Clip, query: Query) -> VisualSample:
        """The sample of a clip: its video, question, answer and ``meta`` (the ground truth read off the clip)."""
        value = self.label(clip, query)
        if value is None:
            raise ValueError(f"{type(self).__name__}: the clip does not decide the answer (query {query})")
        question, answer, reasoning, meta = self.describe(clip, query, value)
        red, blue = red_track(clip), blue_track(clip)
        meta.update(
            red_xy=red.centres(),
            blue_xy=blue.centres(),
            radius=red.radius,
            num_frames=clip.num_frames,
            fps=clip.fps,
            image_size=clip.size,
            background=clip.background,
            split=self.split_name,
        )
        return VisualSample(
            images=[],
            question=VIDEO_TOKEN + question,
            task=self.task,
            answer=answer if self.labeled else None,
            reasoning=reasoning if self.labeled else None,
            meta=meta,
            videos=[clip.video()],
        )

    def sample(self, index: int) -> VisualSample:
        return self.build(*self.scene_for(index))

    # -------------------------------------------------------------------------------------------------- drawing
    def _radius(self, rng: random.Random) -> int:
        return max(1, round(self.split.scaled(self.image_size, rng.randint(*self.split.radius))))

    def _speed(self, rng: random.Random) -> float:
        return self.split.scaled(self.image_size, rng.uniform(*self.split.speed))

    def _background(self, rng: random.Random) -> Color:
        return rng.choice(self.split.backgrounds)

    def _linear_track(
        self, rng: random.Random, color: Color, radius: int, frames: int, axis: int, sign: int, drift: float = 0.0
    ) -> Track:
        """A dot moving at constant velocity, ``sign`` along ``axis``, at most ``drift`` of its speed sideways, its
        start drawn among those that keep it inside the frame (the speed capped so that one exists)."""
        size = self.image_size
        room = size - 1 - 2 * radius  # the range of the centre
        speed = min(self._speed(rng), room / (frames - 1))
        velocity = [0.0, 0.0]
        velocity[axis] = sign * speed
        velocity[1 - axis] = rng.uniform(-drift, drift) * speed
        start = []
        for v in velocity:
            travel = v * (frames - 1)
            start.append(rng.uniform(radius + max(0.0, -travel), size - 1 - radius - max(0.0, travel)))
        xy = tuple((round(start[0] + velocity[0] * t), round(start[1] + velocity[1] * t)) for t in range(frames))
        return Track(color, radius, xy, (True,) * frames)


class DirectionDataset(MotionDataset):
    """Is the red dot moving to the right (left, up, down)? A blue dot moves its own way as a distractor.

    The red dot moves at constant velocity along the asked axis, towards or away from the asked side (``yes`` /
    ``no``, balanced), with a sideways drift in the ``shifted`` split. Its direction is that of its displacement from
    the first frame to the last, at least ``image_size / 16`` pixels and larger than the sideways one, so playing the
    clip backwards flips the answer (:attr:`reverse_relation` ``negation``). ``meta``: ``asked``, ``moving`` (the
    direction of the motion on the asked axis), ``displacement`` ``(dx, dy)``.
    """

    stream = "motion-direction"
    task = "motion_direction"
    reverse_relation = "negation"

    @property
    def min_displacement(self) -> int:
        return max(2, round(self.image_size / 16))

    def scene(self, rng: random.Random, index: int) -> tuple[Clip, Query]:
        frames = rng.randint(*self.split.frames)
        asked = rng.choice(tuple(DIRECTIONS))
        axis, sign = DIRECTIONS[asked]
        moving = sign if self.answer_for(index) else -sign
        red = self._linear_track(rng, RED, self._radius(rng), frames, axis, moving, self.split.drift)
        blue_axis, blue_sign = DIRECTIONS[rng.choice(tuple(DIRECTIONS))]
        blue = self._linear_track(rng, BLUE, self._radius(rng), frames, blue_axis, blue_sign, self.split.drift)
        return Clip(self.image_size, self.fps, self._background(rng), (blue, red)), {"asked": asked}

    def label(self, clip: Clip, query: Query) -> bool | None:
        red = red_track(clip)
        axis, sign = DIRECTIONS[query["asked"]]
        displacement = [red.xy[-1][k] - red.xy[0][k] for k in (0, 1)]
        along, sideways = displacement[axis], displacement[1 - axis]
        if not all(red.visible) or abs(along) < self.min_displacement or abs(sideways) >= abs(along):
            return None
        return (along > 0) == (sign > 0)

    def describe(self, clip: Clip, query: Query, value: bool) -> tuple[str, str, str, dict[str, Any]]:
        asked = query["asked"]
        axis, sign = DIRECTIONS[asked]
        moving = _direction(axis, sign if value else -sign)
        red = red_track(clip)
        displacement = (red.xy[-1][0] - red.xy[0][0], red.xy[-1][1] - red.xy[0][1])
        return (
            f"Is the red dot moving {_PHRASES[asked]}?",
            "yes" if value else "no",
            f"the red dot moves {_PHRASES[moving]}",
            {"asked": asked, "moving": moving, "displacement": displacement},
        )


class OrderDataset(MotionDataset):
    """Does the red dot cross the grey line before the blue dot?

    A dark grey vertical line (``meta["line_x"]``) near the middle; the red and the blue dot each move horizontally at
    constant velocity, in its own lane (no overlap), each way at random, and cross the line exactly once, in different
    frames. A dot has crossed in the first frame where its centre is on the other side of the line than in the first
    frame (``meta["crossings"]``: that frame per colour); no centre is ever on the line. Playing the clip backwards
    moves the crossing of frame ``c`` to frame ``F - c``, which reverses their order (:attr:`reverse_relation`
    ``negation``).
    """

    stream = "motion-order"
    task = "motion_order"
    reverse_relation = "negation"

    def scene(self, rng: random.Random, index: int) -> tuple[Clip, Query]:
        size, frames, radius = self.image_size, rng.randint(*self.split.frames), self._radius(rng)
        line_x = size // 2 + rng.randint(-(size // 8), size // 8)
        lanes = sorted(rng.sample(range(radius, size - radius), 2))
        while lanes[1] - lanes[0] < 2 * radius + 2:  # discs in their own rows
            lanes = sorted(rng.sample(range(radius, size - radius), 2))
        rng.shuffle(lanes)
        first, second = sorted(rng.sample(range(1, frames), 2))
        crossings = (first, second) if self.answer_for(index) else (second, first)
        tracks = [
            self._crossing_track(rng, color, radius, frames, line_x, y, crossing)
            for color, y, crossing in zip((RED, BLUE), lanes, crossings, strict=True)
        ]
        return Clip(size, self.fps, self._background(rng), (tracks[1], tracks[0]), line_x=line_x), {}

    def _crossing_track(
        self, rng: random.Random, color: Color, radius: int, frames: int, line_x: int, y: int, crossing: int
    ) -> Track:
        """A dot moving horizontally whose centre passes ``line_x`` between frames ``crossing - 1`` and ``crossing``:
        its offsets from the line rounded away from it, so that no centre is on the line however slow the dot."""
        sign = rng.choice((1, -1))
        at = crossing - 1 + rng.uniform(0.3, 0.7)  # the (fractional) frame where the centre is on the line
        behind, ahead = line_x - radius, self.image_size - 1 - radius - line_x  # room on the start and far side
        if sign < 0:
            behind, ahead = ahead, behind
        speed = min(self._speed(rng), behind / at, ahead / (frames - 1 - at))
        offsets = [sign * speed * (t - at) for t in range(frames)]  # never 0: ``at`` is not a whole frame
        low, high = radius, self.image_size - 1 - radius  # (the speed keeps them inside, but for float rounding)
        xy = tuple((min(high, max(low, line_x + (math.ceil(d) if d > 0 else math.floor(d)))), y) for d in offsets)
        return Track(color, radius, xy, (True,) * frames)

    @staticmethod
    def crossing(track: Track, line_x: int) -> int | None:
        """The frame where ``track`` is first on the other side of ``line_x``; None unless it crosses exactly once and
        is never centred on the line."""
        sides = [(x > line_x) - (x < line_x) for x, _ in track.xy]
        changes = [t for t in range(1, len(sides)) if sides[t] != sides[t - 1]]
        return changes[0] if 0 not in sides and len(changes) == 1 else None

    def label(self, clip: Clip, query: Query) -> bool | None:
        red, blue = red_track(clip), blue_track(clip)
        if clip.line_x is None or not (all(red.visible) and all(blue.visible)):
            return None
        red_at, blue_at = self.crossing(red, clip.line_x), self.crossing(blue, clip.line_x)
        if red_at is None or blue_at is None or red_at == blue_at:
            return None
        return red_at < blue_at

    def describe(self, clip: Clip, query: Query, value: bool) -> tuple[str, str, str, dict[str, Any]]:
        line_x = clip.line_x
        crossings = {"red": self.crossing(red_track(clip), line_x), "blue": self.crossing(blue_track(clip), line_x)}
        return (
            "Does the red dot cross the grey line before the blue dot?",
            "yes" if value else "no",
            f"the {'red' if value else 'blue'} dot crosses the line first",
            {"line_x": line_x, "crossings": crossings},
        )


class EventCountDataset(MotionDataset):
    """How many times does the red dot appear?

    The red dot drifts horizontally and is shown in ``count`` separate runs of frames (an appearance is a run of
    consecutive frames where it is visible, one at the start included); a blue dot in the other half of the frame
    appears its own number of times as a distractor. The count is drawn from the split's ``counts`` (at most what the
    clip's frames allow) and the visible and hidden frames are spread at random. Playing the clip backwards, a temporal
    crop that keeps a frame of every appearance, or a higher frame rate keep the count (:attr:`reverse_relation`
    ``identity``). ``meta``: ``count``, ``red_visible``, ``blue_count``.
    """

    stream = "motion-count"
    task = "motion_count"
    reverse_relation = "identity"

    def scene(self, rng: random.Random, index: int) -> tuple[Clip, Query]:
        size, frames = self.image_size, rng.randint(*self.split.frames)
        low, high = self.split.counts
        half = size // 2
        tracks = []
        for color, top in zip((RED, BLUE), rng.sample((True, False), 2), strict=True):
            radius = min(self._radius(rng), (half - 1) // 2)
            count = rng.randint(min(low, (frames + 1) // 2), min(high, (frames + 1) // 2))
            y = rng.randint(radius, half - 1 - radius) if top else rng.randint(half + radius, size - 1 - radius)
            moving = self._linear_track(rng, color, radius, frames, 0, rng.choice((1, -1)))
            xy = tuple((x, y) for x, _ in moving.xy)
            tracks.append(Track(color, radius, xy, self._appearances(rng, frames, count)))
        return Clip(size, self.fps, self._background(rng), (tracks[1], tracks[0])), {}

    @staticmethod
    def _appearances(rng: random.Random, frames: int, count: int) -> tuple[bool, ...]:
        """A visibility per frame with exactly ``count`` runs: each run and each gap between runs one frame, the
        frames left over given one at a time to a run, an inner gap or the hidden start or end, drawn uniformly."""
        slots = [1] * count + [1] * (count - 1) + [0, 0]  # runs, inner gaps, leading and trailing gaps
        for _ in range(frames - (2 * count - 1)):
            slots[rng.randrange(len(slots))] += 1
        runs_, gaps, (lead, trail) = slots[:count], slots[count : 2 * count - 1], slots[2 * count - 1 :]
        visible = [False] * lead
        for i, run in enumerate(runs_):
            visible += [True] * run + ([False] * gaps[i] if i < count - 1 else [])
        return tuple(visible + [False] * trail)

    def label(self, clip: Clip, query: Query) -> int | None:
        count = runs(red_track(clip).visible)
        return count or None

    def describe(self, clip: Clip, query: Query, value: int) -> tuple[str, str, str, dict[str, Any]]:
        return (
            "How many times does the red dot appear?",
            str(value),
            f"the red dot appears {value} time{'s' if value != 1 else ''}",
            {
                "count": value,
                "red_visible": list(red_track(clip).visible),
                "blue_count": runs(blue_track(clip).visible),
            },
        )

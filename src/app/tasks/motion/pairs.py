"""Label-free consistency twins of the motion tasks (OT-GRPO's verifier, docs/algorithms.md#papers): each item is a
motion prompt ``x`` and a twin ``x'`` whose clip is ``x``'s changed in time, with the question unchanged.

The twin applies each of :data:`TRANSFORMS` independently with probability ``transform_prob`` (drawn from
``(seed, index)``), in this order:

- ``crop``: a temporal crop, frames ``a .. b - 1`` with at least half the frames (and two) kept, drawn among the
  windows where the clip still decides the same answer (the direction still over the margin, both crossings inside,
  a frame of every appearance);
- ``double_rate``: every frame shown twice at twice the frame rate (the same motion, over the same seconds);
- ``reverse``: the clip played backwards: it negates the direction and the order answers and keeps the count (the
  task's :attr:`~app.tasks.motion.MotionDataset.reverse_relation`).

``x'.meta["relation"]`` is ``negation`` when the twin is reversed and the task's answer flips with it, else
``identity``; ``meta["transforms"]`` lists the transforms and ``meta["crop"]`` the window ``[a, b]`` of ``x``'s frames;
both prompts share ``meta["pair_id"]``, the contract of :class:`~app.tasks.dots.PairedDotsDataset` that
:func:`app.rewards.groups.pair_groups` reads. Every twin's answer is read off its own clip again and checked against
the relation, so an emitted pair always holds it. Labels (when ``labeled``) follow the clips; consistency rewards never
read them.

>>> x, twin = PairedDirectionDataset(num_samples=2, seed=0)[0]
>>> x.meta["pair_id"] == twin.meta["pair_id"], twin.meta["relation"] in ("identity", "negation")
(True, True)
"""

from __future__ import annotations

import abc
import random
from collections.abc import Sequence

from app.tasks.base import SeededDataset
from app.tasks.motion.clips import Clip
from app.tasks.motion.splits import SplitName
from app.tasks.motion.tasks import DirectionDataset, EventCountDataset, MotionDataset, OrderDataset, Query
from app.types import VisualSample

TRANSFORMS = ("crop", "double_rate", "reverse")
"""Every transform, in the order their probabilities are drawn and they apply."""


def crop_windows(task: MotionDataset, clip: Clip, query: Query) -> list[tuple[int, int]]:
    """The temporal crops ``(a, b)`` of ``clip`` other than the whole clip that keep at least half its frames (and two)
    and decide the same answer."""
    frames, value = clip.num_frames, task.label(clip, query)
    shortest = max(2, frames // 2)
    return [
        (a, b)
        for a in range(frames)
        for b in range(a + shortest, frames + 1)
        if (a, b) != (0, frames) and task.label(clip.cropped(a, b), query) == value
    ]


def make_twin(
    task: MotionDataset, clip: Clip, query: Query, transforms: Sequence[str], rng: random.Random
) -> tuple[VisualSample, str, list[int]]:
    """The twin of ``task``'s sample of ``clip``: ``transforms`` (a subset of :data:`TRANSFORMS`) applied, the crop
    window drawn from ``rng`` (the whole clip when no other window keeps the answer). Returns the twin, its relation to
    the original's answer and the window ``[a, b]``.

    Raises:
        RuntimeError: the twin's clip does not give the answer the relation says (a bug in a task, never expected).
    """
    unknown = set(transforms) - set(TRANSFORMS)
    if unknown:
        raise ValueError(f"unknown transforms {sorted(unknown)}; expected a subset of {TRANSFORMS}")
    value, window, twin = task.label(clip, query), [0, clip.num_frames], clip
    if "crop" in transforms and (windows := crop_windows(task, clip, query)):
        window = list(rng.choice(windows))
        twin = twin.cropped(*window)
    if "double_rate" in transforms:
        twin = twin.repeated(2)
    if "reverse" in transforms:
        twin = twin.reversed()
    relation = task.reverse_relation if "reverse" in transforms else "identity"
    expected = (not value) if relation == "negation" else value
    if task.label(twin, query) != expected:
        raise RuntimeError(
            f"{type(task).__name__}: the twin ({list(transforms)}) answers {task.label(twin, query)!r}, but the "
            f"relation {relation!r} of the original's {value!r} says {expected!r}"
        )
    return task.build(twin, query), relation, window


class PairedMotionDataset(SeededDataset, abc.ABC):
    """``num_samples`` pairs ``(x, x')``: ``x`` is sample ``i`` of the task (:meth:`make_task`), ``x'`` its twin in
    time. The data module's collate function flattens the pairs, each twin right after its original.

    Args:
        num_samples: number of pairs.
        seed: data set seed; the clips and the twins' transforms of item ``i`` depend only on ``(seed, i)``.
        image_size: side of the square frames in pixels.
        split: ``in_domain`` or ``shifted``, as in :class:`~app.tasks.motion.MotionDataset`.
        fps: frames per second of the originals.
        labeled: when False, both prompts have ``answer`` and ``reasoning`` None (label-free training).
        transform_prob: probability, in ``[0, 1]``, that the twin applies each transform (drawn independently).
        transforms: the transforms the twin may apply, a subset of :data:`TRANSFORMS`. A transform left out is still
            drawn and then dropped, so the other transforms' draws stay those of the full set. ``["reverse"]`` makes
            every twin of the direction and order tasks a copy or a negation.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 64,
        split: SplitName = "in_domain",
        fps: float = 4.0,
        labeled: bool = True,
        transform_prob: float = 0.5,
        transforms: Sequence[str] = TRANSFORMS,
    ) -> None:
        if not 0.0 <= transform_prob <= 1.0:
            raise ValueError(f"transform_prob must be in [0, 1], got {transform_prob}")
        unknown = set(transforms) - set(TRANSFORMS)
        if unknown:
            raise ValueError(f"unknown transforms {sorted(unknown)}; expected a subset of {TRANSFORMS}")
        self.base = self.make_task(num_samples, seed, image_size, split, fps, labeled)
        super().__init__(num_samples, seed, image_size)
        self.transform_prob = transform_prob
        self.transforms = tuple(transforms)
        self.task = f"{self.base.task}_pairs"

    @staticmethod
    @abc.abstractmethod
    def make_task(
        num_samples: int, seed: int, image_size: int, split: SplitName, fps: float, labeled: bool
    ) -> MotionDataset:
        """The task whose samples are the originals."""

    def transforms_for(self, index: int) -> tuple[str, ...]:
        rng = self.rng(index)
        drawn = [t for t in TRANSFORMS if rng.random() < self.transform_prob]  # all drawn: see ``transforms``
        return tuple(t for t in drawn if t in self.transforms)

    def sample(self, index: int) -> tuple[VisualSample, VisualSample]:
        clip, query = self.base.scene_for(index)
        x = self.base.build(clip, query)
        pair_id = f"{self.task}:{self.seed}:{index}"
        transforms = self.transforms_for(index)
        view_rng = random.Random(f"{self.stream}-view:{self.seed}:{index}")
        twin, relation, window = make_twin(self.base, clip, query, transforms, view_rng)
        x.task = twin.task = self.task
        x.meta.update(pair_id=pair_id, transforms=[])
        twin.meta.update(pair_id=pair_id, relation=relation, transforms=list(transforms), crop=window)
        return x, twin


class PairedDirectionDataset(PairedMotionDataset):
    """Pairs of :class:`~app.tasks.motion.DirectionDataset` (``motion_direction_pairs``): a reversed twin negates the
    answer."""

    stream = "motion-direction-twin"

    @staticmethod
    def make_task(num_samples, seed, image_size, split, fps, labeled) -> MotionDataset:
        return DirectionDataset(num_samples, seed, image_size, split, fps, labeled)


class PairedOrderDataset(PairedMotionDataset):
    """Pairs of :class:`~app.tasks.motion.OrderDataset` (``motion_order_pairs``): a reversed twin negates the answer."""

    stream = "motion-order-twin"

    @staticmethod
    def make_task(num_samples, seed, image_size, split, fps, labeled) -> MotionDataset:
        return OrderDataset(num_samples, seed, image_size, split, fps, labeled)


class PairedEventCountDataset(PairedMotionDataset):
    """Pairs of :class:`~app.tasks.motion.EventCountDataset` (``motion_count_pairs``): every twin keeps the count
    (``identity``), for :class:`~app.rewards.consistency.ConsistencyReward` with ``answer_type: count``."""

    stream = "motion-count-twin"

    @staticmethod
    def make_task(num_samples, seed, image_size, split, fps, labeled) -> MotionDataset:
        return EventCountDataset(num_samples, seed, image_size, split, fps, labeled)

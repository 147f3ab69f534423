"""Paired prompts for consistency training (OT-GRPO, docs/algorithms.md#papers): each item is a dots prompt and an
augmented twin.

The twin ``x'`` of a dots scene ``x`` applies, each independently with probability 1/2 (drawn from ``(seed, index)``):

- ``hflip``: the image mirrored left-right; red and blue change sides, so the answer flips (``negation``);
- ``swap_objects``: the question asks "Is the blue dot left of the red dot?"; the answer flips (``negation``).

Effects compose by parity: both transforms give ``identity``, as does neither (then ``x'`` is ``x`` asked again, a plain
self-consistency check). ``x'.meta["relation"]`` holds the effect and ``meta["transforms"]`` the transforms; both prompts
share ``meta["pair_id"]``. Labels (when ``labeled``) follow the relation, but consistency rewards never read them; they
serve evaluation and SFT.

>>> x, twin = PairedDotsDataset(num_samples=4, seed=0, image_size=64)[0]
>>> x.meta["pair_id"] == twin.meta["pair_id"], twin.meta["relation"] in ("identity", "negation")
(True, True)
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from PIL import Image

from app.tasks.base import SeededDataset
from app.tasks.dots.dots import QUESTION, DotsDataset
from app.types import VisualSample

TASK = "dots_left_of_pairs"
SWAPPED_QUESTION = "Is the blue dot left of the red dot?"
TRANSFORMS = ("hflip", "swap_objects")  # both negate the answer


def negate(answer: str | None) -> str | None:
    return None if answer is None else {"yes": "no", "no": "yes"}[answer]


def make_twin(sample: VisualSample, transforms: tuple[str, ...], pair_id: str) -> VisualSample:
    """The augmented twin of a dots sample: ``transforms`` (a subset of :data:`TRANSFORMS`) applied to a copy."""
    image, meta = sample.images[0], dict(sample.meta)
    red_xy, blue_xy, width = meta["red_xy"], meta["blue_xy"], image.width
    if "hflip" in transforms:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        red_xy, blue_xy = (width - 1 - red_xy[0], red_xy[1]), (width - 1 - blue_xy[0], blue_xy[1])
    else:
        image = image.copy()
    swapped = "swap_objects" in transforms
    relation = "negation" if len(transforms) % 2 else "identity"
    answer = sample.answer if relation == "identity" else negate(sample.answer)
    reasoning = None
    if answer is not None:
        first, second = ("blue", "red") if swapped else ("red", "blue")
        reasoning = f"{first} is {'left' if answer == 'yes' else 'right'} of {second}"
    meta.update(red_xy=red_xy, blue_xy=blue_xy, pair_id=pair_id, relation=relation, transforms=list(transforms))
    return dataclasses.replace(
        sample,
        images=[image],
        question=SWAPPED_QUESTION if swapped else QUESTION,
        task=TASK,
        answer=answer,
        reasoning=reasoning,
        meta=meta,
    )


class PairedDotsDataset(SeededDataset):
    """``num_samples`` pairs ``(x, x')``: ``x`` is sample ``i`` of :class:`~app.tasks.dots.DotsDataset`, ``x'`` its
    twin.

    The data module's collate function flattens the pairs, so a batch of B items is 2B prompts with each twin right
    after its original, which is the layout consistency rewards expect (:func:`app.rewards.groups.pair_groups`).

    Args:
        num_samples: number of pairs.
        seed: data set seed; scenes and transforms of item ``i`` depend only on ``(seed, i)``.
        image_size: side of the square images in pixels.
        dot_radius: radius of the dots in pixels (``image_size / 14`` when None).
        labeled: when False, both prompts have ``answer`` and ``reasoning`` None (label-free training).
        min_gap, num_distractors: as in :class:`~app.tasks.dots.DotsDataset`.
        transform_prob: probability of each transform.
        transforms: the transforms the twin may apply, a subset of :data:`TRANSFORMS` (default: all). A transform left
            out is still drawn and then dropped, so the scenes and the other transforms' draws stay those of the full
            set. ``["hflip"]`` keeps every prompt in the original wording (a model fine-tuned on that wording only
            answers a swapped question as if it were the original one).
    """

    stream = "dots-twin"

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 112,
        dot_radius: int | None = None,
        labeled: bool = True,
        min_gap: int | None = None,
        num_distractors: int = 0,
        transform_prob: float = 0.5,
        transforms: Sequence[str] = TRANSFORMS,
    ) -> None:
        if not 0.0 <= transform_prob <= 1.0:
            raise ValueError(f"transform_prob must be in [0, 1], got {transform_prob}")
        unknown = set(transforms) - set(TRANSFORMS)
        if unknown:
            raise ValueError(f"unknown transforms {sorted(unknown)}; expected a subset of {TRANSFORMS}")
        self.dots = DotsDataset(num_samples, seed, image_size, min_gap, num_distractors, labeled, dot_radius)
        super().__init__(num_samples, seed, image_size)
        self.transform_prob = transform_prob
        self.transforms = tuple(transforms)

    def transforms_for(self, index: int) -> tuple[str, ...]:
        rng = self.rng(index)
        drawn = [t for t in TRANSFORMS if rng.random() < self.transform_prob]  # all drawn: see ``transforms``
        return tuple(t for t in drawn if t in self.transforms)

    def sample(self, index: int) -> tuple[VisualSample, VisualSample]:
        x = self.dots.sample(index)
        pair_id = f"{TASK}:{self.seed}:{index}"
        x.task = TASK
        x.meta.update(pair_id=pair_id, transforms=[])
        return x, make_twin(x, self.transforms_for(index), pair_id)


class DotsPairAugmenter:
    """The on-the-fly version of :class:`PairedDotsDataset` for streamed shards: ``augment(x, rng) -> (x, x')``.

    Give it to :class:`~app.data.ShardDataModule` as ``augment``; each training sample becomes a pair whose twin
    applies each of :data:`TRANSFORMS` with probability ``transform_prob`` (drawn from ``rng``, which the data module
    seeds from the seed, the epoch and the sample's key). It reads only the scene (the dot positions in ``meta``), never
    the answer, so it runs on label-free shards. The pair id is drawn from ``rng`` too (64 random bits): unique within
    any batch in practice, and reproducible.

    >>> import random
    >>> from app.tasks.dots.dots import DotsDataset
    >>> x, twin = DotsPairAugmenter()(DotsDataset(2, seed=0, labeled=False)[0], random.Random(0))
    >>> x.meta["pair_id"] == twin.meta["pair_id"], twin.answer is None
    (True, True)
    """

    def __init__(self, transform_prob: float = 0.5) -> None:
        if not 0.0 <= transform_prob <= 1.0:
            raise ValueError(f"transform_prob must be in [0, 1], got {transform_prob}")
        self.transform_prob = transform_prob

    def __call__(self, sample: VisualSample, rng: random.Random) -> tuple[VisualSample, VisualSample]:
        missing = [key for key in ("red_xy", "blue_xy") if key not in sample.meta]
        if missing:
            raise ValueError(f"DotsPairAugmenter needs a dots sample with meta {missing} (task {sample.task!r})")
        transforms = tuple(t for t in TRANSFORMS if rng.random() < self.transform_prob)
        pair_id = f"{TASK}:{rng.getrandbits(64):016x}"
        x = dataclasses.replace(sample, task=TASK, meta={**sample.meta, "pair_id": pair_id, "transforms": []})
        return x, make_twin(x, transforms, pair_id)

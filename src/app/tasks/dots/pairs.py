"""Paired prompts for consistency training (OT-GRPO, docs/algorithms.md#papers): each item is a dots prompt and an
augmented twin.

The twin ``x'`` of a dots scene ``x`` applies each of its transforms independently with probability ``transform_prob``
(drawn from ``(seed, index)``). Two negate the answer (:data:`NEGATING`):

- ``hflip``: the image mirrored left-right; red and blue change sides, so the answer flips (``negation``);
- ``swap_objects``: the question asks "Is the blue dot left of the red dot?"; the answer flips (``negation``).

Three keep it (:data:`PRESERVING`, applied before a mirror), so that a rule which is consistent under the mirror alone
but reads something other than the dots' order (which half of the image they sit in, how high the red dot is) is
inconsistent on some pairs:

- ``translate``: the whole scene moved to another placement where both dots stay whole (the background fills in);
- ``crop``: a square window holding both dots, resized back to the image size (the dots grow; a zoomed-in view);
- ``jitter``: brightness, contrast and saturation scaled (:func:`app.tasks.spatial.augment.color_jitter`).

Effects compose by parity: both negating transforms give ``identity``, as does neither (then ``x'`` is ``x`` asked
again, or another view of it: a plain self-consistency check). ``x'.meta["relation"]`` holds the effect and
``meta["transforms"]`` the transforms; both prompts share ``meta["pair_id"]``. Labels (when ``labeled``) follow the
relation, but consistency rewards never read them; they serve evaluation and SFT.

>>> x, twin = PairedDotsDataset(num_samples=4, seed=0, image_size=64)[0]
>>> x.meta["pair_id"] == twin.meta["pair_id"], twin.meta["relation"] in ("identity", "negation")
(True, True)
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

from PIL import Image

from app.tasks.base import SeededDataset
from app.tasks.dots.dots import BACKGROUND, QUESTION, DotsDataset
from app.tasks.spatial.augment import color_jitter
from app.types import VisualSample

TASK = "dots_left_of_pairs"
SWAPPED_QUESTION = "Is the blue dot left of the red dot?"
NEGATING = ("hflip", "swap_objects")
PRESERVING = ("translate", "crop", "jitter")
TRANSFORMS = NEGATING + PRESERVING
"""Every transform, in the order their probabilities are drawn."""


def negate(answer: str | None) -> str | None:
    return None if answer is None else {"yes": "no", "no": "yes"}[answer]


def _dots_box(meta: dict) -> tuple[int, int, int, int]:
    """The pixel box ``(x0, y0, x1, y1)`` (exclusive ends) holding the red and the blue dot whole."""
    radius = meta["twin_dot_radius"]
    xs, ys = (meta["red_xy"][0], meta["blue_xy"][0]), (meta["red_xy"][1], meta["blue_xy"][1])
    return min(xs) - radius, min(ys) - radius, max(xs) + radius + 1, max(ys) + radius + 1


def translate(image: Image.Image, meta: dict, rng: random.Random) -> Image.Image:
    """Move the scene by a shift drawn among those that keep both dots whole; ``meta``'s positions follow."""
    x0, y0, x1, y1 = _dots_box(meta)
    dx, dy = rng.randint(-x0, image.width - x1), rng.randint(-y0, image.height - y1)
    moved = Image.new("RGB", image.size, BACKGROUND)
    moved.paste(image, (dx, dy))
    meta["red_xy"] = (meta["red_xy"][0] + dx, meta["red_xy"][1] + dy)
    meta["blue_xy"] = (meta["blue_xy"][0] + dx, meta["blue_xy"][1] + dy)
    return moved


def crop(image: Image.Image, meta: dict, rng: random.Random) -> Image.Image:
    """Crop a square window holding both dots (its side drawn between the smallest that does and the whole image),
    resized back to the image size; ``meta``'s positions follow."""
    size = image.width
    x0, y0, x1, y1 = _dots_box(meta)
    x0, y0, x1, y1 = max(0, x0), max(0, y0), min(size, x1), min(size, y1)
    side = rng.randint(max(x1 - x0, y1 - y0), size)
    left, top = (
        rng.randint(max(0, x1 - side), min(x0, size - side)),
        rng.randint(max(0, y1 - side), min(y0, size - side)),
    )
    scale = size / side

    def moved(xy: tuple[int, int]) -> tuple[int, int]:
        return round((xy[0] - left + 0.5) * scale - 0.5), round((xy[1] - top + 0.5) * scale - 0.5)

    meta["red_xy"], meta["blue_xy"] = moved(meta["red_xy"]), moved(meta["blue_xy"])
    meta["twin_dot_radius"] = math.ceil(meta["twin_dot_radius"] * scale)
    return image.crop((left, top, left + side, top + side)).resize(image.size, Image.Resampling.BILINEAR)


def jitter(image: Image.Image, meta: dict, rng: random.Random) -> Image.Image:
    return color_jitter(image, meta, rng)


_PRESERVING_OPS = {"translate": translate, "crop": crop, "jitter": jitter}


def make_twin(
    sample: VisualSample,
    transforms: tuple[str, ...],
    pair_id: str,
    rng: random.Random | None = None,
    dot_radius: int | None = None,
) -> VisualSample:
    """The augmented twin of a dots sample: ``transforms`` (a subset of :data:`TRANSFORMS`) applied to a copy, the
    answer-preserving ones first (their parameters drawn from ``rng``; they also need the scene's ``dot_radius``),
    then the mirror."""
    image, meta = sample.images[0], dict(sample.meta)
    preserving = [name for name in PRESERVING if name in transforms]
    if preserving and (rng is None or dot_radius is None):
        raise ValueError(f"the {preserving} transforms draw a view of the scene: make_twin needs rng and dot_radius")
    if preserving:
        meta["twin_dot_radius"] = dot_radius
    for name in preserving:
        image = _PRESERVING_OPS[name](image, meta, rng)
    meta.pop("twin_dot_radius", None)
    red_xy, blue_xy, width = meta["red_xy"], meta["blue_xy"], image.width
    if "hflip" in transforms:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        red_xy, blue_xy = (width - 1 - red_xy[0], red_xy[1]), (width - 1 - blue_xy[0], blue_xy[1])
    elif image is sample.images[0]:
        image = image.copy()
    swapped = "swap_objects" in transforms
    relation = "negation" if sum(t in NEGATING for t in transforms) % 2 else "identity"
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
        min_gap: smallest horizontal distance in pixels between the red and blue centres (``image_size // 4`` when
            None), as in :class:`~app.tasks.dots.DotsDataset`.
        num_distractors: extra green or yellow dots per image (>= 0), as in :class:`~app.tasks.dots.DotsDataset`.
        transform_prob: probability, in ``[0, 1]``, that the twin applies each transform (drawn independently).
        transforms: the transforms the twin may apply, a subset of :data:`TRANSFORMS` (default: the two negating
            ones). A transform left out is still drawn and then dropped, so the scenes and the other transforms' draws
            stay those of the full set. ``["hflip"]`` keeps every prompt in the original wording (a model fine-tuned on
            that wording only answers a swapped question as if it were the original one); ``["hflip", "translate",
            "crop", "jitter"]`` mixes mirrored (negation) and re-viewed (identity) twins, as OT-GRPO mixes
            equivariant and invariant augmentations.
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
        transforms: Sequence[str] = NEGATING,
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
        view_rng = random.Random(f"dots-twin-view:{self.seed}:{index}")
        radius = self.dots.dot_radius or max(2, round(self.image_size / 14))  # DotsDataset's default
        return x, make_twin(x, self.transforms_for(index), pair_id, view_rng, radius)


class DotsPairAugmenter:
    """The on-the-fly version of :class:`PairedDotsDataset` for streamed shards: ``augment(x, rng) -> (x, x')``.

    Give it to :class:`~app.data.ShardDataModule` as ``augment``; each training sample becomes a pair whose twin
    applies each of :data:`NEGATING` with probability ``transform_prob`` (drawn from ``rng``, which the data module
    seeds from the seed, the epoch and the sample's key). It reads only the scene (the dot positions in ``meta``), never
    the answer, so it runs on label-free shards. The pair id is drawn from ``rng`` too (64 random bits): unique within
    any batch in practice, and reproducible.

    Args:
        transform_prob: probability, in ``[0, 1]``, that the twin applies each of :data:`NEGATING` (drawn
            independently); 0 makes every twin a copy of its original.

    Example:
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
        transforms = tuple(t for t in NEGATING if rng.random() < self.transform_prob)
        pair_id = f"{TASK}:{rng.getrandbits(64):016x}"
        x = dataclasses.replace(sample, task=TASK, meta={**sample.meta, "pair_id": pair_id, "transforms": []})
        return x, make_twin(x, transforms, pair_id)

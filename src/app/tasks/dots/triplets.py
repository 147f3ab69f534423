"""A procedural triplet task for TriSR (CoRe, docs/algorithms.md#papers): three images with different numbers of dots;
for each pair of images, which one has more?

The CoRe pipeline, cut down to what a test or a CPU recipe needs: the metric (the dot count) is known by construction,
quality control keeps the three counts distinct (every pairwise answer is decided, no ties), and the question asks the
three pairwise sub-questions in the structured format of :mod:`app.formats`. Ground truth goes to
``sample.meta`` in the schema of :mod:`app.rewards.trisr`; ``sample.answer`` and ``sample.reasoning`` hold the target
response, so SFT and :class:`~app.rewards.AccuracyReward` (exact match of the whole answer block) work as well.

>>> import random
>>> sample = make_dots_triplet_sample(random.Random(0))
>>> len(sample.images), sample.task, sorted(sample.meta["pair_answers"])
(3, 'dots_count_triplets', ['1-2', '1-3', '2-3'])
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw

from app.formats import PAIRS, TRIPLET_RESPONSE_INSTRUCTION, format_triplet_response
from app.tasks.base import SeededDataset
from app.types import VisualSample

TASK = "dots_count_triplets"
QUESTION = (
    "Image 1, Image 2 and Image 3 each show some dots. For each pair of images, which image has more dots?"
    " Answer each pair with the number of the image that has more dots."
)
BACKGROUND = (230, 230, 230)
DOT = (30, 60, 220)
_MAX_PLACEMENT_TRIES = 1000


def _render_dots(
    rng: random.Random, count: int, image_size: int, radius: int, color: tuple[int, int, int] = DOT
) -> Image.Image:
    """``count`` non-overlapping dots (the count is the ground truth, so a dot that cannot be placed is an error)."""
    lo, hi = radius, image_size - 1 - radius
    centres: list[tuple[int, int]] = []
    for _ in range(count):
        for _ in range(_MAX_PLACEMENT_TRIES):
            xy = (rng.randint(lo, hi), rng.randint(lo, hi))
            if all((xy[0] - x) ** 2 + (xy[1] - y) ** 2 > (2 * radius + 2) ** 2 for x, y in centres):
                centres.append(xy)
                break
        else:
            raise ValueError(f"cannot place {count} dots of radius {radius} in {image_size} px; use fewer or smaller")
    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for x, y in centres:
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=color)
    return image


def make_dots_triplet_sample(
    rng: random.Random,
    image_size: int = 64,
    min_count: int = 1,
    max_count: int = 6,
    dot_radius: int | None = None,
) -> VisualSample:
    """Three dot images with three distinct counts, the pairwise question, and the TriSR ground truth.

    ``meta``: ``attributes`` (the three counts), ``pair_answers`` (``"1-2"`` -> the number of the image with more dots,
    as a string), ``answer_type`` (``"ordinal"``). ``answer`` is ``"1-2: 2; 1-3: 1; 2-3: 2"``-style and ``reasoning``
    the ``Image k`` / ``Compare i-j`` lines.

    Args:
        rng: the only source of randomness; the same generator state gives the same sample.
        image_size: side of each square RGB image in pixels.
        min_count: fewest dots in an image, >= 0.
        max_count: most dots in an image (inclusive), at least ``min_count + 2`` so the three counts can differ.
        dot_radius: radius in pixels; ``image_size / 14`` when None.
    """
    if not 0 <= min_count <= max_count - 2:
        raise ValueError(f"need 0 <= min_count <= max_count - 2 (three distinct counts), got {min_count}, {max_count}")
    radius = max(2, round(image_size / 14)) if dot_radius is None else dot_radius
    if radius < 1 or 2 * radius >= image_size:
        raise ValueError(f"dot_radius must be in [1, {image_size // 2 - 1}] for image_size={image_size}, got {radius}")
    counts = rng.sample(range(min_count, max_count + 1), 3)
    images = [_render_dots(rng, count, image_size, radius) for count in counts]
    answers = {}
    for pair in PAIRS:
        i, j = int(pair[0]), int(pair[2])
        answers[pair] = str(i if counts[i - 1] > counts[j - 1] else j)
    reasoning, answer = format_triplet_response(counts, answers, answers)
    return VisualSample(
        images=images,
        question=QUESTION + TRIPLET_RESPONSE_INSTRUCTION,
        task=TASK,
        answer=answer,
        reasoning=reasoning,
        meta={"attributes": counts, "pair_answers": answers, "answer_type": "ordinal", "image_size": image_size},
    )


class TripletDotsDataset(SeededDataset):
    """``num_samples`` dot triplets, rendered on access; sample ``i`` depends only on ``(seed, i)``.

    Args:
        num_samples: length of the data set.
        seed: data set seed; different seeds give different triplets.
        image_size: side of the square images in pixels.
        min_count: fewest dots in an image, >= 0; each triplet draws three distinct counts from
            ``[min_count, max_count]``.
        max_count: most dots in an image (inclusive), at least ``min_count + 2`` so the three counts can differ.
        dot_radius: radius in pixels (``image_size / 14`` when None).
        labeled: when False, ``answer``, ``reasoning`` and the ground truth in ``meta`` are dropped (the label-free
            :class:`~app.rewards.trisr.TripletConsistencyReward` still applies).
    """

    stream = "dots-triplet"

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 64,
        min_count: int = 1,
        max_count: int = 6,
        dot_radius: int | None = None,
        labeled: bool = True,
    ) -> None:
        super().__init__(num_samples, seed, image_size)
        self.min_count, self.max_count = min_count, max_count
        self.dot_radius = dot_radius
        self.labeled = labeled

    def sample(self, index: int) -> VisualSample:
        sample = make_dots_triplet_sample(
            self.rng(index), self.image_size, self.min_count, self.max_count, self.dot_radius
        )
        if not self.labeled:
            sample.answer = sample.reasoning = None
            sample.meta = {"answer_type": "ordinal", "image_size": self.image_size}
        return sample

"""The quickstart visual task: is the red dot left of the blue dot?

Images are rendered offline with PIL, so the task needs no download and every sample is rebuilt from ``(seed, index)``.
The horizontal gap between the two dots is at least ``min_gap`` pixels, so the answer survives downscaling, and the
answers of a data set are balanced exactly: indices ``2j`` and ``2j + 1`` hold one "yes" and one "no", in an order drawn
from ``(seed, j)``.

>>> sample = DotsDataset(num_samples=4, seed=0)[0]
>>> sample.task, sample.question, sample.images[0].size
('dots_left_of', 'Is the red dot left of the blue dot?', (112, 112))
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw

from app.tasks.base import SeededDataset
from app.types import VisualSample

TASK = "dots_left_of"
QUESTION = "Is the red dot left of the blue dot?"
QUESTIONS = {"left": QUESTION, "right": "Is the red dot right of the blue dot?"}
"""The question per ``relation``: the same scenes and reasoning, the answer mapped the other way for ``right``."""
BACKGROUND = (230, 230, 230)
RED = (220, 30, 30)
BLUE = (30, 60, 220)
DISTRACTOR_COLORS = ((40, 170, 60), (235, 200, 30))  # green, yellow
_MAX_PLACEMENT_TRIES = 100


def make_dots_sample(
    rng: random.Random,
    image_size: int = 112,
    min_gap: int | None = None,
    num_distractors: int = 0,
    answer: str | None = None,
    dot_radius: int | None = None,
    relation: str = "left",
) -> VisualSample:
    """Render one red/blue dot scene with its question, answer and a one-line reasoning.

    Args:
        rng: the only source of randomness; the same generator state gives the same sample.
        image_size: side of the square RGB image in pixels.
        min_gap: smallest horizontal distance between the red and blue centres; ``image_size // 4`` when None.
        num_distractors: extra green or yellow dots, placed without touching the red and blue ones when possible.
        answer: "yes" (red is left, or right with ``relation="right"``) or "no"; drawn from ``rng`` when None.
        dot_radius: radius in pixels; ``image_size / 14`` when None.
        relation: ``left`` asks "Is the red dot left of the blue dot?", ``right`` "... right of ...": the reasoning
            names the side seen either way, and the answer follows the question.
    """
    if relation not in QUESTIONS:
        raise ValueError(f"relation must be one of {sorted(QUESTIONS)}, got {relation!r}")
    radius = max(2, round(image_size / 14)) if dot_radius is None else dot_radius
    if radius < 1 or 2 * radius >= image_size:
        raise ValueError(f"dot_radius must be in [1, {image_size // 2 - 1}] for image_size={image_size}, got {radius}")
    min_gap = image_size // 4 if min_gap is None else min_gap
    lo, hi = radius, image_size - 1 - radius  # centres keep the whole dot inside the image
    if min_gap < 1 or min_gap > hi - lo:
        raise ValueError(f"min_gap must be in [1, {hi - lo}] for image_size={image_size}, got {min_gap}")
    if answer is None:
        answer = rng.choice(("yes", "no"))
    if answer not in ("yes", "no"):
        raise ValueError(f"answer must be 'yes', 'no' or None, got {answer!r}")

    gap = rng.randint(min_gap, hi - lo)
    left_x = rng.randint(lo, hi - gap)
    red_left = (answer == "yes") == (relation == "left")
    red_x, blue_x = (left_x, left_x + gap) if red_left else (left_x + gap, left_x)
    red_xy, blue_xy = (red_x, rng.randint(lo, hi)), (blue_x, rng.randint(lo, hi))

    placed = [red_xy, blue_xy]
    distractors = []
    for _ in range(num_distractors):
        for _ in range(_MAX_PLACEMENT_TRIES):
            xy = (rng.randint(lo, hi), rng.randint(lo, hi))
            if all((xy[0] - px) ** 2 + (xy[1] - py) ** 2 > (2 * radius + 1) ** 2 for px, py in placed):
                break
        placed.append(xy)
        distractors.append((xy, rng.choice(DISTRACTOR_COLORS)))

    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for xy, color in [*distractors, (red_xy, RED), (blue_xy, BLUE)]:  # red and blue on top if a distractor overlaps
        draw.ellipse((xy[0] - radius, xy[1] - radius, xy[0] + radius, xy[1] + radius), fill=color)

    side = "left" if red_left else "right"
    return VisualSample(
        images=[image],
        question=QUESTIONS[relation],
        task=TASK,
        answer=answer,
        # The reasoning names what must be seen, not pixel coordinates: with coordinates in the teacher-forced target
        # a small model learns to read the answer off its own digits and never looks at the image.
        reasoning=f"red is {side} of blue",
        meta={"red_xy": red_xy, "blue_xy": blue_xy, "image_size": image_size},
    )


class DotsDataset(SeededDataset):
    """``num_samples`` dot scenes, rendered on access; sample ``i`` depends only on ``(seed, i)``.

    Args:
        num_samples: length of the data set; answers are balanced exactly when it is even.
        seed: data set seed; different seeds give different scenes.
        image_size: side of the square images in pixels.
        min_gap: smallest horizontal distance between the red and blue centres (``image_size // 4`` when None).
        num_distractors: extra green or yellow dots per image.
        labeled: when False, ``answer`` and ``reasoning`` are None (label-free training); the scene is unchanged.
        dot_radius: radius in pixels (``image_size / 14`` when None).
        relation: ``left`` (the quickstart's question) or ``right`` ("Is the red dot right of the blue dot?"): the
            same reasoning about the side seen, the answer mapped the other way (a new skill for a model taught
            ``left``).
    """

    stream = "dots"

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 112,
        min_gap: int | None = None,
        num_distractors: int = 0,
        labeled: bool = True,
        dot_radius: int | None = None,
        relation: str = "left",
    ) -> None:
        if relation not in QUESTIONS:
            raise ValueError(f"relation must be one of {sorted(QUESTIONS)}, got {relation!r}")
        super().__init__(num_samples, seed, image_size)
        self.relation = relation
        self.min_gap = min_gap
        self.num_distractors = num_distractors
        self.labeled = labeled
        self.dot_radius = dot_radius

    def answer_for(self, index: int) -> str:
        """The answer of sample ``index``: one "yes" and one "no" in each pair ``(2j, 2j + 1)``."""
        first_is_yes = random.Random(f"dots-pair:{self.seed}:{index // 2}").random() < 0.5
        return "yes" if (index % 2 == 0) == first_is_yes else "no"

    def sample(self, index: int) -> VisualSample:
        sample = make_dots_sample(
            self.rng(index),
            self.image_size,
            self.min_gap,
            self.num_distractors,
            self.answer_for(index),
            self.dot_radius,
            self.relation,
        )
        if not self.labeled:
            sample.answer = sample.reasoning = None
        return sample

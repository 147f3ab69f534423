"""A rendered counting task for numeric rewards (Reason-RFT's visual counting, cut down to a CPU recipe).

Each image shows between ``min_count`` and ``max_count`` dots of one colour; the question asks how many; the answer is
the integer count, so :class:`~app.rewards.NumericToleranceReward` (or exact match) scores it.

>>> sample = CountingDataset(num_samples=2, seed=0)[0]
>>> sample.task, sample.answer.isdigit()
('dots_count', True)
"""

from __future__ import annotations

from app.tasks.base import SeededDataset
from app.tasks.dots.triplets import DOT, _render_dots
from app.types import VisualSample

TASK = "dots_count"
QUESTION = "How many dots are in the image?"


class CountingDataset(SeededDataset):
    """``num_samples`` counting prompts; sample i depends only on ``(seed, i)``.

    Args:
        num_samples: number of samples.
        seed: seed of the data set.
        image_size: side of the square image in pixels.
        min_count: fewest dots in an image.
        max_count: most dots in an image.
        dot_radius: dot radius in pixels (``image_size / 16`` when None).
        dot_color: RGB colour of the dots (blue when None); another colour or radius makes a domain-shift set.
        labeled: when False, ``answer`` and ``reasoning`` are None.
    """

    stream = "count"

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 64,
        min_count: int = 1,
        max_count: int = 6,
        dot_radius: int | None = None,
        dot_color: tuple[int, int, int] | None = None,
        labeled: bool = True,
    ) -> None:
        if not 0 <= min_count <= max_count:
            raise ValueError(f"need 0 <= min_count <= max_count, got {min_count} and {max_count}")
        super().__init__(num_samples, seed, image_size)
        self.min_count, self.max_count = min_count, max_count
        self.radius = dot_radius if dot_radius is not None else max(2, image_size // 16)
        self.color = DOT if dot_color is None else tuple(dot_color)
        if len(self.color) != 3 or not all(0 <= c <= 255 for c in self.color):
            raise ValueError(f"dot_color must be three integers in [0, 255], got {dot_color}")
        self.labeled = labeled

    def sample(self, index: int) -> VisualSample:
        rng = self.rng(index)
        count = rng.randint(self.min_count, self.max_count)
        image = _render_dots(rng, count, self.image_size, self.radius, self.color)
        answer = str(count) if self.labeled else None
        reasoning = f"I count {count} dots" if self.labeled else None
        return VisualSample([image], QUESTION, TASK, answer, reasoning, {"count": count})

"""The torch ``Dataset`` shape the Reason-RFT suites share: ``num_samples`` samples of one split, rendered lazily."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from app.tasks.base import SeededDataset
from app.types import VisualSample


class SplitDataset(SeededDataset):
    """Samples ``0 .. num_samples - 1`` of one split; sample ``i`` depends only on ``(seed, split, i)``.

    Subclasses name their ``splits`` and render one sample in :meth:`sample`, drawing from a generator seeded with the
    split (each suite's ``make_sample(seed, split, index)``, which its shard writer shares).

    Args:
        num_samples: number of samples.
        seed: seed of the data set.
        image_size: side of the square images in pixels.
        split: one of the subclass's ``splits``.
        labeled: when False, ``answer`` and ``reasoning`` are None.
    """

    splits: ClassVar[tuple[str, ...]] = ()

    def __init__(self, num_samples: int, seed: int, image_size: int = 128, split: str = "train", labeled: bool = True):
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; known: {', '.join(self.splits)}")
        super().__init__(num_samples, seed, image_size)
        self.split, self.labeled = split, labeled

    @classmethod
    def make_samples(cls, num: int, seed: int, split: str, image_size: int | None = None) -> Iterator[VisualSample]:
        """Samples ``0 .. num - 1`` of ``split``, labeled, one at a time (what ``python -m app.tasks reason_rft``
        writes); ``image_size`` None: the data set's default. The split and ``num`` are checked at the call."""
        dataset = cls(num, seed, split=split, **({} if image_size is None else {"image_size": image_size}))
        return (dataset.sample(index) for index in range(num))

    def sample(self, index: int) -> VisualSample:
        raise NotImplementedError

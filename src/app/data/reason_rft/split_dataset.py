"""The torch ``Dataset`` shape the Reason-RFT suites share: ``num_samples`` samples of one split, rendered lazily."""

from __future__ import annotations

from typing import ClassVar

from torch.utils.data import Dataset

from app.types import VisualSample


class SplitDataset(Dataset):
    """Samples ``0 .. num_samples - 1`` of one split; sample ``i`` depends only on ``(seed, split, i)``.

    Subclasses name their ``splits`` and render one sample in :meth:`sample`.

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
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        self.num_samples, self.seed, self.image_size = num_samples, seed, image_size
        self.split, self.labeled = split, labeled

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> VisualSample:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        return self.sample(index)

    def sample(self, index: int) -> VisualSample:
        raise NotImplementedError

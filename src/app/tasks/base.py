"""The shape every procedural task data set shares: ``num_samples`` samples rendered on access, sample ``i`` rebuilt
from ``(seed, i)`` alone, so any process (a data loader worker, a resumed run) sees the same data.

A subclass names its random stream and renders one sample in :meth:`SeededDataset.sample`; the base class owns the
length, the index check (negative indices count from the end, as in a list) and the per-index generator.

>>> class Coin(SeededDataset):
...     stream = "coin"
...     def sample(self, index):
...         return self.rng(index).choice(("heads", "tails"))
>>> coins = Coin(num_samples=3, seed=0, image_size=8)
>>> len(coins), coins[-1] == coins[2]
(3, True)
>>> coins[3]
Traceback (most recent call last):
...
IndexError: Coin: index 3 out of range for 3 samples
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from torch.utils.data import Dataset


class SeededDataset(Dataset):
    """``num_samples`` samples; sample ``i`` depends only on ``(seed, i)`` (and the data set's arguments).

    Args:
        num_samples: length of the data set (>= 0).
        seed: data set seed; different seeds give different samples.
        image_size: side of the square images in pixels.

    Subclasses set :attr:`stream` and implement :meth:`sample`; :meth:`rng` gives sample ``i`` its own generator,
    ``random.Random(f"{stream}:{seed}:{i}")`` (a string seed is hashed with SHA-512: stable across processes and
    Python versions, unlike ``hash``).
    """

    stream: ClassVar[str | None] = None
    """Prefix of the per-index seeds, so two tasks with one seed draw different numbers; ``None``: no prefix (the
    seed is ``f"{seed}:{index}"``)."""

    def __init__(self, num_samples: int, seed: int, image_size: int) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        self.num_samples, self.seed, self.image_size = num_samples, seed, image_size

    def __len__(self) -> int:
        return self.num_samples

    def index(self, index: int) -> int:
        """``index`` in ``[0, num_samples)`` (a negative one counts from the end); ``IndexError`` when out of range."""
        position = index + self.num_samples if index < 0 else index
        if not 0 <= position < self.num_samples:
            raise IndexError(f"{type(self).__name__}: index {index} out of range for {self.num_samples} samples")
        return position

    def rng(self, index: int) -> random.Random:
        """The generator of sample ``index``, seeded from ``(stream, seed, index)``."""
        key = f"{self.seed}:{index}" if self.stream is None else f"{self.stream}:{self.seed}:{index}"
        return random.Random(key)

    def __getitem__(self, index: int) -> Any:
        return self.sample(self.index(index))

    def sample(self, index: int) -> Any:
        """Sample ``index`` (already checked: ``0 <= index < num_samples``)."""
        raise NotImplementedError

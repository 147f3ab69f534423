"""Several named evaluation sets in one run (in-domain and domain-shift side by side), as one data set factory.

Give it as the data module's ``eval_dataset`` (or ``dataset`` of a validate-only run)::

    data:
      class_path: app.data.VisualTaskDataModule
      init_args:
        dataset: {class_path: app.tasks.dots.DotsDataset, init_args: {dot_radius: 12}}
        eval_dataset:
          class_path: app.data.eval_sets.EvalSets
          init_args:
            sets:
              in_domain: {class_path: app.tasks.dots.DotsDataset, init_args: {dot_radius: 12}}
              small_dots: {class_path: app.tasks.dots.DotsDataset, init_args: {dot_radius: 5}}

Each set has ``num_samples`` samples from its own seed; every sample carries its set's name in
``meta["eval_set"]``, and the evaluation logs its metrics under ``<stage>/<set>/...`` as well as overall
(:class:`~app.modules.vlm_evaluation.VLMEvaluation`). Grouping by that tag is the one place sets are told apart.
"""

from __future__ import annotations

import dataclasses
import random

from torch.utils.data import Dataset

from app.data.datamodule import DatasetFactory
from app.types import VisualSample

EVAL_SET_KEY = "eval_set"
"""``sample.meta[EVAL_SET_KEY]`` names the evaluation set a sample belongs to."""


class EvalSets(Dataset):
    """The samples of every set in ``sets`` one after another, each tagged ``meta["eval_set"] = <name>``.

    Args:
        num_samples: samples per set.
        seed: seed of the whole; each set derives its own from it and its name.
        image_size: side of the square images in pixels.
        sets: name -> data set factory (called as ``factory(num_samples, seed, image_size)``).
    """

    def __init__(self, num_samples: int, seed: int, image_size: int, sets: dict[str, DatasetFactory]) -> None:
        if not sets:
            raise ValueError("EvalSets needs at least one named set in `sets`")
        for name, factory in sets.items():
            if not name or "/" in name or not callable(factory):
                raise ValueError(f"EvalSets: set {name!r} needs a name without '/' and a data set factory")
        self.names = list(sets)
        self.parts = [
            factory(num_samples, random.Random(f"{seed}:{name}").getrandbits(63), image_size)
            for name, factory in sets.items()
        ]
        self.offsets = [0]
        for part in self.parts:
            self.offsets.append(self.offsets[-1] + len(part))

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index: int) -> VisualSample:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        part = next(i for i in range(len(self.parts)) if index < self.offsets[i + 1])
        sample = self.parts[part][index - self.offsets[part]]
        return dataclasses.replace(sample, meta={**sample.meta, EVAL_SET_KEY: self.names[part]})

"""A LightningDataModule that serves a procedurally generated visual task as lists of ``VisualSample``.

Batches stay Python lists: the policy's processor tokenises prompts and images itself, so the data module knows nothing
about tokenizers or image resolutions of a model.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from app.data.core import CoreTripletDataset
from app.data.counting import CountingDataset
from app.data.dots import DotsDataset
from app.data.pairs import PairedDotsDataset
from app.data.reason_rft.counting import VisualCountingDataset
from app.data.reason_rft.structure import StructurePerceptionDataset
from app.data.reason_rft.transformation import SpatialTransformationDataset
from app.data.sampler import ResumableShuffleSampler
from app.data.shapes import ShapePromptDataset
from app.data.spatial import SpatialVQADataset
from app.data.transforms import TransformDataset
from app.data.triplets import TripletDotsDataset
from app.data.vbvr_prompts import VBVRPromptDataset
from app.types import VisualSample

TaskFactory = Callable[..., Dataset]
"""Builds a task's data set: ``factory(num_samples=..., seed=..., image_size=..., **task_kwargs)``."""

TASKS: dict[str, TaskFactory] = {
    "dots_left_of": DotsDataset,
    "dots_left_of_pairs": PairedDotsDataset,
    "dots_count_triplets": TripletDotsDataset,
    "core_triplets": CoreTripletDataset,
    "dots_count": CountingDataset,
    "vbvr_prompts": VBVRPromptDataset,
    "shape_prompts": ShapePromptDataset,
    "dots_transform": TransformDataset,
    "spatial_vqa": SpatialVQADataset,
    "rrft_structure": StructurePerceptionDataset,
    "rrft_counting": VisualCountingDataset,
    "rrft_transformation": SpatialTransformationDataset,
}


def collate_visual_samples(batch: list[VisualSample | tuple[VisualSample, ...]]) -> list[VisualSample]:
    """Keep a batch as a list of samples; the model's processor turns them into tensors later.

    Items that are tuples or lists (a prompt and its augmented twin) are flattened in order, so the prompts of one item
    stay adjacent (and on one rank, since samplers split data sets by item).
    """
    samples: list[VisualSample] = []
    for item in batch:
        if isinstance(item, (tuple, list)):
            samples.extend(item)
        else:
            samples.append(item)
    return samples


def split_seed(seed: int, split: str) -> int:
    """A seed for one split (``"train"``, ``"val"``, ``"test"``), distinct per split and stable across processes."""
    return random.Random(f"{seed}:{split}").getrandbits(63)


class VisualTaskDataModule(LightningDataModule):
    """Train, validation and test splits of one procedurally generated task, each from its own seed.

    Args:
        task: name of the task; one of ``TASKS``.
        train_size: number of training samples.
        val_size: number of validation samples.
        test_size: number of test samples.
        batch_size: data items per training batch: prompts, or pairs / tuples for paired tasks, which collate flattens
            (each prompt is later sampled K times by the policy; a pair never straddles two ranks).
        val_batch_size: prompts per validation and test batch.
        seed: seed of the whole data set; the splits use disjoint seeds derived from it, and the training order is
            shuffled with it.
        image_size: side of the square images in pixels.
        num_workers: data loader worker processes.
        task_kwargs: extra keyword arguments for the task's data set, e.g. ``{"num_distractors": 2}`` or
            ``{"labeled": False}`` for the dots task.
    """

    def __init__(
        self,
        task: str = "dots_left_of",
        train_size: int = 2000,
        val_size: int = 200,
        test_size: int = 200,
        batch_size: int = 8,
        val_batch_size: int = 32,
        seed: int = 0,
        image_size: int = 112,
        num_workers: int = 0,
        task_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(sorted(TASKS))}")
        self.save_hyperparameters()
        self.task = task
        self.train_size, self.val_size, self.test_size = train_size, val_size, test_size
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        self.seed = seed
        self.image_size = image_size
        self.num_workers = num_workers
        self.task_kwargs = dict(task_kwargs or {})
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self._resume_state: dict[str, int] = {}

    def _build(self, split: str, size: int) -> Dataset:
        seed = split_seed(self.seed, split)
        return TASKS[self.task](num_samples=size, seed=seed, image_size=self.image_size, **self.task_kwargs)

    def setup(self, stage: str | None = None) -> None:
        # Samples render lazily, so building every split is cheap whatever the stage.
        if self.train_dataset is None:
            self.train_dataset = self._build("train", self.train_size)
            self.val_dataset = self._build("val", self.val_size)
            self.test_dataset = self._build("test", self.test_size)

    def _loader(self, dataset: Dataset, batch_size: int, train: bool) -> DataLoader:
        sampler = None
        if train:
            sampler = ResumableShuffleSampler(len(dataset), self.seed)
            if self._resume_state:
                done = self._resume_state["batches_done"] * batch_size
                sampler.resume(self._resume_state["epoch"], done)
                self._resume_state = {}
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=train,
            # Its own generator: creating an iterator draws a worker seed, which must not touch the global generator
            # (a resumed run restores that generator and must sample exactly what an uninterrupted run would).
            generator=torch.Generator().manual_seed(self.seed),
            num_workers=self.num_workers,
            collate_fn=collate_visual_samples,
            persistent_workers=self.num_workers > 0,
        )

    def state_dict(self) -> dict[str, int]:
        """Where training is in the current epoch, saved in checkpoints so a resumed run continues mid-epoch."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit":
            return {}
        return {"epoch": trainer.current_epoch, "batches_done": trainer.fit_loop.epoch_loop.batch_idx + 1}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._resume_state = dict(state_dict)

    def train_dataloader(self) -> DataLoader:
        self.setup()
        return self._loader(self.train_dataset, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return self._loader(self.val_dataset, self.val_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        self.setup()
        return self._loader(self.test_dataset, self.val_batch_size, train=False)

    def predict_dataloader(self) -> DataLoader:
        """``python -m app predict`` answers the test split."""
        return self.test_dataloader()

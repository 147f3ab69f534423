"""A LightningDataModule that serves a procedurally generated visual task as lists of ``VisualSample``.

The task comes in as a data set factory (dependency injection, like Lightning's ``OptimizerCallable``): in a config it
is a ``class_path`` with the data set's own ``init_args``, and the data module calls it once per split with the split's
size, seed and image size. LightningCLI checks the ``init_args`` against the data set's signature when it parses the
config, so a misspelt argument fails ``--print_config`` naming the key. Example
(``python -m app fit --config X.yaml``)::

    data:
      class_path: app.data.VisualTaskDataModule
      init_args:
        dataset:
          class_path: app.tasks.dots.DotsDataset
          init_args:
            dot_radius: 12
        train_size: 4000
        seed: 0
        image_size: 64

Batches stay Python lists: the policy's processor tokenises prompts and images itself, so the data module knows nothing
about tokenizers or image resolutions of a model.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from app.data.sampler import ResumableShuffleSampler, prompt_ranks
from app.types import VisualSample

DatasetFactory = Callable[[int, int, int], Dataset]
"""Builds one split of a task: ``factory(num_samples, seed, image_size)``, positionally.

A data set class whose first three parameters are those (every data set of :mod:`app.tasks`) is one, and so is a
``functools.partial`` of it with its other arguments; in a config, ``class_path`` + ``init_args`` without those three.
"""


def factory_config(factory: DatasetFactory) -> dict[str, Any] | str:
    """A data set factory as plain data: ``{"class_path": ..., "init_args": {...}}`` as a config writes it, for a class
    or function and a ``functools.partial`` of one with plain keyword arguments; otherwise its ``repr``.

    >>> from app.data.sampler import ResumableShuffleSampler as Cls
    >>> factory_config(functools.partial(Cls, seed=3))
    {'class_path': 'app.data.sampler.ResumableShuffleSampler', 'init_args': {'seed': 3}}
    """
    target, kwargs = factory, {}
    if isinstance(factory, functools.partial) and not factory.args:
        target, kwargs = factory.func, dict(factory.keywords)
    if not hasattr(target, "__qualname__"):  # an instance of a callable class, say
        return repr(factory)
    config: dict[str, Any] = {"class_path": f"{target.__module__}.{target.__qualname__}"}
    if kwargs:
        config["init_args"] = kwargs
    return config if _is_plain(config) else repr(factory)


def _is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


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
        dataset: the task's data set factory, called as ``dataset(num_samples, seed, image_size)`` for each split (see
            :data:`DatasetFactory`), e.g. ``functools.partial(DotsDataset, dot_radius=12)`` or, in a config,
            ``class_path: app.tasks.dots.DotsDataset`` with ``init_args: {dot_radius: 12}``.
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
        eval_dataset: the validation and test splits' factory (e.g. both VBVR splits, in-domain and out-of-domain,
            while training stays in-domain); None: ``dataset``.
    """

    def __init__(
        self,
        dataset: DatasetFactory,
        train_size: int = 2000,
        val_size: int = 200,
        test_size: int = 200,
        batch_size: int = 8,
        val_batch_size: int = 32,
        seed: int = 0,
        image_size: int = 112,
        num_workers: int = 0,
        eval_dataset: DatasetFactory | None = None,
    ) -> None:
        super().__init__()
        if not callable(dataset):
            raise TypeError(f"dataset must be a data set class or factory, got {dataset!r}")
        if eval_dataset is not None and not callable(eval_dataset):
            raise TypeError(f"eval_dataset must be a data set class or factory or null, got {eval_dataset!r}")
        if train_size < 1:
            raise ValueError(f"train_size must be >= 1 (fit needs training samples), got {train_size}")
        if min(val_size, test_size) < 0:
            raise ValueError(f"val_size and test_size must be >= 0, got {val_size} and {test_size}")
        self.dataset = dataset
        self.eval_dataset = eval_dataset or dataset
        # Hyper-parameters go into checkpoints, which load with weights_only=True: plain data only, so the data set
        # is recorded as its class path and arguments (save_hyperparameters reads the local variables of __init__;
        # under LightningCLI it records the parsed config, where the data set is that already).
        dataset = factory_config(dataset)
        eval_dataset = factory_config(eval_dataset) if eval_dataset is not None else None
        self.save_hyperparameters()
        self.train_size, self.val_size, self.test_size = train_size, val_size, test_size
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        self.seed = seed
        self.image_size = image_size
        self.num_workers = num_workers
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self._resume_state: dict[str, int] = {}
        self._resumed_at: tuple[int, int, int] | None = None  # (epoch, samples_done, batches_done) of the last resume

    def _build(self, split: str, size: int) -> Dataset:
        factory = self.dataset if split == "train" else self.eval_dataset
        return factory(size, split_seed(self.seed, split), self.image_size)

    def setup(self, stage: str | None = None) -> None:
        # Samples render lazily, so building every split is cheap whatever the stage.
        if self.train_dataset is None:
            self.train_dataset = self._build("train", self.train_size)
            self.val_dataset = self._build("val", self.val_size)
            self.test_dataset = self._build("test", self.test_size)

    def _loader(self, dataset: Dataset, batch_size: int, train: bool) -> DataLoader:
        sampler = None
        if train:
            sampler = ResumableShuffleSampler(len(dataset), self.seed, **self._sampler_ranks())
            if self._resume_state:
                self._resume(sampler, self._resume_state)
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

    def _resume(self, sampler: ResumableShuffleSampler, state: dict[str, int]) -> None:
        epoch, batches = state["epoch"], state["batches_done"]
        samples = state["samples_done"]
        sampler.resume(epoch, samples, counted=batches * self.batch_size)
        self._resumed_at = (epoch, samples, batches)

    def _sampler_ranks(self) -> dict[str, int]:
        """This process's share of the training set: the strategy's data-parallel ranks (ranks that share groups
        counted as one, :func:`~app.data.sampler.prompt_ranks`), unless the trainer was told not to split the data
        (``use_distributed_sampler=False``) or runs in one process."""
        trainer = self.trainer
        kwargs = trainer.distributed_sampler_kwargs if trainer is not None else None
        split = trainer is not None and getattr(trainer._accelerator_connector, "use_distributed_sampler", True)
        if not kwargs or not split:
            return {}
        rank, replicas = prompt_ranks(trainer, kwargs["rank"], kwargs["num_replicas"])
        return {"num_replicas": replicas, "rank": rank}

    def state_dict(self) -> dict[str, int]:
        """Where training is in the current epoch, saved in checkpoints so a resumed run continues mid-epoch:
        ``epoch``, ``batches_done`` (the trainer's count of this epoch's batches) and ``samples_done``, the global
        sample index: how many of the epoch's permutation all ranks together have drawn.

        Lightning saves this from rank 0 alone, and every rank resumes at its own position from it, because the state
        is the same on every rank and each rank's position follows from it. Every rank runs the same fit loop over as
        many batches per epoch (:class:`~app.data.sampler.ResumableShuffleSampler` gives each ``ceil(train_size /
        world)`` indices, and ``drop_last`` keeps as many whole batches), and a checkpoint is written by all ranks at
        the same step, so the loop's epoch and batch index are the same on all of them, and the ranks have drawn the
        first ``samples_done`` indices of the ``(seed, epoch)`` permutation between them. A resumed run on any number
        of ranks shares the rest of it (see the sampler), and the loader draws from its own generator (seeded with
        ``seed``): nothing of a rank's position is its own to save.
        (:class:`~app.data.shard_datamodule.ShardDataModule`, whose positions do differ, gathers every rank's.)"""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit":
            return {}
        epoch, batches = trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_idx + 1
        start_samples, start_batches = 0, 0
        if self._resumed_at is not None and self._resumed_at[0] == epoch:
            _, start_samples, start_batches = self._resumed_at
        replicas = self._sampler_ranks().get("num_replicas", 1)
        samples = start_samples + (batches - start_batches) * self.batch_size * replicas
        return {"epoch": epoch, "batches_done": batches, "samples_done": samples}

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

"""A LightningDataModule that streams WebDataset shards (:mod:`app.data.shards`) as lists of ``VisualSample``.

Two training modes:

- finite (default): each epoch reads every training shard once, shards shuffled per epoch and split by rank, then by
  worker. Ranks may get different numbers of batches when shards differ in size, which stalls DDP at the end of an
  epoch, so finite mode suits one process.
- ``resampled=True``: every rank and worker draws shards with replacement without end, and an epoch is exactly
  ``epoch_size`` items per rank (``ceil(epoch_size / batch_size)`` batches, the same on every rank). The recommended
  multi-GPU setting.

Validation and test are always finite, in stored order, and split between ranks by sample, so each sample is
evaluated once however few shards there are.

Training resumes mid-epoch, at the sample: ``state_dict`` (which Lightning saves in every checkpoint) records where
the training stream stood after the last batch the trainer trained on (not the batches it had fetched ahead), per rank
and per worker, and ``load_state_dict`` makes the resumed run's first epoch continue from there, so the batches that
follow are the ones the interrupted run would have trained on next, in the same order, with workers too. It works
because a stream is a function of the seed and the epoch: shard order, shuffle buffer, resampling and augmentation are
all seeded from ``(seed, epoch, rank, worker)``; each worker replays its stream up to where it stood, reading the shards
but decoding nothing, and yields from there. The resumed run must use the same shards, seed, batch size, shuffle
buffer, epoch size, number of workers and, in finite mode (shards split by rank), number of ranks; when one differs the
epoch restarts from its beginning, with a warning (as it does from a checkpoint written before this was built, whose
state is empty). A resampled stream resumes on any number of ranks: ranks the checkpoint holds continue their own
streams, a new rank draws its own from its start for as many batches as the others have left. With more than one
rank, ``state_dict`` gathers every rank's position (``torch.distributed.all_gather_object``), so it must be called on
all ranks at once, as ``Trainer.save_checkpoint`` does. Validation and test loops are not resumed (Lightning restarts
them).

Skipped bad data is counted in ``skipped`` (and ``skipped_by_split``), logged as a warning with the running total, and
written to the trainer's loggers as ``data/skipped_shards`` and ``data/skipped_samples`` when they change (rank zero's
counts: loggers write on rank zero). The counts are saved with the position, so a resumed run counts on from the
checkpoint's totals without counting the replayed part twice.

Example config (``python -m app fit --config X.yaml``)::

    data:
      class_path: app.data.ShardDataModule
      init_args:
        train_urls: data/dots/train-{000000..000015}.tar
        val_urls: data/dots/val-*.tar
        batch_size: 8
        resampled: true
        epoch_size: 4096
        augment:
          class_path: my_package.HFlipTwin
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from lightning import LightningDataModule

from app.data.sampler import prompt_ranks
from app.data.shard_stream import ShardLoader, ShardStream, SkipCounts
from app.data.shards import expand_urls
from app.types import VisualSample

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


class ShardDataModule(LightningDataModule):
    """Train, validation and test splits streamed from WebDataset shards.

    Resumes training mid-epoch, exactly at the next untrained batch (``state_dict`` / ``load_state_dict``; see the
    module docstring for how, and for what must not change between the runs).

    Args:
        train_urls: training shards: a brace pattern (``x-{000000..000009}.tar``), a glob, ``::``-separated patterns
            or a list; required to fit.
        val_urls: validation shards, or None for no validation.
        test_urls: test shards, or None.
        batch_size: items per training batch (an augmented tuple is one item; collate flattens it).
        val_batch_size: samples per validation and test batch.
        shuffle_buffer: training records held for shuffling; 0 disables it (shard order is still shuffled).
        num_workers: data loader worker processes (0: in the main process).
        resampled: draw training shards with replacement, without end; requires ``epoch_size``.
        epoch_size: training items per epoch on each rank: exact when resampled, a cap otherwise.
        seed: seeds shard order, shuffle buffer, resampling and augmentation (with the epoch).
        augment: ``augment(sample, rng) -> VisualSample | tuple[VisualSample, ...]``, run in the workers on training
            samples; the rng is seeded from ``(seed, epoch, sample key)``, so runs are reproducible.
        augment_eval: also augment validation and test samples (with epoch 0, so every evaluation sees the same).
        strip_labels: drop answers, reasoning and label meta of TRAINING samples after decoding (a belt on top of
            label-free shards); validation and test samples keep theirs, so held-out accuracy can still be measured.
    """

    def __init__(
        self,
        train_urls: str | list[str] | None = None,
        val_urls: str | list[str] | None = None,
        test_urls: str | list[str] | None = None,
        batch_size: int = 8,
        val_batch_size: int = 32,
        shuffle_buffer: int = 1000,
        num_workers: int = 0,
        resampled: bool = False,
        epoch_size: int | None = None,
        seed: int = 0,
        augment: Callable[[VisualSample, random.Random], Any] | None = None,
        augment_eval: bool = False,
        strip_labels: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (("batch_size", batch_size), ("val_batch_size", val_batch_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if shuffle_buffer < 0 or num_workers < 0:
            raise ValueError(f"shuffle_buffer and num_workers must be >= 0, got {shuffle_buffer}, {num_workers}")
        if epoch_size is not None and epoch_size < 1:
            raise ValueError(f"epoch_size must be >= 1, got {epoch_size}")
        if resampled and epoch_size is None:
            raise ValueError("resampled=True streams without end: set epoch_size (training items per epoch per rank)")
        self.save_hyperparameters(ignore=["augment"])
        self.patterns = {"train": train_urls, "val": val_urls, "test": test_urls}
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        self.shuffle_buffer, self.num_workers = shuffle_buffer, num_workers
        self.resampled, self.epoch_size, self.seed = resampled, epoch_size, seed
        self.augment, self.augment_eval, self.strip_labels = augment, augment_eval, strip_labels
        self.urls: dict[str, list[str]] = {}
        self.skipped = SkipCounts()
        self.skipped_by_split = {split: SkipCounts() for split in SPLITS}
        self._train_loader: ShardLoader | None = None
        self._resume: dict[str, Any] | None = None  # the "train" entry of a loaded state, until a train loader takes it

    def setup(self, stage: str | None = None) -> None:
        """Expand the URL patterns, failing at once, naming the pattern, when one matches nothing."""
        if stage == "fit" and self.patterns["train"] is None:
            raise ValueError("ShardDataModule needs train_urls to fit")
        for split, pattern in self.patterns.items():
            if pattern is not None and split not in self.urls:
                try:
                    self.urls[split] = expand_urls(pattern)
                except (ValueError, FileNotFoundError) as err:
                    raise type(err)(f"{split}_urls: {err}") from err

    def _rank_and_world_size(self) -> tuple[int, int]:
        if self.trainer is not None:
            return self.trainer.global_rank, self.trainer.world_size
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _loader(self, split: str) -> ShardLoader | list:
        self.setup("fit" if split == "train" else None)
        if split not in self.urls:
            return []  # no shards for this split: Lightning skips a loop whose loaders are empty
        rank, world_size = self._rank_and_world_size()
        train = split == "train"
        # training prompts are split by replica: ranks that share groups (grpo.group_ranks) stream the same ones
        stream_rank, replicas = prompt_ranks(self.trainer, rank, world_size) if train else (rank, world_size)
        resampled = train and self.resampled
        if train and not resampled and len(self.urls[split]) < replicas:
            raise ValueError(
                f"train_urls: {len(self.urls[split])} shards for {replicas} ranks; some ranks would get none "
                "(write more shards, or use resampled=True)"
            )
        stream = ShardStream(
            self.urls[split],
            batch_size=self.batch_size if train else self.val_batch_size,
            rank=stream_rank,
            world_size=replicas,
            split_by_sample=not train,
            seed=self.seed,
            shuffle=train,
            shuffle_buffer=self.shuffle_buffer,
            resampled=resampled,
            epoch_size=self.epoch_size if train else None,
            augment=self.augment if train or self.augment_eval else None,
            strip_labels=self.strip_labels and train,
        )
        epoch_fn = self._trainer_epoch if train else (lambda: 0)
        loader = ShardLoader(stream, self.num_workers, epoch_fn, on_skip=lambda delta: self._record_skips(split, delta))
        if train:
            self._train_loader = loader
            if self._resume is not None:
                loader.resume(self._rank_position(self._resume, rank, world_size))
                self._resume = None
        return loader

    def _trainer_epoch(self) -> int | None:
        return self.trainer.current_epoch if self.trainer is not None else None

    def _record_skips(self, split: str, delta: SkipCounts) -> None:
        self.skipped = self.skipped + delta
        self.skipped_by_split[split] = self.skipped_by_split[split] + delta
        log.warning(
            "data: skipped %d bad shards and %d bad samples so far (%s: %d shards, %d samples)",
            self.skipped.shards,
            self.skipped.samples,
            split,
            self.skipped_by_split[split].shards,
            self.skipped_by_split[split].samples,
        )
        trainer = self.trainer
        if trainer is not None and trainer.loggers:
            metrics = {
                "data/skipped_shards": float(self.skipped.shards),
                "data/skipped_samples": float(self.skipped.samples),
            }
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def train_dataloader(self) -> ShardLoader:
        return self._loader("train")

    def val_dataloader(self) -> ShardLoader | list:
        return self._loader("val")

    def test_dataloader(self) -> ShardLoader | list:
        return self._loader("test")

    def predict_dataloader(self) -> ShardLoader | list:
        """``python -m app predict`` answers the test split."""
        return self._loader("test")

    def _position_config(self, world_size: int) -> dict[str, Any]:
        """What a saved position is only valid for: the stream must be the same one (for a resampled stream the
        number of ranks may differ, see :meth:`_rank_position`)."""
        urls = self.urls.get("train") or []
        return {
            "shards": [os.path.basename(u) for u in urls],
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle_buffer": self.shuffle_buffer,
            "resampled": self.resampled,
            "epoch_size": self.epoch_size,
            "num_workers": self.num_workers,
            "world_size": world_size,
            "replicas": prompt_ranks(self.trainer, 0, world_size)[1],
        }

    def _batches_trained(self) -> int | None:
        """Training batches of this epoch the trainer has run (it fetches ahead of them), or None without a fit."""
        try:
            return int(self.trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        except AttributeError:  # no trainer (or a stand-in without a fit loop): what the loader yielded was consumed
            return None

    def state_dict(self) -> dict[str, Any]:
        """The skip counts and, once training has streamed, each rank's training stream position (JSON-serialisable).

        ``{"skipped": [shards, samples], "skipped_by_split": {split: [shards, samples]}, "train": {"config": {...},
        "positions": [position of rank 0, rank 1, ...]}}``; a position is :meth:`ShardLoader.position` after the last
        batch trained on. With several ranks this gathers from all of them (a collective: call it on every rank).
        """
        skipped, by_split = self.skipped, dict(self.skipped_by_split)
        train = None
        if self._train_loader is not None:
            loader = self._train_loader
            position = loader.position(self._batches_trained())
            ahead = loader.skipped_since(position)  # came with batches fetched ahead: the resumed run counts them
            skipped, by_split["train"] = skipped - ahead, by_split["train"] - ahead
            _, world_size = self._rank_and_world_size()
            positions = [position]
            if world_size > 1 and dist.is_available() and dist.is_initialized():
                positions = [None] * world_size
                dist.all_gather_object(positions, position)
            train = {"config": self._position_config(world_size), "positions": positions}
        elif self._resume is not None:
            train = self._resume  # loaded but not yet used: pass it on
        return {
            "skipped": [skipped.shards, skipped.samples],
            "skipped_by_split": {split: [c.shards, c.samples] for split, c in by_split.items()},
            "train": train,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the skip counts and resume training where ``state_dict`` says (see the module docstring).

        An empty state (a checkpoint from before positions were saved) restarts the epoch, as those runs did.
        """
        if not state_dict:
            return
        try:
            skipped = SkipCounts(*state_dict["skipped"])
            by_split = {split: SkipCounts(*state_dict["skipped_by_split"][split]) for split in SPLITS}
            train = state_dict["train"]
            if train is not None and not (isinstance(train["config"], dict) and isinstance(train["positions"], list)):
                raise TypeError("'train' must hold a 'config' dict and a 'positions' list")
        except (KeyError, TypeError) as err:
            raise ValueError(
                f"ShardDataModule.load_state_dict: not a state this class saved ({type(err).__name__}: {err}); keys: "
                f"{sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__}"
            ) from None
        self.skipped, self.skipped_by_split, self._resume = skipped, by_split, train
        if self._resume is not None and self._train_loader is not None:
            rank, world_size = self._rank_and_world_size()
            self._train_loader.resume(self._rank_position(self._resume, rank, world_size))
            self._resume = None

    def _rank_position(self, saved: dict[str, Any], rank: int, world_size: int) -> dict[str, Any] | None:
        """This rank's saved position, or None (restart the epoch, with a warning) when the stream has changed.

        A finite stream splits the shards by rank, so it resumes only on as many ranks. A resampled stream is a
        function of ``(seed, epoch, stream rank, worker)`` alone, so it resumes on any number: a stream rank the
        checkpoint holds continues where it stood; a new one draws its own stream from its start, for as many
        batches as the saved ranks had left (:func:`_new_rank_position`)."""
        config = self._position_config(world_size)
        ranks_may_change = ("world_size", "replicas") if self.resampled else ()
        changed = sorted(k for k in config if k not in ranks_may_change and saved["config"].get(k) != config[k])
        if changed or not self.resampled and len(saved["positions"]) != world_size:
            log.warning(
                "ShardDataModule: not resuming mid-epoch: %s changed since the checkpoint; the epoch restarts from "
                "its first batch",
                ", ".join(changed) or "the number of saved rank positions",
            )
            return None
        stream_rank, _ = prompt_ranks(self.trainer, rank, world_size)
        saved_replicas = saved["config"].get("replicas", len(saved["positions"]))  # saved before it: no sharing
        positions = saved["positions"][:: len(saved["positions"]) // saved_replicas]  # one per saved stream rank
        if stream_rank < len(positions):
            return positions[stream_rank]
        log.info(
            "ShardDataModule: the checkpoint holds the resampled streams of %d ranks; stream rank %d draws its own "
            "from its start, as many batches as the others have left of epoch %d",
            saved_replicas,
            stream_rank,
            positions[0]["epoch"],
        )
        return _new_rank_position(positions[0])


def _new_rank_position(position: dict[str, Any]) -> dict[str, Any]:
    """Where a resampled stream rank that ``position`` (another rank's) does not belong to starts in the same epoch:
    at its own stream's first record, with each worker counted as having yielded the items the other rank's worker
    had (the workers' shares of an epoch are the same on every rank), so it yields as many batches as that rank has
    left, and no skips counted yet."""
    workers = [[worker, 0, items, final] for worker, _, items, final in position["workers"]]
    return {**position, "workers": workers, "skipped": [0, 0]}

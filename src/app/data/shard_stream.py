"""The per-worker pipeline that streams WebDataset shards as batches of ``VisualSample``, counting what it skips.

Stages, in each data loader worker: shard URLs (``SimpleShardList``, shuffled per epoch, or ``ResampledShards``) ->
split by rank, then by worker (finite mode only) -> tar expansion -> shuffle buffer (of raw records: compressed bytes
are cheaper to hold than decoded images) -> decode (:func:`app.data.shards.decode_sample`) -> optional label
stripping -> optional augmentation -> the per-worker share of ``epoch_size`` -> batches.

Bad data never stops a stream. A shard that cannot be opened or read (missing, garbage, truncated) ends at the error,
keeping the samples read before it; a damaged shard (a corrupt member header, a hole, a missing end-of-archive marker:
see :func:`app.data.shards.tar_members`) is read past the damage, which loses only the members stored there; a sample
that does not decode or validate (bad JSON, a field of the wrong type, missing, extra or corrupt images) is dropped.
Each is logged with its URL or key and counted: ``SkipCounts.shards`` counts the shards not read whole (once per
shard), ``SkipCounts.samples`` the samples dropped, including those a damaged shard left incomplete. A sample all of
whose members lay in a damaged region cannot be counted (nothing of it is left); the shard's count and warning, which
names the byte range and the members on either side, stand for it. The counts ride to the main process inside the
items the workers yield (:class:`StreamBatch`), because worker processes share no memory with it; :class:`ShardLoader`
adds them up.

Training streams split between ranks by shard; evaluation streams by sample (``split_by_sample``), so that every
sample is evaluated exactly once even with fewer shards than ranks. Node splitting takes the rank and world size
given by the data module instead of reading ``torch.distributed`` inside the worker (where spawned workers have no
process group), so it also works for fake ranks in tests.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from webdataset.tariterators import base_plus_ext

from app.data.datamodule import collate_visual_samples
from app.data.shards import decode_sample, tar_members, without_labels
from app.types import VisualSample

log = logging.getLogger(__name__)

Augment = Callable[[VisualSample, random.Random], Any]
"""``augment(sample, rng) -> VisualSample | tuple[VisualSample, ...]``; tuples are flattened in order into the batch."""


@dataclass
class SkipCounts:
    """How much bad data was skipped: shards not read whole (failed to open, cut short or damaged; once each), and
    samples dropped (failed to decode or validate, or left incomplete by a damaged shard)."""

    shards: int = 0
    samples: int = 0

    def __add__(self, other: SkipCounts) -> SkipCounts:
        return SkipCounts(self.shards + other.shards, self.samples + other.samples)

    def __sub__(self, other: SkipCounts) -> SkipCounts:
        return SkipCounts(self.shards - other.shards, self.samples - other.samples)

    def __bool__(self) -> bool:
        return bool(self.shards or self.samples)


@dataclass
class StreamBatch:
    """What a worker yields: a batch (empty for a final counts-only item) and the skips since its previous item.

    ``worker``, ``records``, ``items`` and ``final`` say where the worker's stream stood when it yielded this: its
    (logical) worker index, the raw records it had drawn this epoch (after the shuffle buffer, decoded or not), the
    items it had yielded this epoch, and whether this is its last item; :class:`ShardLoader` keeps them to resume
    mid-epoch.
    """

    samples: list[VisualSample]
    skipped: SkipCounts
    worker: int = 0
    records: int = 0
    items: int = 0
    final: bool = False


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts``, the same in every process (unlike ``hash`` of a string)."""
    return random.Random(":".join(map(str, parts))).getrandbits(63)


def epoch_share(epoch_size: int, batch_size: int, worker: int, num_workers: int) -> int:
    """Samples worker ``worker`` yields per epoch: whole batches dealt round-robin, the remainder to one worker.

    The shares sum to ``epoch_size`` and leave at most one partial batch per epoch, so every rank yields the same
    ``ceil(epoch_size / batch_size)`` batches.
    """
    full, rest = divmod(epoch_size, batch_size)
    share = (full // num_workers + (worker < full % num_workers)) * batch_size
    return share + (rest if worker == full % num_workers else 0)


class _WorkerCounts:
    """Skips seen by one worker in one epoch, and how many of them it has reported."""

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.total = SkipCounts()
        self.reported = SkipCounts()
        # while replaying what a resumed run already read (and logged)
        self.quiet = False

    def shard(self, url: str, err: Exception, first: bool) -> None:
        self.total = self.total + SkipCounts(shards=int(first))
        if self.quiet:
            return
        log.warning(
            "skipping the rest of shard %s: %s: %s (worker %d: %d shards, %d samples skipped this epoch)",
            url,
            type(err).__name__,
            err,
            self.worker,
            self.total.shards,
            self.total.samples,
        )

    def damaged(self, url: str, message: str, first: bool) -> None:
        """A fault the reader passed over in shard ``url``; the shard counts once, on its ``first`` fault."""
        self.total = self.total + SkipCounts(shards=int(first))
        if self.quiet:
            return
        log.warning(
            "damaged shard %s: %s (worker %d: %d shards, %d samples skipped this epoch)",
            url,
            message,
            self.worker,
            self.total.shards,
            self.total.samples,
        )

    def sample(self, key: str, url: str, err: Exception) -> None:
        self.total = self.total + SkipCounts(0, 1)
        if self.quiet:
            return
        log.warning(
            "skipping sample %s of %s: %s (worker %d: %d shards, %d samples skipped this epoch)",
            key,
            url,
            err,
            self.worker,
            self.total.shards,
            self.total.samples,
        )

    def unreported(self) -> SkipCounts:
        delta = SkipCounts(self.total.shards - self.reported.shards, self.total.samples - self.reported.samples)
        self.reported = self.total
        return delta


def expand_tars(sources: Iterable[dict[str, Any]], counts: _WorkerCounts) -> Iterator[dict[str, Any]]:
    """Raw records (``__key__``, ``__url__``, one entry per member suffix) of the shards in ``sources``.

    A damaged shard (see :func:`app.data.shards.tar_members`) is counted once, however many faults it has, and each
    fault is logged; the samples that lost members in it are counted when they fail to decode.
    """
    for source in sources:
        url, record, damaged = source["url"], None, [False]

        def on_damage(message: str, url: str = url, damaged: list = damaged) -> None:
            counts.damaged(url, message, first=not damaged[0])
            damaged[0] = True

        try:
            stream = wds.gopen(url)
            try:
                for member in tar_members(stream, on_damage):
                    key, suffix = base_plus_ext(member["fname"])
                    if key is None:
                        continue
                    if record is not None and record["__key__"] != key:
                        yield record
                        record = None
                    if record is None:
                        record = {"__key__": key, "__url__": url}
                    if suffix in record:
                        raise ValueError(f"duplicate member {member['fname']!r}")
                    record[suffix] = member["data"]
            finally:
                stream.close()
            if record is not None:
                yield record
        except Exception as err:  # a bad shard ends here; the stream goes on with the next one
            counts.shard(url, err, first=not damaged[0])
            if record is not None:  # may be whole (its last member was read) or not: decoding will tell
                yield record


class ShardStream(IterableDataset):
    """Batches of ``VisualSample`` from WebDataset shards, as :class:`StreamBatch` items (one stream per worker).

    Args:
        urls: expanded shard URLs (see :func:`app.data.shards.expand_urls`).
        batch_size: items per batch; an augmented tuple counts as one item.
        rank: this process's index among the data-parallel processes, in ``[0, world_size)``.
        world_size: the number of data-parallel processes (1: a single process reads every shard).
        split_by_sample: split the stream between ranks by sample instead of by shard: every rank reads every shard
            but decodes only its own samples, so the ranks share even one shard exactly (for evaluation).
        seed: seed of shard order, shuffle buffer, resampling and augmentation.
        shuffle: shuffle the shard order per epoch and the samples through a buffer of ``shuffle_buffer``.
        shuffle_buffer: records held for shuffling; 0 disables it.
        resampled: draw shards with replacement, independently per rank and worker, without end.
        epoch_size: items per epoch on this rank; the length of a resampled epoch, a cap otherwise.
        augment: applied to each decoded sample with an rng seeded from ``(seed, epoch, key)``.
        strip_labels: drop labels (see :func:`app.data.shards.without_labels`) before and after ``augment``.

    Resuming: every stage is a function of ``(seed, epoch, rank, worker)``, so a worker's stream can be replayed.
    ``resume_from`` maps a worker to ``(records, items, final)`` it had reached (see :class:`StreamBatch`): the worker
    reads and shuffles as before but drops its first ``records`` raw records undecoded (and the skips counted among
    them, which the interrupted run already counted and logged), then yields the rest of its share; a worker that had
    yielded its ``final`` item yields nothing. ``worker_offset`` renumbers data loader workers (loader worker ``i``
    plays worker ``(i + worker_offset) % num_workers``), so that the loader's round robin, which always starts at its
    worker 0, resumes with the worker whose turn it was.
    """

    def __init__(
        self,
        urls: list[str],
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        split_by_sample: bool = False,
        seed: int = 0,
        shuffle: bool = False,
        shuffle_buffer: int = 0,
        resampled: bool = False,
        epoch_size: int | None = None,
        augment: Augment | None = None,
        strip_labels: bool = False,
    ) -> None:
        super().__init__()
        if resampled and epoch_size is None:
            raise ValueError("resampled streams never end: give epoch_size")
        self.urls, self.batch_size = list(urls), batch_size
        self.rank, self.world_size, self.split_by_sample = rank, world_size, split_by_sample
        self.seed, self.shuffle, self.shuffle_buffer = seed, shuffle, shuffle_buffer
        self.resampled, self.epoch_size = resampled, epoch_size
        self.augment, self.strip_labels = augment, strip_labels
        self.epoch = 0  # set by ShardLoader before each pass; workers get a fresh copy every epoch
        self.resume_from: dict[int, tuple[int, int, bool]] = {}  # set by ShardLoader before each pass
        self.worker_offset = 0

    def _sources(self, worker: int, num_workers: int) -> list:
        """The first stages: shard URLs for this rank and worker, as ``{"url": ...}`` dicts."""
        if self.resampled:
            seed = derive_seed(self.seed, self.epoch, "resample")
            worker_seed = derive_seed(self.rank, worker)
            return [wds.ResampledShards(self.urls, seed=seed, worker_seed=lambda: worker_seed, deterministic=True)]
        order_seed = derive_seed(self.seed, self.epoch, "shards") if self.shuffle else None
        by_rank = (
            [] if self.split_by_sample else [functools.partial(_take_every, start=self.rank, step=self.world_size)]
        )
        return [
            wds.SimpleShardList(self.urls, seed=order_seed),  # the same order on every rank
            *by_rank,
            functools.partial(_take_every, start=worker, step=num_workers),
        ]

    def _decode(self, records: Iterable[dict[str, Any]], counts: _WorkerCounts) -> Iterator[tuple[str, VisualSample]]:
        for record in records:
            try:
                sample = decode_sample(record)
            except ValueError as err:
                counts.sample(record["__key__"], record["__url__"], err)
                continue
            yield record["__key__"], without_labels(sample) if self.strip_labels else sample

    def _augmented(self, items: Iterable[tuple[str, VisualSample]]) -> Iterator[VisualSample | tuple]:
        for key, sample in items:
            if self.augment is None:
                yield sample
                continue
            out = self.augment(sample, random.Random(f"{self.seed}:{self.epoch}:{key}"))
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if not outs or not all(isinstance(s, VisualSample) for s in outs):
                raise TypeError(
                    f"augment {self.augment!r} must return a VisualSample or a tuple of them, got {out!r:.200}"
                )
            if self.strip_labels:
                outs = tuple(without_labels(s) for s in outs)
            yield tuple(outs)  # a single sample as a 1-tuple: batches flatten tuples, and either counts as one item

    def _drawn(self, records: Iterable[dict[str, Any]], drawn: list[int], skip: int, counts: _WorkerCounts):
        """Counts the raw records drawn into ``drawn[0]``, dropping the first ``skip`` (already consumed)."""
        counts.quiet = skip > 0  # quiet while reading records 1 to ``skip``, whose skips the interrupted run logged
        for record in records:
            drawn[0] += 1
            counts.quiet = drawn[0] < skip
            if drawn[0] > skip:
                yield record
            elif drawn[0] == skip:  # where the interrupted run stood: what it read so far was counted and logged
                counts.unreported()
        if drawn[0] < skip:
            log.warning(
                "worker %d: cannot resume at record %d: this epoch's stream ends at record %d (the shards changed?)",
                counts.worker,
                skip,
                drawn[0],
            )

    def __iter__(self) -> Iterator[StreamBatch]:
        info = get_worker_info()
        loader_worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        worker = (loader_worker + self.worker_offset) % num_workers
        skip_records, skip_items, finished = self.resume_from.get(worker, (0, 0, False))
        if finished:
            return
        counts = _WorkerCounts(worker)
        stages = [*self._sources(worker, num_workers), functools.partial(expand_tars, counts=counts)]
        if self.split_by_sample and not self.resampled:
            stages.append(functools.partial(_take_every, start=self.rank, step=self.world_size))
        buffered = self.shuffle_buffer > 0
        if self.shuffle and buffered:
            rng = random.Random(derive_seed(self.seed, self.epoch, self.rank, worker, "buffer"))
            # webdataset's shuffle starts yielding once it holds min(100, buffer) records
            stages.append(wds.shuffle(self.shuffle_buffer, rng=rng))
        drawn = [0]
        stages.append(functools.partial(self._drawn, drawn=drawn, skip=skip_records, counts=counts))
        stages += [functools.partial(self._decode, counts=counts), self._augmented]
        items: Iterator = iter(wds.DataPipeline(*stages))
        if self.epoch_size is not None:
            share = epoch_share(self.epoch_size, self.batch_size, worker, num_workers)
            items = itertools.islice(items, max(share - skip_items, 0))
        batch: list = []
        done = skip_items
        for item in items:
            batch.append(item)
            if len(batch) == self.batch_size:
                done += len(batch)
                yield StreamBatch(collate_visual_samples(batch), counts.unreported(), worker, drawn[0], done)
                batch = []
        if batch or counts.total != counts.reported:
            done += len(batch)
            yield StreamBatch(collate_visual_samples(batch), counts.unreported(), worker, drawn[0], done, final=True)


def _take_every(items: Iterable, start: int, step: int) -> Iterator:
    for i, item in enumerate(items):
        if i % step == start:
            yield item


class ShardLoader:
    """Iterates a :class:`ShardStream` through a ``DataLoader`` and yields ``list[VisualSample]`` batches.

    A plain ``DataLoader`` with ``batch_size=None`` rather than ``wds.WebLoader``: batching happens in the workers, so
    the fluid re-batching WebLoader adds would only move Python objects through the main process; and wrapping it
    (instead of subclassing) lets the skip counts be taken off each item, while Lightning, seeing no ``DataLoader``,
    never tries to re-instantiate it with a sampler. Workers are not persistent: each pass forks them afresh with the
    current epoch, which seeds shard order, shuffling and augmentation.

    Batches travel from the workers as pickled PIL images. Rebuilding them costs the main process about 0.3 ms per
    256 x 256 image (mostly touching fresh memory); moving the pixels through shared memory instead saved it a fifth
    of that, cost the workers more than it saved, and fails where ``/dev/shm`` is small (containers), so it was not
    kept (see ``benchmarks/loader.py``).

    Resuming mid-epoch, exactly: :meth:`position` says where the stream stood after a number of batches of this pass
    (each worker's drawn records and yielded items, whose turn came next, the skips counted so far), and
    :meth:`resume` makes the next pass of that epoch start there (see :class:`ShardStream`), with workers as well
    as without. The batches that follow are those an uninterrupted pass would have yielded next, in the same order,
    as long as the shards, the seed, the batch size, the shuffle buffer, the epoch size and the number of workers are
    the same (the data module checks; ``_position_config``).

    Args:
        stream: the dataset.
        num_workers: worker processes (0: in the main process).
        epoch_fn: the epoch of the pass about to start (e.g. the trainer's); None counts passes from 0.
        on_skip: called in the main process with the skips each time more arrive.
    """

    HISTORY = 32
    """Positions kept for the last batches yielded: a trainer may have fetched a few batches it has not trained on."""

    def __init__(
        self,
        stream: ShardStream,
        num_workers: int = 0,
        epoch_fn: Callable[[], int | None] | None = None,
        on_skip: Callable[[SkipCounts], None] | None = None,
    ) -> None:
        self.stream, self.num_workers = stream, num_workers
        self.epoch_fn, self.on_skip = epoch_fn, on_skip
        self.skipped = SkipCounts()
        self.passes = 0
        self.skipped_this_pass = SkipCounts()
        # batches yielded this pass -> position, and the last count yielded: both set when a pass starts, read after
        self._positions: dict[int, dict[str, Any]] = {}
        self._latest = 0
        self._start: dict[str, Any] | None = None  # where this pass started
        self._resume: dict[str, Any] | None = None
        self.loader = DataLoader(stream, batch_size=None, num_workers=num_workers, collate_fn=_identity)

    def __len__(self) -> int:
        """Batches per epoch; known only for resampled streams, whose epochs have an exact size."""
        if not self.stream.resampled:
            raise TypeError("a finite shard stream has no length known in advance")
        return math.ceil(self.stream.epoch_size / self.stream.batch_size)

    def position(self, batches: int | None = None) -> dict[str, Any]:
        """Where this pass stood after it had yielded ``batches`` batches (default: all it has yielded so far).

        A JSON-serialisable dict for :meth:`resume`: ``epoch``, ``batches``, ``workers`` (``[worker, records, items,
        final]`` of each worker heard from), ``next_worker`` (whose turn came next) and ``skipped`` (the skips this
        pass had reported by then, ``[shards, samples]``). Before any pass, or with a :meth:`resume` pending, it is
        where the next pass will start. A count the loader has no position for (more than it yielded, or older than its
        last ``HISTORY`` batches) gives where this pass started, with a warning: a resumed run then repeats data, but
        loses none.
        """
        if self._resume is not None:
            return self._resume
        if self._start is None:
            epoch = self.epoch_fn() if self.epoch_fn is not None else None
            return _start_position(self.passes if epoch is None else epoch, SkipCounts())
        batches = self._latest if batches is None else batches
        if batches in self._positions:
            return self._positions[batches]
        log.warning(
            "shard loader: no position after %d batches of epoch %d (it yielded %d, keeps the last %d); a resumed run "
            "will replay this epoch from batch %d",
            batches,
            self.stream.epoch,
            self._latest,
            self.HISTORY,
            self._start["batches"],
        )
        return self._start

    def skipped_since(self, position: dict[str, Any]) -> SkipCounts:
        """The skips this pass reported after ``position`` (one of its own): those of batches yielded after it."""
        if self._resume is not None or self._start is None or position["epoch"] != self.stream.epoch:
            return SkipCounts()
        return self.skipped_this_pass - SkipCounts(*position["skipped"])

    def resume(self, position: dict[str, Any] | None) -> None:
        """Start the next pass where ``position`` (from :meth:`position`) stood, if that pass is of its epoch."""
        self._resume = position

    def __iter__(self) -> Iterator[list[VisualSample]]:
        epoch = self.epoch_fn() if self.epoch_fn is not None else None
        resume, self._resume = self._resume, None
        if resume is not None and epoch is None:  # no trainer: passes count epochs, so continue the count
            self.passes = resume["epoch"]
        epoch = self.passes if epoch is None else epoch
        self.passes += 1
        if resume is not None and resume["epoch"] != epoch:
            log.info("shard loader: the saved position is in epoch %d; epoch %d starts afresh", resume["epoch"], epoch)
            resume = None
        if resume is None:
            resume = _start_position(epoch, SkipCounts())
        elif resume["batches"]:
            log.info("shard loader: resuming epoch %d after batch %d", epoch, resume["batches"])
        workers = max(self.num_workers, 1)
        progress = {w: (records, items, final) for w, records, items, final in resume["workers"]}
        self.stream.epoch, self.stream.resume_from = epoch, dict(progress)
        self.stream.worker_offset = resume["next_worker"] % workers
        self.skipped_this_pass = SkipCounts(*resume["skipped"])
        batches = self._latest = resume["batches"]
        self._start, self._positions = resume, {batches: resume}
        for item in self.loader:
            progress[item.worker] = (item.records, item.items, item.final)
            if item.skipped:
                self.skipped = self.skipped + item.skipped
                self.skipped_this_pass = self.skipped_this_pass + item.skipped
                if self.on_skip is not None:
                    self.on_skip(item.skipped)
            if item.samples:
                batches = self._latest = batches + 1
                self._positions[batches] = {
                    "epoch": epoch,
                    "batches": batches,
                    "workers": [[w, *progress[w]] for w in sorted(progress)],
                    "next_worker": (item.worker + 1) % workers,
                    "skipped": [self.skipped_this_pass.shards, self.skipped_this_pass.samples],
                }
                self._positions.pop(batches - self.HISTORY, None)
                yield item.samples


def _start_position(epoch: int, skipped: SkipCounts) -> dict[str, Any]:
    return {"epoch": epoch, "batches": 0, "workers": [], "next_worker": 0, "skipped": [skipped.shards, skipped.samples]}


def _identity(item: Any) -> Any:
    return item

"""Where dynamic sampling (DAPO, ``pipeline.dynamic_sampling``) takes its extra prompts from, without moving the
main training loader: by index from a map-style data set (:class:`IndexDrawer`), or from a second, seeded pass over a
shard stream (:class:`StreamDrawer`). :func:`prompt_drawer` picks one for a data set, :func:`saved_drawer` restores the
one a checkpoint saved."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import IterableDataset

from app.data.shard_stream import ShardLoader, ShardStream, derive_seed
from app.types import VisualSample

log = logging.getLogger(__name__)


class PromptDrawer(Protocol):
    """Draws the extra prompts of dynamic sampling from the training data, and saves and restores where it stands.

    :class:`IndexDrawer` draws from a map-style data set, :class:`StreamDrawer` from a shard stream;
    :func:`prompt_drawer` picks the one for a data set, :func:`saved_drawer` the one a checkpoint saved.
    """

    def draw(self, dataset: Any, num_items: int, collate: Callable | None) -> list[VisualSample]: ...

    def takes(self, dataset: Any) -> bool: ...

    def state(self) -> Any: ...

    def load_state(self, state: Any) -> None: ...


def is_map_style(dataset: Any) -> bool:
    """Whether ``dataset`` can be indexed: ``__len__`` and ``__getitem__``, and not an ``IterableDataset``."""
    return not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


class IndexDrawer:
    """Draws extra prompts by index, uniformly with replacement, from a map-style training data set, with its own
    seeded generator (``pipeline.seed + rank``); its state is the generator's."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def takes(self, dataset: Any) -> bool:
        return is_map_style(dataset)

    def draw(self, dataset: Any, num_items: int, collate: Callable) -> list[VisualSample]:
        if not self.takes(dataset):
            raise TypeError(f"IndexDrawer draws by index: {type(dataset).__name__} is not map-style")
        indices = torch.randint(len(dataset), (num_items,), generator=self.generator).tolist()
        return collate([dataset[i] for i in indices])

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


class StreamDrawer:
    """Draws extra prompts from a second pass over a training :class:`~app.data.shard_stream.ShardStream`, in the
    training process, so the main loader's order and position are untouched.

    The refill stream is the training stream (shards, rank split, shuffle buffer, epoch size, resampling, augment)
    with its own seed, derived from ``pipeline.seed``, and one item per batch; it always shuffles. Its seed is the
    same on every rank because the stream orders the shards alike on every rank before each takes its own: in finite
    mode ranks therefore draw from disjoint shards (the main stream's split), while a resampled stream draws shards
    per rank with replacement, as the main one does. The whole of this rank's share is read (the main loader's
    workers only divide it). When the refill stream ends it starts its next epoch (reshuffled): extra prompts cycle.
    Bad data it meets is logged by the stream, but not counted in the data module's skip counts (the main stream
    counts it).

    Resuming: :meth:`state` is :meth:`ShardLoader.position <app.data.shard_stream.ShardLoader.position>` of the
    refill loader after the last item drawn, with what it is valid for; :meth:`load_state` makes the next pass
    continue there (:meth:`ShardLoader.resume <app.data.shard_stream.ShardLoader.resume>`), so a resumed run draws the
    extra prompts an uninterrupted one would have. When the stream has changed since (shards, seed, shuffle buffer,
    epoch size, resampling, rank or world size), it starts afresh, with a warning.

    Args:
        seed: ``pipeline.seed``.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.loader: ShardLoader | None = None
        self._batches: Iterator[list[VisualSample]] | None = None
        self._saved: dict[str, Any] | None = None  # a loaded state, until the refill loader is built

    def takes(self, dataset: Any) -> bool:
        return isinstance(dataset, ShardStream)

    def draw(self, dataset: ShardStream, num_items: int, collate: Callable | None = None) -> list[VisualSample]:
        """``num_items`` stream items (an augmented tuple is one), flattened; ``collate`` is unused: the stream's
        batches come collated."""
        if self.loader is None:
            self.loader = self._loader(dataset)
        samples: list[VisualSample] = []
        for _ in range(num_items):
            samples += self._next_item()
        return samples

    def _loader(self, main: ShardStream) -> ShardLoader:
        stream = ShardStream(
            main.urls,
            batch_size=1,
            rank=main.rank,
            world_size=main.world_size,
            split_by_sample=main.split_by_sample,
            seed=derive_seed(self.seed, "dynamic sampling"),
            shuffle=True,
            shuffle_buffer=main.shuffle_buffer,
            resampled=main.resampled,
            epoch_size=main.epoch_size,
            augment=main.augment,
            strip_labels=main.strip_labels,
        )
        loader = ShardLoader(stream)  # in this process: the refill is inline, and its position exact
        saved, self._saved = self._saved, None
        if saved is not None and saved["position"] is not None:
            changed = sorted(k for k, v in _stream_config(stream).items() if saved["config"].get(k) != v)
            if changed:
                log.warning(
                    "dynamic sampling: not resuming the refill stream: %s changed since the checkpoint; it starts "
                    "afresh",
                    ", ".join(changed),
                )
            else:
                loader.resume(saved["position"])
        return loader

    def _next_item(self) -> list[VisualSample]:
        for _ in range(2):  # this epoch's next item, else the next epoch's first
            if self._batches is None:
                self._batches = iter(self.loader)
            item = next(self._batches, None)
            if item is not None:
                return item
            self._batches = None
        stream = self.loader.stream
        raise ValueError(
            f"dynamic sampling: the training stream yields no samples on rank {stream.rank} of {stream.world_size} "
            f"({len(stream.urls)} shards); check train_urls"
        )

    def state(self) -> dict[str, Any]:
        """``{"seed", "config", "position"}`` (plain data); ``position`` is None before anything was drawn."""
        if self.loader is None:
            return self._saved or {"seed": self.seed, "config": None, "position": None}
        return {"seed": self.seed, "config": _stream_config(self.loader.stream), "position": self.loader.position()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Draw next from where ``state`` (from :meth:`state`) stood, once the refill loader is (re)built."""
        self.loader, self._batches, self._saved = None, None, state


def _stream_config(stream: ShardStream) -> dict[str, Any]:
    """What a refill position is only valid for."""
    return {
        "shards": [os.path.basename(u) for u in stream.urls],
        "seed": stream.seed,
        "shuffle_buffer": stream.shuffle_buffer,
        "resampled": stream.resampled,
        "epoch_size": stream.epoch_size,
        "rank": stream.rank,
        "world_size": stream.world_size,
    }


def prompt_drawer(dataset: Any, seed: int, rank: int) -> PromptDrawer:
    """The drawer for ``dataset`` (None: map-style): an :class:`IndexDrawer` seeded with ``seed + rank``, or a
    :class:`StreamDrawer` for a shard stream; a clear error for any other data set."""
    if dataset is None or is_map_style(dataset):
        return IndexDrawer(seed + rank)
    if isinstance(dataset, ShardStream):
        return StreamDrawer(seed)
    raise TypeError(
        f"dynamic sampling draws extra prompts by index from a map-style training data set (with __len__ and "
        f"__getitem__) or from a second pass over a shard stream (app.data.ShardDataModule); the training data set "
        f"is a {type(dataset).__name__}, neither: use one of those, or turn pipeline.dynamic_sampling off"
    )


def saved_drawer(state: Any, seed: int, rank: int) -> PromptDrawer:
    """The drawer a checkpoint saved (:meth:`PromptDrawer.state`), restored."""
    drawer = StreamDrawer(seed) if isinstance(state, dict) else IndexDrawer(seed + rank)
    drawer.load_state(state)
    return drawer


def refill_source(loader: Any, num_prompts: int) -> tuple[Any, int, Callable | None]:
    """``(dataset, items per extra rollout, collate)`` for :meth:`PromptDrawer.draw` from the training loader: a
    ``ShardLoader``'s stream and batch size (its batches come collated), or a ``DataLoader``'s data set, batch size
    (``num_prompts`` without one) and collate function; another loader is passed as its own data set (None, before
    there is a training loader, as None: no data set known)."""
    if isinstance(loader, ShardLoader):
        return loader.stream, loader.stream.batch_size, None
    return (
        getattr(loader, "dataset", loader),
        getattr(loader, "batch_size", None) or num_prompts,
        getattr(loader, "collate_fn", None),
    )

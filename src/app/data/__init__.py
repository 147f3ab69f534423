"""Data plumbing: the shard schema, writing and streaming shards, samplers, and the data modules that serve samples as
lists of ``VisualSample``.

The task generators themselves live in :mod:`app.tasks`; a data module receives one as a data set factory
(:class:`VisualTaskDataModule`) or reads what a generator wrote to shards (:class:`ShardDataModule`).
"""

from app.data.datamodule import DatasetFactory, VisualTaskDataModule, collate_visual_samples, split_seed
from app.data.shard_datamodule import ShardDataModule
from app.data.shards import LABEL_META_KEYS, expand_urls, read_samples, write_samples

__all__ = [
    "LABEL_META_KEYS",
    "DatasetFactory",
    "ShardDataModule",
    "VisualTaskDataModule",
    "collate_visual_samples",
    "expand_urls",
    "read_samples",
    "split_seed",
    "write_samples",
]

"""Data: task generators and the data module that serves them as lists of ``VisualSample``."""

from app.data.counting import CountingDataset
from app.data.datamodule import TASKS, VisualTaskDataModule, collate_visual_samples
from app.data.dots import DotsDataset, make_dots_sample
from app.data.pairs import PairedDotsDataset
from app.data.transforms import TransformDataset
from app.data.triplets import TripletDotsDataset, make_dots_triplet_sample

__all__ = [
    "TASKS",
    "CountingDataset",
    "DotsDataset",
    "PairedDotsDataset",
    "TransformDataset",
    "TripletDotsDataset",
    "VisualTaskDataModule",
    "collate_visual_samples",
    "make_dots_sample",
    "make_dots_triplet_sample",
]

from app.data.shapes import ShapePromptDataset  # noqa: E402

__all__ += ["ShapePromptDataset"]

from app.data.shards import LABEL_META_KEYS, expand_urls, read_samples, write_samples  # noqa: E402

__all__ += ["LABEL_META_KEYS", "expand_urls", "read_samples", "write_samples"]

from app.data.shard_datamodule import ShardDataModule  # noqa: E402

__all__ += ["ShardDataModule"]

"""Data: task generators and the data module that serves them as lists of ``VisualSample``."""

from app.data.datamodule import TASKS, VisualTaskDataModule, collate_visual_samples
from app.data.dots import DotsDataset, make_dots_sample

__all__ = ["TASKS", "DotsDataset", "VisualTaskDataModule", "collate_visual_samples", "make_dots_sample"]

"""Spatial VQA from 3D boxes (OT-GRPO, Appendix D, docs/algorithms.md#papers): Omni3D-style records, procedural scenes,
the four boolean tasks (orientation, depth, size, relative distance) and two numeric ones (counting, distance),
coloured markers, question templates, and augmentations with a known answer effect for consistency training.

Stages: a record (:class:`ImageRecord`, from :func:`load_omni3d` or :func:`render_scene` of a :func:`sample_scene`)
-> :func:`build_question` (filters, scoring, selection; a JSON-ready meta) -> :func:`make_sample` (markers drawn,
question rendered) -> :class:`SpatialPairAugmenter` (the twin for consistency rewards).

>>> sample = SpatialVQADataset(num_samples=4, seed=0, image_size=96)[0]
>>> sample.task, sample.answer in ("yes", "no"), sample.meta["answer_type"], sample.images[0].size
('spatial_orientation', True, 'bool', (96, 96))
"""

from app.tasks.spatial.augment import TRANSFORMS, SpatialPairAugmenter, compose, effect
from app.tasks.spatial.dataset import SpatialVQADataset, make_sample, make_spatial_sample, omni3d_samples
from app.tasks.spatial.omni3d import ImageRecord, Object3D, load_image, load_omni3d, parse_omni3d, to_omni3d
from app.tasks.spatial.render import render_scene
from app.tasks.spatial.scenes import sample_scene
from app.tasks.spatial.tasks import (
    ANSWER_TYPES,
    BOOL_TASKS,
    NUMERIC_TASKS,
    TASK_NAMES,
    SelectionConfig,
    answer_from_meta,
    build_question,
)
from app.tasks.spatial.templates import render_question

__all__ = [
    "ANSWER_TYPES",
    "BOOL_TASKS",
    "NUMERIC_TASKS",
    "TASK_NAMES",
    "TRANSFORMS",
    "ImageRecord",
    "Object3D",
    "SelectionConfig",
    "SpatialPairAugmenter",
    "SpatialVQADataset",
    "answer_from_meta",
    "build_question",
    "compose",
    "effect",
    "load_image",
    "load_omni3d",
    "make_sample",
    "make_spatial_sample",
    "omni3d_samples",
    "parse_omni3d",
    "render_question",
    "render_scene",
    "sample_scene",
    "to_omni3d",
]

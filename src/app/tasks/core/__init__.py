"""CoRe metadata-driven comparison triplets (CoRe section 3.2, docs/algorithms.md#papers).

The pipeline, one module per stage: :mod:`~app.tasks.core.scenes` (the procedural annotation source, rendered by
:mod:`~app.tasks.core.render`, in the formats of :mod:`~app.tasks.core.annotations`) -> :mod:`~app.tasks.core.metrics`
(metric extraction experts ``f_m``) -> :mod:`~app.tasks.core.quality` (quality control ``phi_m``) ->
:mod:`~app.tasks.core.questions` (question generation) -> :mod:`~app.tasks.core.dataset` (``CoreTripletDataset``);
:mod:`~app.tasks.core.cli` writes shards (``python -m app.tasks core``).
"""

from app.tasks.core.annotations import Box2D, ImageAnnotation, Object3D
from app.tasks.core.dataset import CoreTripletDataset, make_core_triplet
from app.tasks.core.metrics import (
    RELATIONS,
    TASKS,
    count_instances,
    ego_distance,
    measure,
    median_depth,
    spatial_relation,
)
from app.tasks.core.quality import DEFAULT_RULES, CategoricalRule, NumericRule, QualityStats, quality_check
from app.tasks.core.questions import TASK_TEXTS, TripletQuestion, build_question
from app.tasks.core.scenes import SceneConfig

__all__ = [
    "DEFAULT_RULES",
    "RELATIONS",
    "TASKS",
    "TASK_TEXTS",
    "Box2D",
    "CategoricalRule",
    "CoreTripletDataset",
    "ImageAnnotation",
    "NumericRule",
    "Object3D",
    "QualityStats",
    "SceneConfig",
    "TripletQuestion",
    "build_question",
    "count_instances",
    "ego_distance",
    "make_core_triplet",
    "measure",
    "median_depth",
    "quality_check",
    "spatial_relation",
]

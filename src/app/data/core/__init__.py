"""CoRe metadata-driven comparison triplets (papers/002 section 3.2).

The pipeline, one module per stage: :mod:`~app.data.core.scenes` (the procedural annotation source, rendered by
:mod:`~app.data.core.render`, in the formats of :mod:`~app.data.core.annotations`) -> :mod:`~app.data.core.metrics`
(metric extraction experts ``f_m``) -> :mod:`~app.data.core.quality` (quality control ``phi_m``) ->
:mod:`~app.data.core.questions` (question generation) -> :mod:`~app.data.core.dataset` (``CoreTripletDataset``);
:mod:`~app.data.core.cli` writes shards (``python -m app.data core``).
"""

from app.data.core.annotations import Box2D, ImageAnnotation, Object3D
from app.data.core.dataset import CoreTripletDataset, make_core_triplet
from app.data.core.metrics import (
    RELATIONS,
    TASKS,
    count_instances,
    ego_distance,
    measure,
    median_depth,
    spatial_relation,
)
from app.data.core.quality import DEFAULT_RULES, CategoricalRule, NumericRule, QualityStats, quality_check
from app.data.core.questions import TASK_TEXTS, TripletQuestion, build_question
from app.data.core.scenes import SceneConfig

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

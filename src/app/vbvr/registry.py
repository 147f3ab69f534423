"""The task registry: the built-in tasks by name, :func:`register` for more, :func:`get_task` to instantiate one.

The registry imports the task modules (each defines one :class:`~app.vbvr.core.VisualTask` subclass and imports only
:mod:`app.vbvr.core` and helpers), never the other way round, so the task package and the registry do not import each
other.
"""

from __future__ import annotations

from typing import Any

from app.vbvr.core import FACULTIES, VisualTask
from app.vbvr.tasks.color_mixing import ColorMixingTask
from app.vbvr.tasks.connect_the_dots import ConnectTheDotsTask
from app.vbvr.tasks.counting import CountingTask
from app.vbvr.tasks.gravity_drop import GravityDropTask
from app.vbvr.tasks.maze_path import MazePathTask
from app.vbvr.tasks.object_tracking import ObjectTrackingTask
from app.vbvr.tasks.path_around_obstacles import PathAroundObstaclesTask
from app.vbvr.tasks.pattern_continuation import PatternContinuationTask
from app.vbvr.tasks.rotation import RotationTask
from app.vbvr.tasks.shape_matching import ShapeMatchingTask
from app.vbvr.tasks.sliding_block import SlidingBlockTask
from app.vbvr.tasks.sorting_by_size import SortingBySizeTask
from app.vbvr.tasks.symmetry_completion import SymmetryCompletionTask

BUILTIN_TASKS: tuple[type[VisualTask], ...] = (
    ColorMixingTask,
    ConnectTheDotsTask,
    CountingTask,
    GravityDropTask,
    MazePathTask,
    ObjectTrackingTask,
    PathAroundObstaclesTask,
    PatternContinuationTask,
    RotationTask,
    ShapeMatchingTask,
    SlidingBlockTask,
    SortingBySizeTask,
    SymmetryCompletionTask,
)
"""The 13 tasks of the suite (VBVR-Pro, docs/algorithms.md#papers)."""

TASKS: dict[str, type[VisualTask]] = {}


def register(cls: type[VisualTask]) -> type[VisualTask]:
    """Make a task available by its ``name`` (usable as a class decorator)."""
    if cls.name in TASKS and TASKS[cls.name] is not cls:
        raise ValueError(f"task name {cls.name!r} is registered twice")
    if cls.faculty not in FACULTIES:
        raise ValueError(f"{cls.__name__}.faculty must be one of {FACULTIES}, got {cls.faculty!r}")
    TASKS[cls.name] = cls
    return cls


for _task in BUILTIN_TASKS:
    register(_task)


def get_task(name: str, **params: Any) -> VisualTask:
    """An instance of the registered task ``name`` with its parameters (grid size, object count, ...)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name](**params)

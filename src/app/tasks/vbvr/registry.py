"""The task registry: the built-in tasks by name, :func:`register` for more, :func:`get_task` to instantiate one.

The registry imports the task modules of :mod:`app.tasks.vbvr.puzzles` (each defines one
:class:`~app.tasks.vbvr.core.VisualTask` subclass and imports only :mod:`app.tasks.vbvr.core` and helpers), never the
other way round, so the puzzles package and the registry do not import each other.
"""

from __future__ import annotations

from typing import Any

from app.tasks.vbvr.core import FACULTIES, VisualTask
from app.tasks.vbvr.puzzles.color_mixing import ColorMixingTask
from app.tasks.vbvr.puzzles.connect_the_dots import ConnectTheDotsTask
from app.tasks.vbvr.puzzles.counting import CountingTask
from app.tasks.vbvr.puzzles.gravity_drop import GravityDropTask
from app.tasks.vbvr.puzzles.maze_path import MazePathTask
from app.tasks.vbvr.puzzles.object_tracking import ObjectTrackingTask
from app.tasks.vbvr.puzzles.path_around_obstacles import PathAroundObstaclesTask
from app.tasks.vbvr.puzzles.pattern_continuation import PatternContinuationTask
from app.tasks.vbvr.puzzles.rotation import RotationTask
from app.tasks.vbvr.puzzles.shape_matching import ShapeMatchingTask
from app.tasks.vbvr.puzzles.sliding_block import SlidingBlockTask
from app.tasks.vbvr.puzzles.sorting_by_size import SortingBySizeTask
from app.tasks.vbvr.puzzles.symmetry_completion import SymmetryCompletionTask

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

"""VBVR-Pro-style procedural visual reasoning tasks with deterministic classical-CV reward scorers (papers/003).

A task is a parameterised program: a configuration is sampled from a seed, a solver computes the solution, and the
problem and its solution are rendered as a video (frames) and as the Last-Frame, Key-Frame and Multi-Frame image
regimes. A scorer locates objects with classical computer vision (HSV segmentation, contours, connected components),
extracts attributes and runs task-specific checks against the configuration: soft checks combine by a weighted sum,
hard constraints by a product; the result carries the failed checks.
"""

from app.vbvr.core import TASKS, TaskInstance, VisualTask, get_task, register
from app.vbvr.scoring import Check, ScoreResult, combine

__all__ = ["TASKS", "Check", "ScoreResult", "TaskInstance", "VisualTask", "combine", "get_task", "register"]

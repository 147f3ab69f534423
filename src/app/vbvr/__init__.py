"""VBVR-Pro-style procedural visual reasoning tasks with deterministic classical-CV reward scorers (VBVR-Pro,
docs/algorithms.md#papers).

A task is a parameterised program: a configuration is sampled from a seed, a solver computes the solution, and the
problem and its solution are rendered as a video (frames) and as the Last-Frame, Key-Frame and Multi-Frame image
regimes. A scorer locates objects with classical computer vision (HSV segmentation, contours, connected components,
:mod:`app.cv`), extracts attributes and runs task-specific checks against the configuration: soft checks combine by a
weighted sum, hard constraints by a product; the result carries the failed checks.

Generation and scoring of a task share one class (the scorer checks the configuration the generator sampled), so the
task programs live here, beside their scorers, where both sides import them: :class:`app.rewards.vbvr.VBVRScorerReward`
scores with them, and :mod:`app.tasks.vbvr` turns them into prompt data sets and shards
(``python -m app.tasks vbvr``). ``python -m app.vbvr.validation`` checks every scorer.
"""

from app.vbvr.core import TaskInstance, VisualTask
from app.vbvr.registry import TASKS, get_task, register
from app.vbvr.scoring import Check, ScoreResult, combine

__all__ = ["TASKS", "Check", "ScoreResult", "TaskInstance", "VisualTask", "combine", "get_task", "register"]

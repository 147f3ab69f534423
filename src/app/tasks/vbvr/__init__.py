"""VBVR-Pro-style procedural visual reasoning tasks with deterministic classical-CV scorers (VBVR-Pro,
docs/algorithms.md#papers): the task programs, their scorers as a reward, generation prompts and shards.

A task is a parameterised program (:class:`VisualTask`, one module each in :mod:`~app.tasks.vbvr.puzzles`, named by
:mod:`~app.tasks.vbvr.registry`): a configuration is sampled from a seed, a solver computes the solution, and the
problem and its solution are rendered as a video (frames) and as the Last-Frame, Key-Frame and Multi-Frame image
regimes (:mod:`~app.tasks.vbvr.regimes`). A scorer locates objects with classical computer vision (HSV segmentation,
contours, connected components, :mod:`app.cv`), extracts attributes and runs task-specific checks against the
configuration: soft checks combine by a weighted sum, hard constraints by a product (:mod:`~app.tasks.vbvr.scoring`);
the result carries the failed checks. Generation and scoring of a task share one class (the scorer checks the
configuration the generator sampled).

- :class:`VBVRScorerReward` (:mod:`~app.tasks.vbvr.reward`): the scorers as a TorchMetrics-style reward for generated
  images and videos, optionally in a process pool.
- :class:`VBVRPromptDataset`: prompts for flow-GRPO; :func:`write_shards` / :func:`read_shards`: the suite as
  WebDataset shards (``python -m app.tasks vbvr``).
- ``python -m app.tasks.vbvr.validation`` checks every scorer.

The scoring core (everything here but the reward, the shards and the CLI) imports neither :mod:`app.data` nor
:mod:`app.rewards` (tests/test_import_layers.py).
"""

from app.tasks.vbvr.core import TaskInstance, VisualTask
from app.tasks.vbvr.prompts import VBVRPromptDataset
from app.tasks.vbvr.registry import TASKS, get_task, register
from app.tasks.vbvr.reward import VBVRScorerReward
from app.tasks.vbvr.scoring import Check, ScoreResult, combine
from app.tasks.vbvr.shards import read_shards, write_shards

__all__ = [
    "TASKS",
    "Check",
    "ScoreResult",
    "TaskInstance",
    "VBVRPromptDataset",
    "VBVRScorerReward",
    "VisualTask",
    "combine",
    "get_task",
    "read_shards",
    "register",
    "write_shards",
]

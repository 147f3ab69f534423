"""VBVR-Pro generation data (docs/algorithms.md#papers): prompts for flow-GRPO (:class:`VBVRPromptDataset`) and the
suite as WebDataset shards (:mod:`~app.tasks.vbvr.shards`, ``python -m app.tasks vbvr``), from the task programs of
:mod:`app.vbvr`, whose scorers :class:`app.rewards.vbvr.VBVRScorerReward` turns into a reward.
"""

from app.tasks.vbvr.prompts import VBVRPromptDataset

__all__ = ["VBVRPromptDataset"]

"""Rewards scored by frozen learned models: CLIPScore, a human-preference score (PickScore / HPS-v2 style) and a
VLM-as-a-judge ``p(yes)``.

Imported on its own (``app.rewards.learned``, not re-exported by :mod:`app.rewards`), so that ``import app.rewards``
stays free of model code; the models themselves load on a reward's first score. Each defaults to an embedded tiny
model built offline (:mod:`app.tiny.scorers`, :mod:`app.tiny.models`); real checkpoints are hub ids.

- :class:`CLIPScoreReward`: ``max(cos(E_image, E_prompt), 0)`` in [0, 1] (Hessel et al., 2021, without its 2.5).
- :class:`PreferenceScoreReward`: ``(logit_scale.exp() * cos - offset) / scale`` of a preference checkpoint.
- :class:`VLMJudgeReward`: ``softmax([logit(yes), logit(no)])[0]`` of a Qwen-VL judge, in [0, 1].
"""

from app.rewards.learned.clip_score import CLIPScoreReward
from app.rewards.learned.preference import PreferenceScoreReward
from app.rewards.learned.vlm_judge import VLMJudgeReward

__all__ = ["CLIPScoreReward", "PreferenceScoreReward", "VLMJudgeReward"]

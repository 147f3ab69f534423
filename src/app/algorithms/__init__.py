"""RL objectives as pure tensor math: group advantages and the token-level GRPO loss (see docs/algorithms.md#grpo)."""

from app.algorithms.advantages import AdvantageScale, group_advantages, zero_std_groups
from app.algorithms.loss import Aggregation, GRPOLossOutput, aggregate, clipped_surrogate, grpo_loss, k3_kl

__all__ = [
    "AdvantageScale",
    "Aggregation",
    "GRPOLossOutput",
    "aggregate",
    "clipped_surrogate",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "zero_std_groups",
]

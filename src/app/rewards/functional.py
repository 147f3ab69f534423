"""Functional twins of the reward classes: plain functions from completions (and labels) to ``[N]`` float32 tensors.

Each reward class ``FooReward`` has a twin ``foo_reward`` that does the math; the class adds weight, name and the
TorchMetrics accumulation.
"""

from app.rewards.accuracy import accuracy_reward
from app.rewards.consistency import consistency_rewards
from app.rewards.format import format_reward
from app.rewards.function_sequence import function_sequence_reward
from app.rewards.numeric import numeric_tolerance_reward
from app.rewards.ocr import ocr_reward
from app.rewards.stabilizers import cosine_length_reward, repetition_penalty, soft_overlong_penalty
from app.rewards.trisr_scores import (
    attribute_grounding_reward,
    judgment_alignment_reward,
    tri_sr_reward,
    triplet_attribute_accuracy,
    triplet_consistency_reward,
    triplet_cycle_rate,
    triplet_order_accuracy,
    triplet_overall_accuracy,
    triplet_partial_accuracy,
    triplet_task_reward,
)

consistency_reward = consistency_rewards  # the twin of ConsistencyReward under the package's naming rule

__all__ = [
    "accuracy_reward",
    "attribute_grounding_reward",
    "consistency_reward",
    "consistency_rewards",
    "cosine_length_reward",
    "format_reward",
    "function_sequence_reward",
    "judgment_alignment_reward",
    "numeric_tolerance_reward",
    "ocr_reward",
    "repetition_penalty",
    "soft_overlong_penalty",
    "tri_sr_reward",
    "triplet_attribute_accuracy",
    "triplet_consistency_reward",
    "triplet_cycle_rate",
    "triplet_order_accuracy",
    "triplet_overall_accuracy",
    "triplet_partial_accuracy",
    "triplet_task_reward",
]

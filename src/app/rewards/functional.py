"""Functional twins of the reward classes: plain functions from completions (and labels) to ``[N]`` float32 tensors.

Each reward class ``FooReward`` has a twin ``foo_reward`` that does the math; the class adds weight, name and the
TorchMetrics accumulation.
"""

from app.rewards.accuracy import accuracy_reward
from app.rewards.format import format_reward

__all__ = ["accuracy_reward", "format_reward"]

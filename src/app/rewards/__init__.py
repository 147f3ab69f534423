"""TorchMetrics-style rewards: components with functional twins, a weighted composite, and safe answer parsing.

See :mod:`app.rewards.base` for how to write a reward.
"""

from app.rewards import functional, parsing
from app.rewards.accuracy import AccuracyReward
from app.rewards.base import RewardComponent
from app.rewards.composite import WeightedReward
from app.rewards.format import FormatReward

__all__ = ["AccuracyReward", "FormatReward", "RewardComponent", "WeightedReward", "functional", "parsing"]

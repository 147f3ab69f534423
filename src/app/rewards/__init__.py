"""TorchMetrics-style rewards: components with functional twins, a weighted composite, and safe answer parsing.

See :mod:`app.rewards.base` for how to write a reward.

- Format: :class:`FormatReward` (``<think>``/``<answer>``, or with ``<summary>``/``<caption>``).
- Reason-RFT accuracy: :class:`AccuracyReward` (discrete), :class:`NumericToleranceReward` (cosine tolerance band),
  :class:`FunctionSequenceReward` (alpha / beta partial credit).
- OT-GRPO consistency (label-free): :class:`ConsistencyReward` (random / one-to-all / minimal pairing).
- CoRe TriSR: :class:`TriSRReward` and its terms; :class:`TripletOverallAccuracy`, :class:`TripletPartialAccuracy`,
  :class:`TripletOrderAccuracy`, :class:`TripletCycleRate`, :class:`TripletAttributeAccuracy`.
- Served by another process: :class:`RemoteReward` (:mod:`app.rewards.serve`, :mod:`app.rewards.wire`).
- Stabilisers: :class:`CosineLengthReward`, :class:`RepetitionPenalty`, :class:`SoftOverlongPenalty`.
"""

from app.rewards import functional, parsing
from app.rewards.accuracy import AccuracyReward
from app.rewards.base import RewardComponent, RewardError
from app.rewards.composite import PendingRewards, WeightedReward
from app.rewards.consistency import ConsistencyReward
from app.rewards.format import FormatReward
from app.rewards.function_sequence import FunctionSequenceReward
from app.rewards.numeric import NumericToleranceReward
from app.rewards.remote import RemoteReward
from app.rewards.stabilizers import CosineLengthReward, RepetitionPenalty, SoftOverlongPenalty
from app.rewards.trisr import (
    AttributeGroundingReward,
    JudgmentAlignmentReward,
    TripletAttributeAccuracy,
    TripletConsistencyReward,
    TripletCycleRate,
    TripletOrderAccuracy,
    TripletOverallAccuracy,
    TripletPartialAccuracy,
    TripletTaskReward,
    TriSRReward,
)

__all__ = [
    "AccuracyReward",
    "AttributeGroundingReward",
    "ConsistencyReward",
    "CosineLengthReward",
    "FormatReward",
    "FunctionSequenceReward",
    "JudgmentAlignmentReward",
    "NumericToleranceReward",
    "RemoteReward",
    "PendingRewards",
    "RepetitionPenalty",
    "RewardComponent",
    "RewardError",
    "SoftOverlongPenalty",
    "TriSRReward",
    "TripletAttributeAccuracy",
    "TripletConsistencyReward",
    "TripletCycleRate",
    "TripletOrderAccuracy",
    "TripletOverallAccuracy",
    "TripletPartialAccuracy",
    "TripletTaskReward",
    "WeightedReward",
    "functional",
    "parsing",
]

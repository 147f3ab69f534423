"""RL objectives as pure tensor math: group advantages and the token-level GRPO loss (see docs/algorithms.md#grpo), and
the chunked per-token log-probs of a VLM policy (docs/algorithms.md#token-log-probabilities)."""

from app.algorithms.advantages import AdvantageScale, group_advantages, zero_std_groups
from app.algorithms.logprobs import chunked_token_logprobs, token_logprobs_naive
from app.algorithms.loss import Aggregation, GRPOLossOutput, aggregate, clipped_surrogate, grpo_loss, k3_kl

__all__ = [
    "AdvantageScale",
    "Aggregation",
    "GRPOLossOutput",
    "aggregate",
    "chunked_token_logprobs",
    "clipped_surrogate",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "token_logprobs_naive",
    "zero_std_groups",
]

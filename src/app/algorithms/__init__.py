"""RL objectives as pure tensor math: group advantages and the GRPO loss with its token- and sequence-level (GSPO)
clipped surrogates, CISPO, off-policy sequence masking and high-entropy token selection (see docs/algorithms.md#grpo),
and the chunked per-token log-probs and entropies of a VLM policy (docs/algorithms.md#token-log-probabilities)."""

from app.algorithms.advantages import AdvantageScale, group_advantages, moments_std, reward_moments, zero_std_groups
from app.algorithms.logprobs import chunked_token_logprobs, chunked_token_logprobs_and_entropy, token_logprobs_naive
from app.algorithms.loss import (
    Aggregation,
    ImportanceSamplingLevel,
    LossOutput,
    Objective,
    aggregate,
    cispo_surrogate,
    clipped_surrogate,
    grpo_loss,
    gspo_surrogate,
    high_entropy_mask,
    k3_kl,
    off_policy_mask,
    sequence_log_ratio,
)
from app.algorithms.prompt_stats import PromptStatTracker
from app.algorithms.tally import TokenTally

__all__ = [
    "PromptStatTracker",
    "moments_std",
    "reward_moments",
    "AdvantageScale",
    "Aggregation",
    "LossOutput",
    "aggregate",
    "ImportanceSamplingLevel",
    "Objective",
    "chunked_token_logprobs",
    "chunked_token_logprobs_and_entropy",
    "cispo_surrogate",
    "clipped_surrogate",
    "group_advantages",
    "grpo_loss",
    "gspo_surrogate",
    "high_entropy_mask",
    "k3_kl",
    "off_policy_mask",
    "sequence_log_ratio",
    "TokenTally",
    "token_logprobs_naive",
    "zero_std_groups",
]

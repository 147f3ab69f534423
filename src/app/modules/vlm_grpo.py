"""GRPO for vision-language models: K sampled completions per prompt, token-level clipped loss.

The shared loop is :class:`~app.modules.grpo.GRPOModule`; the rollout is :class:`~app.sampling.VLMSampler`; this module
says what enters the loss and how the loss of each micro-batch is computed. With ``num_iterations == 1`` the old
log-probs are the current ones detached, so the ratio is exactly 1 (the papers' on-policy setting); with more
iterations, or a delayed reward pipeline, the log-probs stored at generation time (at the sampling temperature) are the
old policy's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import torch

from app.algorithms import LossOutput, grpo_loss
from app.algorithms.fused_linear import (
    FusedLinearGRPOLoss,
    check_fused_head,
    require_liger_loss,
)
from app.algorithms.tally import TokenTally
from app.models.vlm import VLMPolicy
from app.modules.grpo import GRPOModule
from app.modules.vlm_evaluation import VLMEvaluation, default_eval_rewards
from app.rewards import RewardComponent
from app.sampling.vlm_rollout import VLMSampler
from app.settings import (
    EMASettings,
    GRPOSettings,
    OptimizerSettings,
    PassAtK,
    PipelineSettings,
    SamplingSettings,
    VLMLossSettings,
    as_settings,
    plain,
    settings_or_default,
)
from app.types import Generation, Rollout, SampledCompletions, VisualSample

VLM_LEARNING_RATE = 1e-6


class VLMGRPOModule(VLMEvaluation, GRPOModule):
    """GRPO on a :class:`~app.models.VLMPolicy`, evaluated by greedy decoding.

    Args:
        policy: the model to train.
        rewards: reward components, each with its ``weight``; their weighted sum is the reward.
        sampling: group size K, temperature, top_p, max_new_tokens (:class:`~app.settings.SamplingSettings`).
        grpo: KL weight, iterations, advantages, micro-batches, gradient clipping
            (:class:`~app.settings.GRPOSettings`).
        loss: every option of the loss: clip range (default 0.2 each way), aggregation, truncated completions, the
            objective (PPO-clip or CISPO), token- or sequence-level (GSPO) ratios, off-policy sequence masking,
            high-entropy tokens and liger-kernel's fused loss (:class:`~app.settings.VLMLossSettings`).
        optimizer: AdamW (default learning rate 1e-6), warm-up, non-finite steps
            (:class:`~app.settings.OptimizerSettings`).
        pipeline: the delayed reward pipeline and dynamic sampling (:class:`~app.settings.PipelineSettings`).
        records_per_step: completions handed to logging callbacks per step (``outputs["records"]``).
        eval_max_new_tokens: generation budget for greedy evaluation.
        eval_rewards: rewards scored on greedy completions in validation / test (default: accuracy and format).
        pass_at_k: also sample n completions per evaluation prompt and log pass@k (see
            :class:`~app.settings.PassAtK`, docs/evaluation.md); None: greedy only.
        ema: a moving average of the trainable weights for validation and export (:class:`~app.settings.EMASettings`);
            None: the trained weights.
    """

    sampling_settings = SamplingSettings

    def __init__(
        self,
        policy: VLMPolicy,
        rewards: Sequence[RewardComponent],
        sampling: SamplingSettings | None = None,
        grpo: GRPOSettings | None = None,
        loss: VLMLossSettings | None = None,
        optimizer: OptimizerSettings | None = None,
        pipeline: PipelineSettings | None = None,
        records_per_step: int = 16,
        eval_max_new_tokens: int = 256,
        eval_rewards: Sequence[RewardComponent] | None = None,
        pass_at_k: PassAtK | None = None,
        ema: EMASettings | None = None,
    ):
        super().__init__(policy, rewards, sampling, grpo, optimizer, VLM_LEARNING_RATE, pipeline, records_per_step, ema)
        self.loss = settings_or_default(VLMLossSettings, loss)
        self.eval_max_new_tokens = eval_max_new_tokens
        self.sampler = VLMSampler(policy, self.sampling, self.grpo.micro_batch_size)
        self.eval_rewards = default_eval_rewards(eval_rewards)
        self.eval_results = {}
        self.pass_at_k = as_settings(PassAtK, pass_at_k)
        self.fused_loss = self._fused_loss() if self.loss.fused_linear else None
        self.record_hyperparameters(
            loss=plain(self.loss), eval_max_new_tokens=eval_max_new_tokens, pass_at_k=plain(self.pass_at_k)
        )

    def _fused_loss(self) -> FusedLinearGRPOLoss:
        """The fused loss, once what only the run can tell is checked: liger-kernel installed and a plain output head
        (the options Liger cannot compute were refused by :class:`~app.settings.VLMLossSettings`)."""
        require_liger_loss()
        check_fused_head(self.policy.hf_model.lm_head)
        loss = self.loss
        return FusedLinearGRPOLoss(
            eps_low=loss.eps_low,
            eps_high=loss.eps_high,
            beta=self.grpo.beta,
            aggregation=self.micro_batch_aggregation,
            max_length=self.sampling.max_new_tokens,
            compiled=torch.cuda.is_available() if loss.fused_compiled is None else loss.fused_compiled,
            importance_sampling_level=loss.importance_sampling_level,
            objective=loss.objective,
        )

    # --------------------------------------------------------------------------------------------------- rollout
    def generate_rollout(self, samples: list[VisualSample]) -> Generation[SampledCompletions]:
        """K completions per prompt (:meth:`~app.sampling.VLMSampler.draw`), with the behaviour log-probs when
        :attr:`stores_behaviour_logprobs` and the reference's when ``beta > 0``."""
        behaviour, reference = self.stores_behaviour_logprobs, self.grpo.beta > 0
        return Generation(samples, self.sampler.draw(samples, behaviour=behaviour, reference=reference))

    def loss_mask(self, generation: Generation[SampledCompletions], keep: torch.Tensor) -> torch.Tensor:
        """``[N, L]``: the completion tokens, minus dropped groups and, if asked, truncated completions."""
        completions = generation.sampled.completions
        mask = completions.completion_mask.clone()  # [N, L]
        mask[~keep] = 0
        if self.loss.mask_truncated:
            mask[completions.truncated] = 0
        return mask

    @property
    def micro_batch_aggregation(self) -> str:
        """The aggregation of each micro-batch's loss: ``global_token_mean`` is ``token_mean`` on this rank, then
        rescaled across ranks by :meth:`gradient_scale`."""
        return "token_mean" if self.loss.aggregation == "global_token_mean" else self.loss.aggregation

    def gradient_scale(self, rollouts: list[Rollout[SampledCompletions]]) -> float:
        """``global_token_mean``: ``world_size * local tokens / all ranks' tokens`` (one all-reduce per step), so the
        ranks' mean gradient is the gradient of the sum of every rank's token losses over all their tokens. 1 for the
        other aggregations."""
        if self.loss.aggregation != "global_token_mean" or self._trainer is None or self.trainer.world_size == 1:
            return 1.0
        local = torch.stack([self.loss_mass(r) for r in rollouts]).sum().to(self.device)  # []
        total = self.trainer.strategy.reduce(local.clone(), reduce_op="sum")  # []
        return float(self.trainer.world_size * local / total.clamp(min=1))

    def loss_mass(self, rollout: Rollout[SampledCompletions]) -> torch.Tensor:
        """The normaliser of :meth:`weighted_losses`' aggregation: kept tokens, kept rows, or all rows."""
        mask = rollout.loss_mask
        if self.micro_batch_aggregation == "token_mean":
            return mask.sum().float()
        if self.loss.aggregation == "sequence_mean":
            return (mask.sum(dim=1) > 0).sum().float()
        return torch.tensor(float(mask.shape[0]))

    # -------------------------------------------------------------------------------------------------- training
    def weighted_losses(self, rollout: Rollout[SampledCompletions]) -> Iterator[tuple[LossOutput, torch.Tensor]]:
        """The loss of each micro-batch (rows of similar length, :meth:`~app.sampling.VLMSampler.micro_batches`),
        weighted by its share of the aggregation's normaliser (tokens, rows, or rows of the constant
        ``B*K*max_new_tokens``), so the weighted sum is the full-batch aggregate."""
        mask = rollout.loss_mask
        n = mask.shape[0]
        total_tokens = mask.sum().clamp(min=1)
        total_rows = (mask.sum(dim=1) > 0).sum().clamp(min=1)
        loss_of = self._fused_micro_batch if self.fused_loss is not None else self._micro_batch_loss
        aggregation = self.micro_batch_aggregation
        for rows in self.sampler.micro_batches(rollout.sampled):
            out = loss_of(rollout, rows)
            micro = mask[rows]
            if aggregation == "token_mean":
                share = micro.sum() / total_tokens
            elif aggregation == "sequence_mean":
                share = (micro.sum(dim=1) > 0).sum() / total_rows
            else:
                share = micro.shape[0] / n
            yield out, share

    def _micro_batch_loss(self, rollout: Rollout[SampledCompletions], rows: list[int]) -> LossOutput:
        """The loss of the rows from their per-token log-probs (chunked over the vocabulary), with the policy's
        per-token entropy from the same chunks, tallied per task over the loss's tokens."""
        loss, sampled = self.loss, rollout.sampled
        logprobs, entropy = self.sampler.logprobs_and_entropy(sampled, rows)  # [n, L] x 2
        old = sampled.old_logprobs[rows] if sampled.old_logprobs is not None else logprobs.detach()
        ref = sampled.ref_logprobs[rows] if sampled.ref_logprobs is not None else None
        mask = rollout.loss_mask[rows]  # [n, L]
        out = grpo_loss(
            logprobs,
            old,
            rollout.advantages[rows],
            mask,
            eps_low=loss.eps_low,
            eps_high=loss.eps_high,
            beta=self.grpo.beta,
            ref_logprobs=ref,
            aggregation=self.micro_batch_aggregation,
            max_length=self.sampling.max_new_tokens,
            importance_sampling_level=loss.importance_sampling_level,
            objective=loss.objective,
            off_policy_max_log_ratio=loss.off_policy_max_log_ratio,
            off_policy_max_kl=loss.off_policy_max_kl,
            entropy=entropy,
            top_entropy_quantile=loss.top_entropy_quantile,
        )
        tasks = [rollout.samples[row // rollout.rows_per_prompt].task for row in rows]
        return dataclasses.replace(out, entropy=TokenTally.of(entropy, mask, tasks))

    def _fused_micro_batch(self, rollout: Rollout[SampledCompletions], rows: list[int]) -> LossOutput:
        """The same loss from liger-kernel's fused linear GRPO loss (``loss.fused_linear``), on the rows re-padded
        to their own longest completion."""
        sampled = rollout.sampled
        batch = self.sampler.micro_batch(sampled, rows)
        return self.policy.fused_grpo_loss(
            self.fused_loss,
            batch.prompt_inputs,
            batch.completion_ids,
            batch.completion_mask,
            rollout.advantages[rows],
            batch.cut(rollout.loss_mask),
            old_logprobs=batch.cut(sampled.old_logprobs),
            ref_logprobs=batch.cut(sampled.ref_logprobs),
            temperature=self.sampling.temperature,
        )

    # --------------------------------------------------------------------------------------------------- logging
    def completion_text(self, rollout: Rollout[SampledCompletions], row: int) -> str:
        return rollout.sampled.completions.texts[row]

    def step_outputs(self, rollout: Rollout[SampledCompletions]) -> dict[str, int]:
        """The real tokens of the trained completions, for callbacks.throughput.ThroughputLogger."""
        return {"generated_tokens": int(rollout.sampled.completions.completion_mask.sum())}

    def rollout_logs(self, rollout: Rollout[SampledCompletions]) -> dict[str, torch.Tensor]:
        completions = rollout.sampled.completions
        return {
            "train/completion_length": completions.completion_mask.sum(dim=1).float().mean(),
            "train/frac_truncated": completions.truncated.float().mean(),
        }

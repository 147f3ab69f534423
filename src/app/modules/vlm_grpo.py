"""GRPO for vision-language models: K sampled completions per prompt, token-level clipped loss.

The shared loop is :class:`~app.modules.grpo.GRPOModule`; this module says how completions are sampled and scored and
how their per-token log-probs are recomputed. With ``num_iterations == 1`` the old log-probs are the current ones
detached, so the ratio is exactly 1 (the papers' on-policy setting); with more iterations, or a delayed reward
pipeline, the log-probs stored at generation time (at the sampling temperature) are the old policy's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Literal

import torch

from app.algorithms import GRPOLossOutput, grpo_loss
from app.algorithms.fused_linear import (
    FusedLinearGRPOLoss,
    check_fused_head,
    require_liger_loss,
    unavailable_statistics,
)
from app.models.vlm import SamplingSettings, VLMPolicy
from app.modules.grpo import GRPOModule, ScoredGroups
from app.modules.pipeline import Generation, PipelineSettings
from app.modules.vlm_evaluation import GreedyEvaluation, PassAtK, default_eval_rewards
from app.rewards import RewardComponent
from app.sampling.batching import micro_batches
from app.types import GRPOBatch, VisualSample


class VLMGRPOModule(GreedyEvaluation, GRPOModule):
    """GRPO on a :class:`~app.models.VLMPolicy`, evaluated by greedy decoding.

    Args:
        policy: the model to train.
        rewards: reward components, each with its ``weight``; their weighted sum is the reward.
        sampling: group size K (``num_generations``), temperature, top_p, max_new_tokens.
        loss_aggregation: ``token_mean``, ``sequence_mean`` or ``constant`` (Dr. GRPO, divides by B*K*max_new_tokens).
        mask_truncated: leave completions that hit max_new_tokens without an end token out of the loss.
        micro_batch_size: completions per forward/backward.
        eval_max_new_tokens: generation budget for greedy evaluation.
        eval_rewards: rewards scored on greedy completions in validation / test (default: accuracy and format).
        pass_at_k: also sample n completions per evaluation prompt and log pass@k (see
            :class:`~app.modules.vlm_evaluation.PassAtK`, docs/evaluation.md); None: greedy only.
        fused_linear_loss: compute the loss with liger-kernel's fused linear GRPO loss from the last hidden states and
            the output head instead of per-token log-probs (:mod:`app.algorithms.fused_linear`; needs liger-kernel).
            The same loss and gradients; ``train/ratio_mean`` (when old log-probs are stored) and, for
            ``sequence_mean`` with ``beta > 0``, ``train/kl`` and ``train/loss/policy`` are not logged.
        fused_loss_compiled: let Liger ``torch.compile`` the loss math; None: on CUDA only.
        eps_low, eps_high, beta, num_iterations, advantage_scale, drop_zero_std_groups, gradient_clip_val,
            records_per_step, learning_rate, weight_decay, warmup_steps, max_nonfinite_steps, pipeline,
            restore_nonfinite_steps: see :class:`~app.modules.grpo.GRPOModule`.
    """

    def __init__(
        self,
        policy: VLMPolicy,
        rewards: Sequence[RewardComponent],
        sampling: SamplingSettings | None = None,
        eps_low: float = 0.2,
        eps_high: float = 0.2,
        beta: float = 0.0,
        num_iterations: int = 1,
        advantage_scale: Literal["group", "batch", "none"] = "group",
        loss_aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean",
        drop_zero_std_groups: bool = False,
        mask_truncated: bool = False,
        micro_batch_size: int | None = None,
        gradient_clip_val: float = 1.0,
        records_per_step: int = 16,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        eval_max_new_tokens: int = 256,
        eval_rewards: Sequence[RewardComponent] | None = None,
        max_nonfinite_steps: int = 3,
        pipeline: PipelineSettings | None = None,
        pass_at_k: PassAtK | None = None,
        fused_linear_loss: bool = False,
        fused_loss_compiled: bool | None = None,
        restore_nonfinite_steps: bool = True,
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutation trampoline would hide it)
        super().__init__(
            policy, rewards, sampling or SamplingSettings(), eps_low=eps_low, eps_high=eps_high, beta=beta,
            num_iterations=num_iterations, advantage_scale=advantage_scale, drop_zero_std_groups=drop_zero_std_groups,
            micro_batch_size=micro_batch_size, gradient_clip_val=gradient_clip_val, records_per_step=records_per_step,
            learning_rate=learning_rate, weight_decay=weight_decay, warmup_steps=warmup_steps,
            max_nonfinite_steps=max_nonfinite_steps, pipeline=pipeline, restore_nonfinite_steps=restore_nonfinite_steps,
        )  # fmt: skip
        self.eval_rewards = default_eval_rewards(eval_rewards)
        self.eval_results = {}
        self.pass_at_k = pass_at_k
        self.hparams["pass_at_k"] = dataclasses.asdict(pass_at_k) if pass_at_k is not None else None  # plain data
        self.fused_loss = self._fused_loss() if fused_linear_loss else None

    def _fused_loss(self) -> FusedLinearGRPOLoss:
        """The fused loss's settings, checked now: liger-kernel installed, a plain output head."""
        require_liger_loss()
        check_fused_head(self.policy.hf_model.lm_head)
        hp = self.hparams
        compiled = hp.fused_loss_compiled
        return FusedLinearGRPOLoss(
            eps_low=hp.eps_low, eps_high=hp.eps_high, beta=hp.beta, aggregation=hp.loss_aggregation,
            max_length=self.sampling.max_new_tokens,
            compiled=torch.cuda.is_available() if compiled is None else compiled,
        )  # fmt: skip

    @property
    def unlogged_loss_terms(self) -> frozenset[str]:
        if self.fused_loss is None:
            return frozenset()
        hp = self.hparams
        return unavailable_statistics(hp.loss_aggregation, hp.beta, self.stores_behaviour_logprobs)

    # --------------------------------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def generate_rollout(self, samples: list[VisualSample]) -> Generation:
        """Sample K completions per prompt; with :attr:`stores_behaviour_logprobs`, their log-probs under the sampling
        policy (computed now, before any later update), and the reference's when ``beta > 0``."""
        hp, k = self.hparams, self.group_size
        prompt_inputs = self.policy.encode_prompts(samples, repeats=k)  # rows b*K + k
        completions = self.policy.generate(prompt_inputs, self.sampling, group_size=k)
        args = (prompt_inputs, completions.completion_ids, completions.completion_mask, self.sampling.temperature)
        old_logprobs = None
        if self.stores_behaviour_logprobs:
            old_logprobs = self._in_micro_batches(self.policy.sequence_logprobs, *args)
        ref_logprobs = self._in_micro_batches(self.policy.reference_logprobs, *args) if hp.beta > 0 else None
        parts = dict(
            prompt_inputs=prompt_inputs, completions=completions, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs
        )
        return Generation(samples, completions.texts, parts, version=0)

    def finish_rollout(self, generation: Generation, scored: ScoredGroups) -> GRPOBatch:
        """The loss mask (completion tokens, minus dropped groups and, if asked, truncated completions) and the batch."""
        completions = generation.parts["completions"]
        loss_mask = completions.completion_mask.clone()  # [N, L]
        loss_mask[~scored.keep] = 0
        if self.hparams.mask_truncated:
            loss_mask[completions.truncated] = 0
        return GRPOBatch(
            **generation.parts, advantages=scored.advantages, loss_mask=loss_mask, rewards=scored.rewards,
            group_size=self.group_size,
        )  # fmt: skip

    def loss_mass(self, rollout: GRPOBatch) -> torch.Tensor:
        """The normaliser of :meth:`weighted_losses`' aggregation: kept tokens, kept rows, or all rows."""
        mask = rollout.loss_mask
        if self.hparams.loss_aggregation == "token_mean":
            return mask.sum().float()
        if self.hparams.loss_aggregation == "sequence_mean":
            return (mask.sum(dim=1) > 0).sum().float()
        return torch.tensor(float(mask.shape[0]))

    def _in_micro_batches(self, logprob_fn, prompt_inputs, completion_ids, completion_mask, temperature):
        rows = micro_batches(len(prompt_inputs), self.hparams.micro_batch_size)
        return torch.cat(
            [logprob_fn(prompt_inputs.select(r), completion_ids[r], completion_mask[r], temperature) for r in rows]
        )

    # -------------------------------------------------------------------------------------------------- training
    def weighted_losses(self, rollout: GRPOBatch) -> Iterator[tuple[GRPOLossOutput, torch.Tensor]]:
        """The loss of each micro-batch, weighted by its share of the aggregation's normaliser (tokens, rows, or
        rows of the constant ``B*K*max_new_tokens``), so the weighted sum is the full-batch aggregate."""
        hp = self.hparams
        mask = rollout.loss_mask
        n = mask.shape[0]
        total_tokens = mask.sum().clamp(min=1)
        total_rows = (mask.sum(dim=1) > 0).sum().clamp(min=1)
        for rows in micro_batches(n, hp.micro_batch_size):
            loss_of = self._fused_micro_batch if self.fused_loss is not None else self._micro_batch_loss
            out = loss_of(rollout, rows)
            micro = mask[rows]
            if hp.loss_aggregation == "token_mean":
                share = micro.sum() / total_tokens
            elif hp.loss_aggregation == "sequence_mean":
                share = (micro.sum(dim=1) > 0).sum() / total_rows
            else:
                share = micro.shape[0] / n
            yield out, share

    def _micro_batch_loss(self, rollout: GRPOBatch, rows) -> GRPOLossOutput:
        """The loss of the rows from their per-token log-probs (chunked over the vocabulary)."""
        hp = self.hparams
        logprobs = self.policy.sequence_logprobs(
            rollout.prompt_inputs.select(rows),
            rollout.completions.completion_ids[rows],
            rollout.completions.completion_mask[rows],
            self.sampling.temperature,
        )  # [n, L]
        old = rollout.old_logprobs[rows] if rollout.old_logprobs is not None else logprobs.detach()
        ref = rollout.ref_logprobs[rows] if rollout.ref_logprobs is not None else None
        return grpo_loss(
            logprobs,
            old,
            rollout.advantages[rows],
            rollout.loss_mask[rows],
            eps_low=hp.eps_low,
            eps_high=hp.eps_high,
            beta=hp.beta,
            ref_logprobs=ref,
            aggregation=hp.loss_aggregation,
            max_length=self.sampling.max_new_tokens,
        )

    def _fused_micro_batch(self, rollout: GRPOBatch, rows) -> GRPOLossOutput:
        """The same loss from liger-kernel's fused linear GRPO loss (see ``fused_linear_loss``)."""
        return self.policy.fused_grpo_loss(
            self.fused_loss,
            rollout.prompt_inputs.select(rows),
            rollout.completions.completion_ids[rows],
            rollout.completions.completion_mask[rows],
            rollout.advantages[rows],
            rollout.loss_mask[rows],
            old_logprobs=rollout.old_logprobs[rows] if rollout.old_logprobs is not None else None,
            ref_logprobs=rollout.ref_logprobs[rows] if rollout.ref_logprobs is not None else None,
            temperature=self.sampling.temperature,
        )

    # --------------------------------------------------------------------------------------------------- logging
    def completion_text(self, rollout: GRPOBatch, row: int) -> str:
        return rollout.completions.texts[row]

    def rollout_logs(self, rollout: GRPOBatch) -> dict[str, torch.Tensor]:
        completions = rollout.completions
        return {
            "train/completion_length": completions.completion_mask.sum(dim=1).float().mean(),
            "train/frac_truncated": completions.truncated.float().mean(),
        }

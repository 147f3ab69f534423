"""GRPO for vision-language models: rollout -> rewards -> group advantages -> clipped token-level loss.

Follows ../shared/ALGORITHMS.md ("GRPO"). Each training step takes B prompts, samples K completions per prompt on this
process (groups never cross ranks), scores them with the injected reward components, and makes ``num_iterations``
optimizer updates on that rollout, reusing the log-probs stored at rollout time as the "old" policy. With
``num_iterations == 1`` the old log-probs are the current ones detached, so the ratio is exactly 1 (as in the papers'
on-policy setting). Optimization is manual: one rollout may be split into micro-batches whose gradients accumulate
into one optimizer step per iteration.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Literal

import torch

from app.algorithms import group_advantages, grpo_loss, zero_std_groups
from app.models.vlm import SamplingSettings, VLMPolicy
from app.modules.base import VLMModule
from app.rewards import RewardComponent, WeightedReward
from app.types import CompletionRecord, GRPOBatch, VisualSample

log = logging.getLogger(__name__)


class VLMGRPOModule(VLMModule):
    """GRPO on a :class:`~app.models.VLMPolicy`.

    Args:
        policy: the model to train.
        rewards: reward components, each with its ``weight``; their weighted sum is the reward.
        sampling: group size K (``num_generations``), temperature, top_p, max_new_tokens.
        eps_low: lower clip range of the ratio (1 - eps_low).
        eps_high: upper clip range of the ratio (1 + eps_high); > eps_low is DAPO's clip-higher.
        beta: weight of the k3 KL to the reference policy (adapter disabled); 0 skips the reference pass.
        num_iterations: optimizer updates per rollout batch (mu in the GRPO paper).
        advantage_scale: ``group`` (std of the group), ``batch`` (std of the batch) or ``none`` (Dr. GRPO).
        loss_aggregation: ``token_mean``, ``sequence_mean`` or ``constant`` (Dr. GRPO, divides by B*K*max_new_tokens).
        drop_zero_std_groups: leave groups whose rewards are all equal out of the loss (they carry no signal).
        mask_truncated: leave completions that hit max_new_tokens without an end token out of the loss.
        micro_batch_size: completions per forward/backward; gradients accumulate over the micro-batches of a rollout.
        gradient_clip_val: clip the global gradient norm to this value before each step (0 disables).
        records_per_step: completions handed to logging callbacks per step (``outputs["records"]``).
        learning_rate, weight_decay, warmup_steps, eval_max_new_tokens, eval_rewards: see :class:`VLMModule`.
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
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutation trampoline would hide it)
        super().__init__(policy, learning_rate, weight_decay, warmup_steps, eval_max_new_tokens, eval_rewards)
        if num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        self.automatic_optimization = False
        self.sampling = sampling or SamplingSettings()
        self.hparams["sampling"] = dataclasses.asdict(
            self.sampling
        )  # plain data, so checkpoints load with weights_only
        self.rewards = WeightedReward(rewards)
        if beta > 0:
            policy.enable_reference()

    # --------------------------------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def rollout(self, samples: list[VisualSample]) -> GRPOBatch:
        """Sample K completions per prompt, score them, and compute advantages and the loss mask."""
        hp, k = self.hparams, self.sampling.num_generations
        prompt_inputs = self.policy.encode_prompts(samples, repeats=k)  # rows b*K + k
        completions = self.policy.generate(prompt_inputs, self.sampling, group_size=k)
        grouped_samples = [s for s in samples for _ in range(k)]
        rewards = self.rewards(completions.texts, grouped_samples)
        advantages = group_advantages(rewards.total.float(), k, scale=hp.advantage_scale)  # [N]
        loss_mask = completions.completion_mask.clone()  # [N, L]
        if hp.drop_zero_std_groups:
            flat = zero_std_groups(rewards.total, k).repeat_interleave(k)  # [N]
            loss_mask[flat] = 0
        if hp.mask_truncated:
            loss_mask[completions.truncated] = 0
        args = (prompt_inputs, completions.completion_ids, completions.completion_mask, self.sampling.temperature)
        old_logprobs = self._in_micro_batches(self.policy.sequence_logprobs, *args) if hp.num_iterations > 1 else None
        ref_logprobs = self._in_micro_batches(self.policy.reference_logprobs, *args) if hp.beta > 0 else None
        return GRPOBatch(prompt_inputs, completions, old_logprobs, ref_logprobs, advantages, loss_mask, rewards)

    def _in_micro_batches(self, logprob_fn, prompt_inputs, completion_ids, completion_mask, temperature):
        rows = self._micro_batches(len(prompt_inputs))
        return torch.cat(
            [logprob_fn(prompt_inputs.select(r), completion_ids[r], completion_mask[r], temperature) for r in rows]
        )

    def _micro_batches(self, n: int) -> list[slice]:
        size = self.hparams.micro_batch_size or n
        return [slice(start, min(start + size, n)) for start in range(0, n, size)]

    # -------------------------------------------------------------------------------------------------- training
    def training_step(self, batch: list[VisualSample], batch_idx: int):
        rollout = self.rollout(batch)
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        for _ in range(self.hparams.num_iterations):
            stats = self._update(rollout, optimizer)
            if scheduler is not None:
                scheduler.step()
        self._log_step(rollout, stats)
        return {"loss": stats["loss"], "records": self._records(batch, rollout)}

    def _update(self, rollout: GRPOBatch, optimizer) -> dict[str, torch.Tensor]:
        """One optimizer step over the whole rollout, accumulating gradients over micro-batches."""
        hp = self.hparams
        mask = rollout.loss_mask
        n, length = mask.shape
        total_tokens = mask.sum().clamp(min=1)
        total_rows = (mask.sum(dim=1) > 0).sum().clamp(min=1)
        sums: dict[str, torch.Tensor] = {}
        for rows in self._micro_batches(n):
            logprobs = self.policy.sequence_logprobs(
                rollout.prompt_inputs.select(rows),
                rollout.completions.completion_ids[rows],
                rollout.completions.completion_mask[rows],
                self.sampling.temperature,
            )  # [n, L]
            old = rollout.old_logprobs[rows] if rollout.old_logprobs is not None else logprobs.detach()
            ref = rollout.ref_logprobs[rows] if rollout.ref_logprobs is not None else None
            out = grpo_loss(
                logprobs,
                old,
                rollout.advantages[rows],
                mask[rows],
                eps_low=hp.eps_low,
                eps_high=hp.eps_high,
                beta=hp.beta,
                ref_logprobs=ref,
                aggregation=hp.loss_aggregation,
                max_length=self.sampling.max_new_tokens,
            )
            # Weight each micro-batch by its share of the normaliser, so the sum equals the full-batch aggregate.
            micro = mask[rows]
            if hp.loss_aggregation == "token_mean":
                share = micro.sum() / total_tokens
            elif hp.loss_aggregation == "sequence_mean":
                share = (micro.sum(dim=1) > 0).sum() / total_rows
            else:
                share = micro.shape[0] / n
            self.manual_backward(out.loss * share)
            for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
                sums[key] = sums.get(key, 0.0) + getattr(out, key).detach() * share
        if hp.gradient_clip_val > 0:
            sums["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), hp.gradient_clip_val)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return sums

    # --------------------------------------------------------------------------------------------------- logging
    def _log_step(self, rollout: GRPOBatch, stats: dict[str, torch.Tensor]) -> None:
        k, completions = self.sampling.num_generations, rollout.completions
        batch_size = completions.completion_ids.shape[0] // k  # pragma: no mutate (equivalent: only epoch means use it)
        values = {
            "train/reward/total": rollout.rewards.total.float().mean(),
            "train/loss/policy": stats["policy_loss"],
            "train/kl": stats["kl"],
            "train/clip_fraction": stats["clip_fraction"],
            "train/ratio_mean": stats["ratio_mean"],
            "train/frac_zero_std": zero_std_groups(rollout.rewards.total, k).float().mean(),
            "train/completion_length": completions.completion_mask.sum(dim=1).float().mean(),
            "train/frac_truncated": completions.truncated.float().mean(),
            "train/nonfinite_rewards": torch.tensor(float(self.rewards.num_nonfinite)),
        }
        if "grad_norm" in stats:
            values["train/grad_norm"] = stats["grad_norm"]
        for name, component in rollout.rewards.components.items():
            values[f"train/reward/{name}"] = component.float().mean()
        # batch_size only weighs epoch means: these on_step values never read it (on_epoch=True would need it)
        self.log_dict(
            values,
            batch_size=batch_size,  # pragma: no mutate (equivalent: on_step-only logging ignores batch_size)
        )
        self.log(
            "reward",
            values["train/reward/total"],
            prog_bar=True,
            logger=False,
            batch_size=batch_size,  # pragma: no mutate (equivalent: on_step-only logging ignores batch_size)
        )

    def _records(self, samples: list[VisualSample], rollout: GRPOBatch) -> list[CompletionRecord]:
        k = self.sampling.num_generations
        limit = min(self.hparams.records_per_step, len(rollout.completions.texts))
        return [
            CompletionRecord(
                step=self.global_step,
                task=samples[i // k].task,
                question=samples[i // k].question,
                completion=rollout.completions.texts[i],
                answer=samples[i // k].answer,
                reward=float(rollout.rewards.total[i]),
                advantage=float(rollout.advantages[i]),
                components={name: float(v[i]) for name, v in rollout.rewards.components.items()},
            )
            for i in range(limit)
        ]

"""The GRPO skeleton both model families share: rollout -> rewards -> group advantages -> clipped loss -> update.

Each training step takes B prompts, lets the subclass draw K outputs per prompt on this process (groups never cross
ranks) and score them, and makes ``num_iterations`` optimizer updates on that rollout. Optimisation is manual: the
subclass yields the loss of each micro-batch (and, for flow models, each trained denoising step) with its share of the
whole rollout's normaliser; the skeleton backpropagates each share, so the accumulated gradient is the full-batch
gradient, then clips and steps once per iteration. The equations are in docs/algorithms.md#grpo.

A subclass supplies only what differs between families:

- :meth:`rollout`: produce and score the outputs (completions or denoising trajectories), returning a container with
  ``rewards``, ``advantages`` and ``group_size`` (see :meth:`score`);
- :meth:`weighted_losses`: recompute the log-probs of the stored rollout and yield ``(GRPOLossOutput, share)``;
- :meth:`completion_text`, and optionally :meth:`rollout_logs` and :meth:`step_outputs`, for logging.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from app.algorithms import GRPOLossOutput, group_advantages, zero_std_groups
from app.models.policy import Policy
from app.modules.policy_module import PolicyModule
from app.rewards import RewardComponent, WeightedReward
from app.types import CompletionRecord, RewardOutput, VisualSample

log = logging.getLogger(__name__)

LOSS_TERMS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")
"""The :class:`~app.algorithms.GRPOLossOutput` fields summed over a rollout's micro-batches and logged."""


class NonFiniteTrainingError(RuntimeError):
    """Training cannot go on: updates or rewards stayed non-finite for ``max_nonfinite_steps`` steps in a row."""


class Rollout(Protocol):
    """What the skeleton reads of a rollout container (:class:`~app.types.GRPOBatch`, :class:`~app.types.FlowTrajectory`)."""

    rewards: RewardOutput
    advantages: Tensor
    group_size: int


@dataclasses.dataclass(frozen=True)
class ScoredGroups:
    """Rewards of N = B * K outputs and what the loss makes of them.

    Attributes:
        rewards: the weighted total ``[N]`` and every component.
        advantages: ``[N]`` float32 group-relative advantages, on the module's device.
        keep: ``[N]`` bool, False for outputs left out of the loss (groups of equal rewards, when dropped).
    """

    rewards: RewardOutput
    advantages: Tensor
    keep: Tensor


class GRPOModule(PolicyModule):
    """The shared GRPO training loop (manual optimisation).

    Args:
        policy: the model to train.
        rewards: reward components, each with its ``weight``; their weighted sum is the reward.
        sampling: how outputs are drawn; ``sampling.num_generations`` is the group size K in both families.
        eps_low: lower clip range of the ratio (1 - eps_low).
        eps_high: upper clip range of the ratio (1 + eps_high); > eps_low is DAPO's clip-higher.
        beta: weight of the k3 KL to the reference policy; 0 skips the reference passes (and, with full
            fine-tuning, the reference copy).
        num_iterations: optimizer updates per rollout (mu in the GRPO paper).
        advantage_scale: ``group`` (std of the group), ``batch`` (std of the batch) or ``none`` (Dr. GRPO).
        drop_zero_std_groups: leave groups whose rewards are all equal out of the loss (they carry no signal).
        micro_batch_size: rows per forward/backward; gradients accumulate over the micro-batches of a rollout and
            reproduce the full-batch gradient. None: all N at once.
        gradient_clip_val: clip the global gradient norm to this value before each step (0 disables).
        records_per_step: outputs handed to logging callbacks per step (``outputs["records"]``).
        learning_rate, weight_decay, warmup_steps: see :class:`~app.modules.policy_module.PolicyModule`.
        max_nonfinite_steps: an update whose loss or gradients are not finite is skipped (no optimizer or scheduler
            step; counted as ``train/skipped_updates``), so NaN never reaches the weights; after this many consecutive
            skipped updates, or this many consecutive rollouts whose rewards were all non-finite, the run stops with
            :class:`NonFiniteTrainingError`. Every rank takes the same decision.
    """

    def __init__(
        self,
        policy: Policy,
        rewards: Sequence[RewardComponent],
        sampling: Any,
        eps_low: float,
        eps_high: float,
        beta: float,
        num_iterations: int,
        advantage_scale: Literal["group", "batch", "none"],
        drop_zero_std_groups: bool,
        micro_batch_size: int | None,
        gradient_clip_val: float,
        records_per_step: int,
        learning_rate: float,
        weight_decay: float,
        warmup_steps: int,
        max_nonfinite_steps: int = 3,
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutation trampoline would hide it)
        if max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {max_nonfinite_steps}")
        if num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        super().__init__(policy, learning_rate, weight_decay, warmup_steps)
        self.automatic_optimization = False
        self.sampling = sampling
        self.hparams["sampling"] = dataclasses.asdict(sampling)  # plain data, so checkpoints load with weights_only
        self.rewards = WeightedReward(rewards)
        if beta > 0:
            policy.enable_reference()
        self.skipped_updates = 0  # non-finite updates skipped so far
        self._consecutive_skips = 0
        self._consecutive_nonfinite_rewards = 0

    @property
    def group_size(self) -> int:
        """K, the outputs drawn per prompt."""
        return self.sampling.num_generations

    # ------------------------------------------------------------------------------------------- what differs
    def rollout(self, samples: list[VisualSample]) -> Rollout:
        """Draw K outputs per prompt, score them (:meth:`score`) and keep what the updates need."""
        raise NotImplementedError

    def weighted_losses(self, rollout: Rollout) -> Iterator[tuple[GRPOLossOutput, Tensor | float]]:
        """The loss of each part of the rollout (micro-batch, denoising step) and its share of the whole: the shares
        sum to 1 and ``sum(share * loss)`` is the loss of the whole rollout. Called once per update; the skeleton
        backpropagates each part before asking for the next, so only one part's activations are alive at a time."""
        raise NotImplementedError

    def completion_text(self, rollout: Rollout, row: int) -> str:
        """What the completion table shows for output ``row``."""
        raise NotImplementedError

    def rollout_logs(self, rollout: Rollout) -> dict[str, Tensor]:
        """Family-specific per-step statistics, logged beside the shared ones."""
        return {}

    def step_outputs(self, rollout: Rollout) -> dict[str, Any]:
        """Extra entries of ``training_step``'s outputs for callbacks (e.g. ``images``)."""
        return {}

    # --------------------------------------------------------------------------------------------- the skeleton
    def score(self, outputs: Sequence[Any], samples: list[VisualSample]) -> ScoredGroups:
        """Rewards of the N = B * K ``outputs`` (row ``b * K + k`` from prompt ``b``), their group advantages, and
        which rows stay in the loss."""
        hp, k = self.hparams, self.group_size
        grouped_samples = [s for s in samples for _ in range(k)]
        nonfinite_before = self.rewards.num_nonfinite
        rewards = self.rewards(outputs, grouped_samples, group_size=k)
        all_nonfinite = self.rewards.num_nonfinite - nonfinite_before >= len(outputs) * len(self.rewards.components)
        self._check_rewards(all_nonfinite and len(outputs) > 0)
        total = rewards.total.float().to(self.device)  # [N]
        advantages = group_advantages(total, k, scale=hp.advantage_scale)  # [N]
        keep = torch.ones_like(advantages, dtype=torch.bool)  # [N]
        if hp.drop_zero_std_groups:
            keep = ~zero_std_groups(total, k).repeat_interleave(k)  # [N]
        return ScoredGroups(rewards, advantages, keep)

    def training_step(self, batch: list[VisualSample], batch_idx: int) -> dict[str, Any]:
        rollout = self.rollout(batch)
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        for _ in range(self.hparams.num_iterations):
            stats = self._update(rollout, optimizer)
            if scheduler is not None and not stats["skipped"]:
                scheduler.step()
        self._log_step(rollout, stats, batch_size=len(batch))
        return {"loss": stats["loss"], "records": self._records(batch, rollout), **self.step_outputs(rollout)}

    def _update(self, rollout: Rollout, optimizer) -> dict[str, Tensor]:
        """One optimizer step over the whole rollout, accumulating the gradients of its parts; skipped (and counted)
        when the loss or the gradients are not finite. ``stats["skipped"]`` says which."""
        sums: dict[str, Tensor] = {}
        for out, share in self.weighted_losses(rollout):
            self.manual_backward(out.loss * share)
            for key in LOSS_TERMS:
                sums[key] = sums.get(key, 0.0) + getattr(out, key).detach() * share
        parameters = self.policy.trainable_parameters()
        if self.hparams.gradient_clip_val > 0:
            norm = sums["grad_norm"] = torch.nn.utils.clip_grad_norm_(parameters, self.hparams.gradient_clip_val)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        finite = bool(torch.isfinite(norm)) and bool(torch.isfinite(sums["loss"]))
        skipped = self._any_rank(not finite)
        if not skipped:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._count_skip(skipped)
        sums["skipped"] = skipped
        return sums

    # --------------------------------------------------------------------------------------------------- faults
    def _any_rank(self, decision: bool) -> bool:
        """True on every rank when ``decision`` is True on any (so all ranks skip or stop together)."""
        trainer = self._trainer
        return trainer.strategy.reduce_boolean_decision(decision, all=False) if trainer is not None else decision

    def _count_skip(self, skipped: bool) -> None:
        if not skipped:
            self._consecutive_skips = 0
            return
        self.skipped_updates += 1
        self._consecutive_skips += 1
        log.warning(
            "skipped a GRPO update with a non-finite loss or gradient (%d in a row, %d in all)",
            self._consecutive_skips,
            self.skipped_updates,
        )
        if self._consecutive_skips >= self.hparams.max_nonfinite_steps:
            raise NonFiniteTrainingError(
                f"{self._consecutive_skips} consecutive updates had a non-finite loss or gradient and were skipped; "
                "stopping (the weights are unchanged since the last finite update). Lower the learning rate, check "
                "the rewards and the model's dtype, or raise model.init_args.max_nonfinite_steps"
            )

    def _check_rewards(self, all_nonfinite: bool) -> None:
        if not self._any_rank(all_nonfinite):
            self._consecutive_nonfinite_rewards = 0
            return
        self._consecutive_nonfinite_rewards += 1
        if self._consecutive_nonfinite_rewards >= self.hparams.max_nonfinite_steps:
            counts = {name: n for name, n in self.rewards.nonfinite_counts.items() if n}
            raise NonFiniteTrainingError(
                f"every reward was non-finite (NaN or inf) in {self._consecutive_nonfinite_rewards} consecutive "
                f"rollouts, so no update carries a signal; non-finite values per reward so far: {counts}"
            )

    # --------------------------------------------------------------------------------------------------- logging
    def _log_step(self, rollout: Rollout, stats: dict[str, Tensor], batch_size: int) -> None:
        total = rollout.rewards.total.float()
        values = {
            "train/reward/total": total.mean(),
            "train/loss/policy": stats["policy_loss"],
            "train/kl": stats["kl"],
            "train/clip_fraction": stats["clip_fraction"],
            "train/ratio_mean": stats["ratio_mean"],
            "train/frac_zero_std": zero_std_groups(total, rollout.group_size).float().mean(),
            "train/nonfinite_rewards": torch.tensor(float(self.rewards.num_nonfinite)),
            **self.rollout_logs(rollout),
        }
        if "grad_norm" in stats:
            values["train/grad_norm"] = stats["grad_norm"]
        values["train/skipped_updates"] = torch.tensor(float(self.skipped_updates))
        for name, component in rollout.rewards.components.items():
            values[f"train/reward/{name}"] = component.float().mean()
        values = {key: value.to(self.device) for key, value in values.items()}
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

    def _records(self, samples: list[VisualSample], rollout: Rollout) -> list[CompletionRecord]:
        k, rewards = rollout.group_size, rollout.rewards
        return [
            CompletionRecord(
                step=self.global_step,
                task=samples[i // k].task,
                question=samples[i // k].question,
                completion=self.completion_text(rollout, i),
                answer=samples[i // k].answer,
                reward=float(rewards.total[i]),
                advantage=float(rollout.advantages[i]),
                components={name: float(v[i]) for name, v in rewards.components.items()},
            )
            for i in range(min(self.hparams.records_per_step, len(rewards.total)))
        ]

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
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from app.algorithms import GRPOLossOutput, group_advantages, zero_std_groups
from app.models.policy import Policy
from app.modules.policy_module import PolicyModule
from app.rewards import RewardComponent, WeightedReward
from app.types import CompletionRecord, RewardOutput, VisualSample

LOSS_TERMS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")
"""The :class:`~app.algorithms.GRPOLossOutput` fields summed over a rollout's micro-batches and logged."""


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
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutation trampoline would hide it)
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
        rewards = self.rewards(outputs, grouped_samples, group_size=k)
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
            if scheduler is not None:
                scheduler.step()
        self._log_step(rollout, stats, batch_size=len(batch))
        return {"loss": stats["loss"], "records": self._records(batch, rollout), **self.step_outputs(rollout)}

    def _update(self, rollout: Rollout, optimizer) -> dict[str, Tensor]:
        """One optimizer step over the whole rollout, accumulating the gradients of its parts."""
        sums: dict[str, Tensor] = {}
        for out, share in self.weighted_losses(rollout):
            self.manual_backward(out.loss * share)
            for key in LOSS_TERMS:
                sums[key] = sums.get(key, 0.0) + getattr(out, key).detach() * share
        if self.hparams.gradient_clip_val > 0:
            parameters = self.policy.trainable_parameters()
            sums["grad_norm"] = torch.nn.utils.clip_grad_norm_(parameters, self.hparams.gradient_clip_val)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return sums

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

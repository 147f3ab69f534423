"""The GRPO skeleton both model families share: rollout -> rewards -> group advantages -> clipped loss -> update.

Each training step takes B prompts, lets the subclass draw K outputs per prompt on this process (groups never cross
ranks) and score them, and makes ``num_iterations`` optimizer updates on that rollout. Optimisation is manual: the
subclass yields the loss of each micro-batch (and, for flow models, each trained denoising step) with its share of the
whole rollout's normaliser; the skeleton backpropagates each share, so the accumulated gradient is the full-batch
gradient, then clips and steps once per iteration. The equations are in docs/algorithms.md#grpo.

A subclass supplies only what differs between families:

- :meth:`generate_rollout`: draw the outputs (completions or denoising trajectories) without scoring them, with the behaviour
  log-probs when :attr:`stores_behaviour_logprobs`;
- :meth:`finish_rollout`: the family's container (``rewards``, ``advantages``, ``loss_mask``, ``group_size``) from a
  generation and its scores (:meth:`score`); :meth:`rollout` is generate -> score -> finish;
- :meth:`weighted_losses`: recompute the log-probs of the stored rollout and yield ``(GRPOLossOutput, share)``;
- :meth:`completion_text`, and optionally :meth:`rollout_logs` and :meth:`step_outputs`, for logging.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from app.algorithms import GRPOLossOutput, group_advantages, zero_std_groups
from app.models.policy import Policy
from app.modules.checkpoints import gather_rank_states
from app.modules.pipeline import Generation, PipelineSettings
from app.modules.policy_module import NonFiniteTrainingError, PolicyModule
from app.modules.prompt_drawers import PromptDrawer, refill_source
from app.modules.rollout_queue import RolloutQueue
from app.rewards import RewardComponent, WeightedReward
from app.types import CompletionRecord, RewardOutput, VisualSample

_SOME_MASS = 1e-12  # divides all-zero loss masses (weights 0, not NaN); masses are counts: any value in (0, 1] is equal

LOSS_TERMS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")
"""The :class:`~app.algorithms.GRPOLossOutput` fields summed over a rollout's micro-batches and logged."""
_LOGGED_AS = {"policy_loss": "train/loss/policy", "kl": "train/kl", "clip_fraction": "train/clip_fraction",
              "ratio_mean": "train/ratio_mean"}  # fmt: skip


class Rollout(Protocol):
    """What the skeleton reads of a rollout container (:class:`~app.types.GRPOBatch`, :class:`~app.types.FlowTrajectory`)."""

    rewards: RewardOutput
    advantages: Tensor
    loss_mask: Tensor
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
        pipeline: the one-step-delayed reward pipeline and dynamic sampling (see
            :class:`~app.modules.pipeline.PipelineSettings`); default: neither (rollout -> rewards -> update per step).
        restore_nonfinite_steps: undo an optimizer step that left NaN or inf behind (see
            :class:`~app.modules.policy_module.PolicyModule`).
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
        pipeline: PipelineSettings | None = None,
        restore_nonfinite_steps: bool = True,
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutation trampoline would hide it)
        if num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        super().__init__(
            policy,
            learning_rate,
            weight_decay,
            warmup_steps,
            max_nonfinite_steps=max_nonfinite_steps,
            restore_nonfinite_steps=restore_nonfinite_steps,
        )
        self.automatic_optimization = False
        self.sampling = sampling
        self.hparams["sampling"] = dataclasses.asdict(sampling)  # plain data, so checkpoints load with weights_only
        if isinstance(pipeline, dict):  # as saved in hparams
            pipeline = PipelineSettings(**pipeline)
        self.pipeline = pipeline or PipelineSettings()
        self.hparams["pipeline"] = dataclasses.asdict(self.pipeline)
        self.rewards = WeightedReward(rewards)
        if beta > 0:
            policy.enable_reference()
        self._consecutive_nonfinite_rewards = 0
        self.rollout_queue = RolloutQueue(self.pipeline, self.rewards)  # what the pipeline carries between steps
        self._reward_seconds = 0.0  # pragma: no mutate (equivalent: each plain step zeroes it before it scores)

    @property
    def group_size(self) -> int:
        """K, the outputs drawn per prompt."""
        return self.sampling.num_generations

    @property
    def reward_executor(self) -> Executor | None:
        """The delayed pipeline's reward workers: built from ``pipeline`` when first needed, unless one is set here
        (then it is not this module's to shut down)."""
        return self.rollout_queue.executor

    @reward_executor.setter
    def reward_executor(self, executor: Executor | None) -> None:
        self.rollout_queue.executor = executor

    @property
    def dropped_rollouts(self) -> int:
        """Rollouts still pending when a fit ended (see :mod:`app.modules.pipeline`)."""
        return self.rollout_queue.dropped

    @property
    def unlogged_loss_terms(self) -> frozenset[str]:
        """:data:`LOSS_TERMS` this module's loss cannot compute (left NaN, not logged), e.g. the ratio under a fused
        loss that never materialises it."""
        return frozenset()

    @property
    def stores_behaviour_logprobs(self) -> bool:
        """Whether :meth:`generate_rollout` keeps the sampling policy's log-probs for the ratio: the rollout is trained by a
        later policy (``num_iterations > 1``, or a delayed pipeline). Otherwise the ratio is exactly 1."""
        return self.hparams.num_iterations > 1 or self.pipeline.delay > 0

    # ------------------------------------------------------------------------------------------- what differs
    def generate_rollout(self, samples: list[VisualSample]) -> Generation:
        """Draw K outputs per prompt, unscored (behaviour log-probs included when :attr:`stores_behaviour_logprobs`)."""
        raise NotImplementedError

    def finish_rollout(self, generation: Generation, scored: ScoredGroups) -> Rollout:
        """The family's rollout container from a generation and its scores."""
        raise NotImplementedError

    def loss_mass(self, rollout: Rollout) -> Tensor:
        """The rollout's weight when several rollouts make one update (dynamic sampling): the normaliser of its loss
        (kept rows or "tokens" by default), so the weighted sum is the loss over all of them."""
        return rollout.loss_mask.sum().float()

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
    def rollout(self, samples: list[VisualSample]) -> Rollout:
        """Draw K outputs per prompt, score them (:meth:`score`) and keep what the updates need."""
        generation = self._generate(samples)
        return self.finish_rollout(generation, self.score(generation.outputs, samples))

    def _generate(self, samples: list[VisualSample]) -> Generation:
        with self.gathered_policy():  # FSDP2: one all-gather for the whole rollout, resharded before the update
            return self.generate_rollout(samples)

    def score(self, outputs: Sequence[Any], samples: list[VisualSample]) -> ScoredGroups:
        """Rewards of the N = B * K ``outputs`` (row ``b * K + k`` from prompt ``b``), their group advantages, and
        which rows stay in the loss."""
        k = self.group_size
        grouped_samples = [s for s in samples for _ in range(k)]
        started = time.perf_counter()
        rewards = self.rewards(outputs, grouped_samples, group_size=k)
        self._reward_seconds += time.perf_counter() - started
        return self._scored(rewards)

    def _scored(self, rewards: RewardOutput) -> ScoredGroups:
        """Group advantages and kept rows of collected rewards (the rest of :meth:`score`)."""
        hp, k, n = self.hparams, self.group_size, len(rewards.total)
        all_nonfinite = rewards.num_nonfinite >= n * len(self.rewards.components)
        self._check_rewards(all_nonfinite and n > 0)
        total = rewards.total.float().to(self.device)  # pragma: no mutate (equivalent off CUDA: .to(None)). [N]
        advantages = group_advantages(total, k, scale=hp.advantage_scale)  # [N]
        keep = torch.ones_like(advantages, dtype=torch.bool)  # [N]
        if hp.drop_zero_std_groups or self.pipeline.dynamic_sampling:
            keep = ~zero_std_groups(total, k).repeat_interleave(k)  # [N]
        return ScoredGroups(rewards, advantages, keep)

    def training_step(self, batch: list[VisualSample], batch_idx: int) -> dict[str, Any] | None:
        if self.pipeline.overlapped:
            return self._pipelined_step(batch)
        started, self._reward_seconds = time.perf_counter(), 0.0
        rollout = self.rollout(batch)
        rolled_out = time.perf_counter()
        stats = self._train_on(rollout)
        self._log_step(rollout, stats, batch_size=len(batch))
        # for logging callbacks (callbacks/): every row's rewards and advantages, and seconds per phase of the step
        timings = {"rollout": rolled_out - started - self._reward_seconds, "reward": self._reward_seconds,
                   "update": time.perf_counter() - rolled_out}  # fmt: skip
        return {
            "loss": stats["loss"], "records": self._records(batch, rollout), "rewards": rollout.rewards,
            "advantages": rollout.advantages, "timings": timings, **self.step_outputs(rollout),
        }  # fmt: skip

    def _train_on(self, rollouts: Rollout | list[Rollout]) -> dict[str, Tensor]:
        """``num_iterations`` optimizer updates on the rollout (or rollouts); the statistics of the last one."""
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        for _ in range(self.hparams.num_iterations):
            stats = self._update(rollouts, optimizer)
            if scheduler is not None and not stats["skipped"]:
                scheduler.step()
        return stats

    # ---------------------------------------------------------------------------------------------- the pipeline
    def _pipelined_step(self, batch: list[VisualSample]) -> dict[str, Any] | None:
        """Generate rollout k+1 and submit its rewards, then train on rollout k once its rewards are in (with delay 0:
        the rollout of this very batch). The first step of a delayed pipeline only primes it."""
        started = time.perf_counter()
        queue = self.rollout_queue
        queue.submit(self._generate(batch), batch, self.group_size)
        generation = queue.take(self.device)  # pragma: no mutate (equivalent off CUDA: take(None) moves nothing)
        if generation is None:
            return None
        rolled_out = time.perf_counter()
        rewards = queue.collect(generation)
        waited = time.perf_counter() - rolled_out
        rollout = self.finish_rollout(generation, self._scored(rewards))
        rollouts, logs = [rollout], {}
        if self.pipeline.dynamic_sampling:
            rollouts, logs = self._refill(rollout, len(generation.samples))
        scored = time.perf_counter()
        stats = self._train_on(
            rollouts if len(rollouts) > 1 else rollout  # pragma: no mutate (equivalent: one rollout weighs m / m = 1)
        )  # fmt: skip
        lag = queue.trained(generation)
        logs["train/policy_lag"] = torch.tensor(float(lag))
        logs["train/reward_wait_s"] = torch.tensor(waited)
        self._log_step(rollout, stats, batch_size=len(generation.samples), extra=logs)
        timings = {"rollout": rolled_out - started, "reward": waited, "update": time.perf_counter() - scored}
        return {
            "loss": stats["loss"], "records": self._records(generation.samples, rollout), "rewards": rollout.rewards,
            "advantages": rollout.advantages, "timings": timings, "policy_lag": lag, **self.step_outputs(rollout),
        }  # fmt: skip

    def _refill(self, rollout: Rollout, num_prompts: int) -> tuple[list[Rollout], dict[str, Tensor]]:
        """DAPO's dynamic sampling: roll out and score more prompts (inline) until B groups carry a signal or the cap
        is reached; groups past the first B informative ones are left out of the loss."""
        k = self.group_size
        rollouts = [rollout]
        informative = int((~zero_std_groups(rollout.rewards.total, k)).sum())
        extra_rollouts = 0
        loader = self.trainer.train_dataloader
        # every rank rolls out as often as the neediest one: ranks generate (and, sharded, forward) in lockstep
        while extra_rollouts < self.pipeline.max_extra_rollouts and self._any_rank(informative < num_prompts):
            samples = self.drawer.draw(*refill_source(loader, num_prompts))
            more = self.rollout(samples)
            rollouts.append(more)
            informative += int((~zero_std_groups(more.rewards.total, k)).sum())
            extra_rollouts += 1
        budget = num_prompts
        for part in rollouts:  # keep the first B informative groups, in order
            for group in (~zero_std_groups(part.rewards.total, k)).nonzero().flatten().tolist():
                if budget > 0:
                    budget -= 1
                else:
                    part.loss_mask[group * k : (group + 1) * k] = 0  # pragma: no mutate (later groups: masked too)
        logs = {
            "train/dynamic/extra_rollouts": torch.tensor(float(extra_rollouts)),
            "train/dynamic/informative_groups": torch.tensor(float(min(informative, num_prompts))),
        }
        return rollouts, logs

    @property
    def drawer(self) -> PromptDrawer:
        """Dynamic sampling's prompt sampler for the training data: by index from a map-style data set, seeded with
        ``pipeline.seed + global_rank``, or from a second pass over a shard stream (see ``RolloutQueue.drawer``)."""
        dataset, _, _ = refill_source(self._trainer.train_dataloader if self._trainer is not None else None, 1)
        return self.rollout_queue.drawer(self.global_rank, dataset)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if not self.pipeline.overlapped:
            return
        # rollouts never cross ranks: one state per rank (pending rollouts cannot be made up, so no derived ones either)
        checkpoint["rollout_pipeline"] = gather_rank_states(self.rollout_queue.state(self.global_rank))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        states = checkpoint.get("rollout_pipeline")
        if not states or not self.pipeline.overlapped:
            return
        world_size = self._trainer.world_size if self._trainer is not None else 1
        if len(states) != world_size:
            raise ValueError(
                f"the checkpoint holds the rollout pipeline of {len(states)} processes, this run has {world_size}: "
                "resume a pipelined run on as many processes as it was saved from"
            )
        self.rollout_queue.load_state(states[self.global_rank], self.global_rank)

    def on_train_end(self) -> None:
        """The rule for the last rollout: one still pending when fit ends is dropped, counted and logged."""
        self.rollout_queue.close()

    def _update(self, rollouts: Rollout | list[Rollout], optimizer) -> dict[str, Tensor]:
        """One optimizer step over the whole rollout (or several, each weighted by its :meth:`loss_mass`),
        accumulating the gradients of its parts; skipped (and counted) when the loss or the gradients are not finite,
        or undone (and counted) when the step itself left NaN or inf behind (:meth:`guarded_step`; the trainer's
        ``global_step`` still counts an undone step, not a skipped one). ``stats["skipped"]`` says which."""
        sums: dict[str, Tensor] = {}
        if isinstance(rollouts, list):
            masses = torch.stack([self.loss_mass(r) for r in rollouts])
            weights = (masses / masses.sum().clamp(min=_SOME_MASS)).tolist()
            parts = (
                (out, share * weights[index])
                for index, rollout in enumerate(rollouts)
                for out, share in self.weighted_losses(rollout)
            )
        else:
            parts = self.weighted_losses(rollouts)
        for out, share in parts:
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
            skipped = self.guarded_step(optimizer)  # True: the step went non-finite and was undone
        optimizer.zero_grad(set_to_none=True)
        self._count_skip(skipped)
        sums["skipped"] = skipped
        return sums

    # --------------------------------------------------------------------------------------------------- faults
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
    def _log_step(
        self, rollout: Rollout, stats: dict[str, Tensor], batch_size: int, extra: dict[str, Tensor] | None = None
    ) -> None:
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
            **(extra or {}),
        }
        for term in self.unlogged_loss_terms:
            values.pop(_LOGGED_AS[term])
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

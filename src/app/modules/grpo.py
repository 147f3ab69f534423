"""The GRPO skeleton both model families share: rollout -> rewards -> group advantages -> clipped loss -> update.

Each training step takes B prompts, lets the family's sampler draw K outputs per prompt on this process (or, with
``grpo.group_ranks`` R > 1, K / R of them on each of R ranks that share the prompts: their rewards are all-gathered so
that every group's statistics are the whole group's), scores them, and makes ``num_iterations`` optimizer updates on
that rollout. Every step goes through the :class:`~app.modules.rollout_queue.RolloutQueue`: with ``pipeline.delay: 0``
(the default) it trains on the rollout it just drew, with ``delay: 1`` on the one drawn a step earlier while the workers
score the new one. Optimisation is manual: the family yields the loss of each micro-batch (and, for flow models, each
trained denoising step) with its share of the whole rollout's normaliser; the skeleton backpropagates each share, so the
accumulated gradient is the full-batch gradient, then clips and steps once per iteration. The equations are in
docs/algorithms.md#grpo.

:meth:`GRPOModule.training_step` reads top-down, one method per phase:

1. **generate** (:meth:`~GRPOModule._generate`): the family's sampler draws K outputs per prompt, unscored;
2. **score** (:meth:`~GRPOModule._scored_turn`, :mod:`app.modules.group_scoring`): the rollout whose turn it is gets
   its rewards, group advantages and loss mask;
3. **refill** (dynamic sampling only): more prompts until enough groups have spread rewards;
4. **update** (:meth:`~GRPOModule._train_on`): ``num_iterations`` optimizer steps, each over the family's weighted
   losses (:meth:`~GRPOModule._update`);
5. **log** (:meth:`~GRPOModule._log_step`): the statistics, and the outputs logging callbacks read.

A family (:class:`~app.modules.VLMGRPOModule`, :class:`~app.modules.FlowGRPOModule`,
:class:`~app.modules.FlowNFTModule`) supplies four methods:

- :meth:`~GRPOModule.generate_rollout` (phase 1): the family's sampler (:class:`~app.sampling.VLMSampler`,
  :class:`~app.sampling.FlowSampler`) draws the outputs, with the behaviour log-probs when
  :attr:`~GRPOModule.stores_behaviour_logprobs`;
- :meth:`~GRPOModule.loss_mask` (phase 2): what of the drawn outputs enters the loss, given which rows are kept;
- :meth:`~GRPOModule.weighted_losses` (phase 4): the loss of each part of the stored rollout and its share;
- :meth:`~GRPOModule.completion_text` (phase 5): what the completion table shows.

and may change five defaults: :meth:`~GRPOModule.rollout_weights` (phase 1: the weights rollouts are drawn with),
:meth:`~GRPOModule.loss_mass` and :meth:`~GRPOModule.gradient_scale` (phase 4: how rollouts and ranks are weighed),
:meth:`~GRPOModule.after_updates` (phase 4: once the step's updates are made), :meth:`~GRPOModule.rollout_logs` and
:meth:`~GRPOModule.step_outputs` (phase 5). What a loss logs is what its :class:`~app.algorithms.LossOutput` has.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import Tensor

from app.algorithms import LossOutput, zero_std_groups
from app.algorithms.tally import TokenTally
from app.models.policy import Policy, disable_dropout
from app.modules.group_scoring import GroupScoring, ScoredGroups
from app.modules.group_spread import check_group_ranks
from app.modules.policy_module import NONFINITE_GRADIENT, UNDONE, NonFiniteTrainingError, PolicyModule
from app.modules.rollout_queue import RolloutQueue, grouped
from app.rewards import RewardComponent, WeightedReward
from app.settings import EMASettings, GRPOSettings, OptimizerSettings, PipelineSettings, plain, settings_or_default
from app.types import CompletionRecord, Generation, GroupShare, RewardOutput, Rollout, VisualSample

log = logging.getLogger(__name__)

_SOME_MASS = 1e-12  # divides all-zero loss masses (weights 0, not NaN); masses are counts: any value in (0, 1] is equal

_LOGGED_AS = {  # the LossOutput statistics (summed over a rollout's parts) and their tags
    "policy_loss": "train/loss/policy",
    "kl": "train/kl",
    "clip_fraction": "train/clip_fraction",
    "ratio_mean": "train/ratio_mean",
    "off_policy_masked": "train/off_policy_masked",
}


class GRPOModule(PolicyModule):
    """The shared GRPO training loop (manual optimisation).

    Args:
        policy: the model to train.
        rewards: reward components, each with its ``weight``; their weighted sum is the reward.
        sampling: how outputs are drawn, a :attr:`sampling_settings` (or its fields; None: its defaults);
            ``sampling.group_size`` is the group size K in both families.
        grpo: how a scored rollout becomes updates (:class:`~app.settings.GRPOSettings`; None: the defaults).
        optimizer: AdamW and the non-finite guard (:class:`~app.settings.OptimizerSettings`).
        default_learning_rate: the family's learning rate when ``optimizer.learning_rate`` is None.
        pipeline: the one-step-delayed reward pipeline and dynamic sampling (:class:`~app.settings.PipelineSettings`);
            default: neither (rollout -> rewards -> update per step).
        records_per_step: outputs handed to logging callbacks per step (``outputs["records"]``).
        ema: a moving average of the trainable weights for validation and export
            (:class:`~app.settings.EMASettings`); None: the trained weights.
    """

    sampling_settings: ClassVar[type]
    """The family's settings block of ``sampling:``."""

    spreads_groups: ClassVar[bool] = False
    """Whether the family's sampler can draw a rank's part of a group (:class:`~app.types.GroupShare`), which
    ``grpo.group_ranks > 1`` needs."""

    def __init__(
        self,
        policy: Policy,
        rewards: Sequence[RewardComponent],
        sampling: Any,
        grpo: GRPOSettings | None,
        optimizer: OptimizerSettings | None,
        default_learning_rate: float,
        pipeline: PipelineSettings | None,
        records_per_step: int,
        ema: EMASettings | None = None,
    ):
        super().__init__(policy, optimizer, default_learning_rate, ema)
        self.automatic_optimization = False
        self.sampling = sampling = settings_or_default(self.sampling_settings, sampling)
        self.grpo = grpo = settings_or_default(GRPOSettings, grpo)
        self.pipeline = settings_or_default(PipelineSettings, pipeline)
        self.records_per_step = records_per_step
        self.rewards = WeightedReward(rewards)
        if grpo.group_ranks > 1:
            check_group_ranks(self, grpo.group_ranks)
        if grpo.beta > 0:
            policy.enable_reference()
        self._without_dropout(policy)
        self._consecutive_nonfinite_rewards = 0
        self.scoring = GroupScoring(grpo, self.group_size, grpo.drop_zero_std_groups or self.pipeline.dynamic_sampling)
        self.empty_updates = 0  # updates left out because no rank kept a sample
        self.rollout_queue = RolloutQueue(self.pipeline, self.rewards)  # what a step carries to the next
        self.record_hyperparameters(
            sampling=plain(sampling), grpo=plain(grpo), pipeline=plain(self.pipeline), records_per_step=records_per_step
        )

    @staticmethod
    def _without_dropout(policy: Policy) -> None:
        """Dropout off in the policy (and its frozen reference), for good: every pass whose log-probs enter the ratio
        or the KL sees the same deterministic network.

        The tokens (or transitions) are drawn by that network (``generate`` runs in eval mode), the stored behaviour
        log-probs and the update's log-probs are two later passes: with dropout on, each pass draws its own masks, so
        the ratio ``exp(logp - old_logp)`` is not 1 on the first update with unchanged weights and clipping and
        off-policy masking act on mask noise, and even on-policy (old = current, detached) the gradient is that of a
        perturbed network scored on another network's samples. Dropout on in one pass and off in another is no better
        (the ratio then measures the masks of one pass). So RL training is dropout-free in every pass, as TRL's
        ``disable_dropout`` and DPO's default make it; ``LoRASettings.dropout`` acts in supervised fine-tuning only."""
        changed = disable_dropout(policy)
        if changed:
            log.info("dropout turned off in %d modules of the policy for GRPO's log-prob passes", len(changed))

    @property
    def group_size(self) -> int:
        """K, the outputs drawn per prompt (over the ranks that share a group, see :attr:`group_share`)."""
        return self.sampling.group_size

    @property
    def ranks_per_group(self) -> int:
        """Consecutive ranks that share each group (``grpo.group_ranks``); they draw the same prompts (the data modules
        count them as one data-parallel replica, :func:`~app.data.sampler.prompt_ranks`)."""
        return self.grpo.group_ranks

    @property
    def group_share(self) -> GroupShare | None:
        """This rank's part of every group when groups are spread over ranks, else None (the whole group here)."""
        ranks = self.grpo.group_ranks
        return GroupShare(self.global_rank % ranks, ranks, self.group_size) if ranks > 1 else None

    @property
    def rows_per_prompt(self) -> int:
        """Outputs of each prompt drawn, scored and trained on this rank: K, or K / ``group_ranks``."""
        return self.group_size // self.grpo.group_ranks

    def setup(self, stage: str) -> None:
        super().setup(stage)
        world = self.trainer.world_size if self._trainer is not None else 1
        if world % self.grpo.group_ranks:
            raise ValueError(
                f"grpo.group_ranks {self.grpo.group_ranks} must divide the number of processes ({world}): each group "
                "is spread over that many consecutive ranks"
            )

    @property
    def skipped_groups(self) -> int:
        """Groups left out of updates because a reward could not score them."""
        return self.scoring.skipped_groups

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
        """Rollouts still pending when a fit ended (see :mod:`app.modules.rollout_queue`)."""
        return self.rollout_queue.dropped

    @property
    def stores_behaviour_logprobs(self) -> bool:
        """Whether :meth:`generate_rollout` keeps the sampling policy's log-probs for the ratio: the rollout is trained
        by a later policy (``num_iterations > 1``, or a delayed pipeline). Otherwise the ratio is exactly 1."""
        return self.grpo.num_iterations > 1 or self.pipeline.delay > 0

    # ----------------------------------------------------------------------- what a family supplies, by phase
    # 1. generate
    def generate_rollout(self, samples: list[VisualSample]) -> Generation:
        """Draw K outputs per prompt, unscored (behaviour log-probs included when :attr:`stores_behaviour_logprobs`)."""
        raise NotImplementedError

    def rollout_weights(self) -> AbstractContextManager[None]:
        """The weights :meth:`generate_rollout` draws with, swapped in around it (before FSDP2 gathers them): the
        trained ones by default."""
        return contextlib.nullcontext()

    # 2. score
    def loss_mask(self, generation: Generation, keep: Tensor) -> Tensor:
        """What of ``generation``'s outputs enters the loss, given the ``[N]`` rows ``keep`` says stay in."""
        raise NotImplementedError

    # 4. update
    def weighted_losses(self, rollout: Rollout) -> Iterator[tuple[LossOutput, Tensor | float]]:
        """The loss of each part of the rollout (micro-batch, denoising step) and its share of the whole: the shares
        sum to 1 and ``sum(share * loss)`` is the loss of the whole rollout. Called once per update; the skeleton
        backpropagates each part before asking for the next, so only one part's activations are alive at a time."""
        raise NotImplementedError

    def loss_mass(self, rollout: Rollout) -> Tensor:
        """The rollout's weight when several rollouts make one update (dynamic sampling): the normaliser of its loss
        (kept rows or "tokens" by default), so the weighted sum is the loss over all of them."""
        return rollout.loss_mask.sum().float()

    def gradient_scale(self, rollouts: list[Rollout]) -> float:
        """The factor of this rank's loss in backward, so that the gradient the strategy averages over ranks is the
        aggregation's over every rank (1: each rank's loss is normalised by its own rollout, and the ranks are
        averaged). Asked once per step."""
        return 1.0

    def after_updates(self) -> None:
        """Called once per step, after its ``num_iterations`` updates (DiffusionNFT moves its sampling policy)."""

    # 5. log
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
        """Draw K outputs per prompt, score them inline (:meth:`score`) and keep what the updates need."""
        generation = self._generate(samples)
        return self.finish_rollout(generation, self.score(generation.outputs, samples))

    def _generate(self, samples: list[VisualSample]) -> Generation:
        """Phase 1: the family's rollout with :meth:`rollout_weights` swapped in and, under FSDP2, gathered once for
        the whole rollout (resharded before the update)."""
        with self.rollout_weights(), self.gathered_policy():
            return self.generate_rollout(samples)

    def finish_rollout(self, generation: Generation, scored: ScoredGroups) -> Rollout:
        """The rollout an update trains on: ``generation`` with its scores and loss mask."""
        return Rollout(
            samples=generation.samples,
            sampled=generation.sampled,
            rewards=scored.rewards,
            advantages=scored.advantages,
            loss_mask=self.loss_mask(generation, scored.keep),
            rows_per_prompt=self.rows_per_prompt,
        )

    def score(self, outputs: Sequence[Any], samples: list[VisualSample]) -> ScoredGroups:
        """Rewards of the N = B * K ``outputs`` (row ``b * K + k`` from prompt ``b``), their group advantages, and
        which rows stay in the loss."""
        k = self.rows_per_prompt
        # the rewards' keyword group_size (their public API) is K where it is read: rewards that compare a group's
        # rows keep each group whole on one rank (check_group_ranks), so there rows_per_prompt == K
        return self._scored(self.rewards(outputs, grouped(samples, k), group_size=k), samples)

    def _scored(self, rewards: RewardOutput, samples: Sequence[VisualSample] | None = None) -> ScoredGroups:
        """Group advantages and kept rows of collected rewards (the rest of :meth:`score`, by :attr:`scoring`);
        ``samples``: the B prompts (``advantage_scale: per_prompt`` needs them). Stops the fit when every reward has
        been non-finite too long."""
        n = len(rewards.total)
        all_nonfinite = rewards.num_nonfinite >= n * len(self.rewards.components)
        self._check_rewards(all_nonfinite and n > 0)
        return self.scoring.scored(rewards, samples, self.group_share, self.global_rank, self.device)

    def training_step(self, batch: list[VisualSample], batch_idx: int) -> dict[str, Any] | None:
        """One GRPO step, in the order of the module docstring's phases. With ``delay: 1`` a step trains on the
        rollout drawn a step earlier, and the first one only primes the queue (returns None)."""
        clock = _PhaseClock()
        generation = self._generate(batch)  # 1. generate
        clock.lap("rollout")
        turn = self._scored_turn(generation)  # 2. score
        if turn is None:
            return None
        drawn, rollout = turn
        clock.lap("reward")
        rollouts, logs = [rollout], {}
        if self.pipeline.dynamic_sampling:  # 3. refill
            loader = self.trainer.train_dataloader
            queue = self.rollout_queue
            rollouts, logs = queue.refill(rollout, loader, self.global_rank, self.rollout, self._any_rank)
        clock.lap("refill")
        stats = self._train_on(rollouts)  # 4. update
        lag = self.rollout_queue.trained(drawn)
        logs["train/policy_lag"] = torch.tensor(float(lag))  # 5. log
        logs["train/reward_wait_s"] = torch.tensor(clock.seconds["reward"])
        self._log_step(rollout, stats, batch_size=len(drawn.samples), extra=logs)
        clock.lap("update")
        return {  # for logging callbacks (callbacks/)
            "loss": stats["loss"],
            "records": self._records(rollout),
            "rewards": rollout.rewards,
            "advantages": rollout.advantages,
            "timings": {phase: clock.seconds[phase] for phase in ("rollout", "reward", "update")},
            "policy_lag": lag,
            "rows_per_prompt": rollout.rows_per_prompt,  # K / group_ranks: how this rank's rows group
            **self.step_outputs(rollout),
        }

    def _scored_turn(self, generation: Generation) -> tuple[Generation, Rollout] | None:
        """Phase 2: submit ``generation``'s rewards (scored here, inline, with ``delay: 0``), take the rollout whose
        turn it is and score it: ``(what was drawn, the rollout to train on)``; None while the queue is priming."""
        queue = self.rollout_queue
        queue.submit(generation, self.rows_per_prompt)
        drawn = queue.take(self.device)
        if drawn is None:
            return None
        return drawn, self.finish_rollout(drawn, self._scored(queue.collect(drawn), drawn.samples))

    def _train_on(self, rollouts: list[Rollout]) -> dict[str, Tensor]:
        """Phase 4: ``num_iterations`` optimizer updates on the rollouts, then :meth:`after_updates`; the statistics
        of the last update."""
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        scale = self.gradient_scale(rollouts)  # all-reduced once per step where the family needs it
        for _ in range(self.grpo.num_iterations):
            stats = self._update(rollouts, optimizer, scale)
            if scheduler is not None and not stats["skipped"]:
                scheduler.step()
        self.after_updates()
        return stats

    def _update(self, rollouts: list[Rollout], optimizer, scale: float = 1.0) -> dict[str, Tensor]:
        """One optimizer step over the rollouts, each weighted by its :meth:`loss_mass` (one rollout weighs 1),
        accumulating the gradients of their parts; skipped (and counted) when the loss or the gradients are not finite,
        or undone (and counted) when the step itself left NaN or inf behind (:meth:`guarded_step`); either way
        ``global_step`` counts the update and the learning-rate schedule does not (:meth:`idle_step`).
        ``stats["skipped"]`` says whether it changed nothing. ``scale``
        (:meth:`gradient_scale`) multiplies what is backpropagated, not what is logged."""
        sums: dict[str, Tensor] = {}
        masses = torch.stack([self.loss_mass(r) for r in rollouts])
        if not self._any_rank(bool(masses.sum() > 0)):
            return self._empty_update(optimizer)
        weights = (masses / masses.sum().clamp(min=_SOME_MASS)).tolist() if len(rollouts) > 1 else [1.0]
        parts = (
            (out, share * weight)
            for rollout, weight in zip(rollouts, weights, strict=True)
            for out, share in self.weighted_losses(rollout)
        )
        entropy: TokenTally | None = None
        for out, share in parts:
            self.manual_backward(out.loss * (share * scale))
            for key, value in out.statistics().items():
                sums[key] = sums.get(key, 0.0) + value * share
            if out.entropy is not None:
                entropy = out.entropy if entropy is None else entropy + out.entropy
        parameters = self.policy.trainable_parameters()
        if self.grpo.gradient_clip_val > 0:
            norm = sums["grad_norm"] = torch.nn.utils.clip_grad_norm_(parameters, self.grpo.gradient_clip_val)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        finite = bool(torch.isfinite(norm)) and bool(torch.isfinite(sums["loss"]))
        if self._any_rank(not finite):
            self.idle_step(optimizer)  # global_step counts it, as every update; the weights stay
            self._count_skip(NONFINITE_GRADIENT)
            skipped = True
        else:
            skipped = self.guarded_step(optimizer)  # True: the step went non-finite and was undone
            optimizer.zero_grad(set_to_none=True)
            if skipped:
                self._count_skip(UNDONE)
            else:
                self._count_applied()
        sums["skipped"] = skipped
        if entropy is not None:
            sums["entropy"] = entropy
        return sums

    def _empty_update(self, optimizer) -> dict[str, Tensor]:
        """No rank kept anything to train on (every group skipped, or of equal rewards under
        ``drop_zero_std_groups`` / dynamic sampling): no backward, and an optimizer step without gradients. AdamW skips
        every parameter whose gradient is None, so no weight, moment or weight decay moves (a step on zero gradients
        would move them through the momentum and the decay); the trainer still counts the step, so ``max_steps`` ends a
        fit whose rewards never vary. Counted in :attr:`empty_updates` and logged; the learning-rate schedule does not
        advance (``stats["skipped"]``, :meth:`idle_step`)."""
        self.empty_updates += 1
        log.warning("no rank kept a sample to train on: update left out (%d so far)", self.empty_updates)
        self.idle_step(optimizer)
        return {"loss": torch.zeros((), device=self.device), "skipped": True}

    # ---------------------------------------------------------------------------------------------- checkpoints
    def rank_state(self) -> dict:
        """The random state, and this rank's per-prompt reward history (``advantage_scale: per_prompt``)."""
        state = super().rank_state()
        if self.scoring.prompt_stats is not None:
            state["prompt_stats"] = self.scoring.prompt_stats.state()
        return state

    def load_rank_state(self, saved: dict, fresh_seed: int | None) -> None:
        super().load_rank_state(saved, fresh_seed)
        if self.scoring.prompt_stats is not None and "prompt_stats" in saved:
            self.scoring.prompt_stats.load(saved["prompt_stats"])

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        self.rollout_queue.save(checkpoint, self.global_rank)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        world_size = self._trainer.world_size if self._trainer is not None else 1
        self.rollout_queue.load(checkpoint, self.global_rank, world_size)

    def on_train_end(self) -> None:
        """The rule for the last rollout: one still pending when fit ends is dropped, counted and logged."""
        self.rollout_queue.close()

    # --------------------------------------------------------------------------------------------------- faults
    def _check_rewards(self, all_nonfinite: bool) -> None:
        if not self._any_rank(all_nonfinite):
            self._consecutive_nonfinite_rewards = 0
            return
        self._consecutive_nonfinite_rewards += 1
        if self._consecutive_nonfinite_rewards >= self.optimizer_settings.max_nonfinite_steps:
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
        unscored = rollout.rewards.unscored
        scored = slice(None) if unscored is None else ~unscored.to(total.device)  # skipped rows hold placeholders
        share = self.group_share  # a group spread over ranks is one group: its parts are gathered on the device
        whole_groups, _ = self.scoring.whole_groups(
            total if share is None else total.to(self.device), share, self.global_rank
        )
        values = {
            **{tag: stats[term] for term, tag in _LOGGED_AS.items() if term in stats},
            "train/frac_zero_std": zero_std_groups(whole_groups, rollout.rows_per_prompt * self.grpo.group_ranks)
            .float()
            .mean(),
            "train/nonfinite_rewards": torch.tensor(float(self.rewards.num_nonfinite)),
            **self.rollout_logs(rollout),
            **(extra or {}),
        }
        if "grad_norm" in stats:
            values["train/grad_norm"] = stats["grad_norm"]
        if "entropy" in stats:  # the policy's per-token entropy over the loss's tokens, overall and per task
            values["train/entropy"] = stats["entropy"].mean()
            values.update({f"train/entropy/{task}": mean for task, mean in stats["entropy"].means().items()})
        values["train/skipped_updates"] = torch.tensor(float(self.skipped_updates))
        values["train/skipped_groups"] = torch.tensor(float(self.skipped_groups))
        values["train/empty_updates"] = torch.tensor(float(self.empty_updates))
        if unscored is None or not unscored.all():  # a rollout no reward scored has no mean reward to show
            values["train/reward/total"] = total[scored].mean()
            for name, component in rollout.rewards.components.items():
                values[f"train/reward/{name}"] = component.float()[scored].mean()
        values = {key: value.to(self.device) for key, value in values.items()}
        # batch_size only weighs epoch means: these on_step values never read it (on_epoch=True would need it)
        self.log_dict(values, batch_size=batch_size)
        if "train/reward/total" in values:
            self.log("reward", values["train/reward/total"], prog_bar=True, logger=False, batch_size=batch_size)

    def _records(self, rollout: Rollout) -> list[CompletionRecord]:
        k, rewards, samples = rollout.rows_per_prompt, rollout.rewards, rollout.samples
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
            for i in range(min(self.records_per_step, len(rewards.total)))
        ]


class _PhaseClock:
    """Seconds spent in each phase of a step: :meth:`lap` closes the phase running since the previous lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = now - self._last
        self._last = now

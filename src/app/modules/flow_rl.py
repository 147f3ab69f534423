"""What the two flow-matching RL modules share (:class:`FlowRLModule`): the sampler, the seeded rollout generator
saved per rank in checkpoints, deterministic evaluation, and what logging callbacks see of a rollout. Flow-GRPO
(:class:`~app.modules.FlowGRPOModule`) and DiffusionNFT (:class:`~app.modules.FlowNFTModule`) differ only in what a
rollout keeps and how an update turns it into a loss."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from app.models.flow import FlowPolicy
from app.modules.checkpoints import derived_seed
from app.modules.flow_evaluation import FlowEvaluation
from app.modules.grpo import GRPOModule
from app.rewards import RewardComponent, WeightedReward
from app.sampling.flow_rollout import FlowSampler
from app.settings import EMASettings, FlowSamplingSettings, GRPOSettings, OptimizerSettings, PipelineSettings
from app.types import Generation, Rollout

FLOW_LEARNING_RATE = 5e-6


class FlowRLModule(FlowEvaluation, GRPOModule):
    """The GRPO skeleton on a :class:`~app.models.flow.FlowPolicy`, with a :class:`~app.sampling.FlowSampler` and a
    rollout generator seeded with ``seed`` plus the rank's data-parallel index (``global_rank // grpo.group_ranks``: the
    ranks that share groups draw the same noise and each keeps its rows, :class:`~app.types.GroupShare`). The arguments
    are those of the two subclasses."""

    spreads_groups = True

    def __init__(
        self,
        policy: FlowPolicy,
        rewards: Sequence[RewardComponent],
        sampling: FlowSamplingSettings | None,
        grpo: GRPOSettings | None,
        optimizer: OptimizerSettings | None,
        pipeline: PipelineSettings | None,
        records_per_step: int,
        eval_rewards: Sequence[RewardComponent] | None,
        seed: int,
        ema: EMASettings | None,
    ):
        super().__init__(
            policy, rewards, sampling, grpo, optimizer, FLOW_LEARNING_RATE, pipeline, records_per_step, ema
        )
        self.sampler = FlowSampler(policy, self.sampling, self.grpo.micro_batch_size)
        self.eval_rewards = WeightedReward(eval_rewards) if eval_rewards is not None else self.rewards
        self.record_hyperparameters(seed=seed)
        self._generator: torch.Generator | None = None
        self._generator_state: Tensor | None = None  # restored from a checkpoint before the generator exists
        self._generator_seed: int | None = None  # a checkpoint without this rank's state: seeds it instead

    @property
    def generator(self) -> torch.Generator:
        """The rollout's random generator, on the module's device, seeded with ``seed`` plus the rank's data-parallel
        index (``global_rank``, or ``global_rank // grpo.group_ranks`` when groups are spread over ranks), or from this
        rank's state in the checkpoint a fit resumed from."""
        if self._generator is None or self._generator.device != self.device:
            generator = torch.Generator(device=self.device)
            if self._generator_state is not None:
                generator.set_state(self._generator_state)
            elif self._generator_seed is not None:
                generator.manual_seed(self._generator_seed)
            else:
                generator.manual_seed(self.hparams.seed + self.global_rank // self.grpo.group_ranks)
            self._generator = generator
        return self._generator

    def loss_mask(self, generation: Generation, keep: Tensor) -> Tensor:
        """``[N]`` bool: the kept samples (each of their trained steps or noise levels is one "token")."""
        return keep

    # --------------------------------------------------------------------------------------------------- logging
    def completion_text(self, rollout: Rollout, row: int) -> str:
        return "<image>"

    def step_outputs(self, rollout: Rollout) -> dict[str, Tensor]:
        return {"images": rollout.sampled.images[: self.records_per_step]}

    # ------------------------------------------------------------------------------------------------ checkpoints
    def rank_state(self) -> dict:
        """The global generators' states and this rank's rollout generator's (saved per rank, see
        :meth:`~app.modules.policy_module.PolicyModule.on_save_checkpoint`)."""
        return {**super().rank_state(), "rollout_generator": self.generator.get_state()}

    def load_rank_state(self, saved: dict, fresh_seed: int | None) -> None:
        super().load_rank_state(saved, fresh_seed)
        if "rollout_generator" in saved:
            self._generator_state, self._generator = saved["rollout_generator"], None
        elif fresh_seed is not None:  # no state for this rank: a seed of its own, not rank 0's state
            self._generator_state, self._generator = None, None
            self._generator_seed = derived_seed(fresh_seed, "rollout_generator")

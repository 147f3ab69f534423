"""Flow-GRPO for flow-matching image and video generators: stochastic rollout -> rewards -> per-step clipped loss.

The shared loop is :class:`~app.modules.grpo.GRPOModule`; the denoising loop is :class:`~app.sampling.FlowSampler`
(see :mod:`app.sampling.flow_rollout` for which steps are stochastic and which are trained). Each training step takes
B prompts, draws K denoising trajectories per prompt on this process (groups never cross ranks), decodes and scores the
final samples, and makes ``num_iterations`` optimizer updates on that rollout. A trajectory's "tokens" are its trained
denoising steps: the log-density of each stored transition ``x_t -> x_{t+1}`` is one ``[N, 1]`` "token" for
:func:`~app.algorithms.grpo_loss`, and the per-step losses are averaged over the trained steps
(docs/algorithms.md#flow-grpo).

Departures from the public Flow-GRPO / CPS code, and why:

- Log-probs are the exact Gaussian density averaged over latent elements (:mod:`app.sampling.flow`). Flow-GRPO uses the
  same form; the CPS reference code scores ``-(x' - mu)^2`` instead, i.e. its log-ratio is this one times
  ``2 std^2``, so its clip range (1e-4 .. 1e-3) does not carry over. The default ``eps_low = eps_high = 1e-4`` is
  Flow-GRPO's clip range for this very log-prob. Per-sample means over thousands of elements move very little per
  update, so a PPO-style 0.2 would never clip. With ``num_iterations == 1`` (the default) the ratio is exactly 1 and
  the clip range has no effect at all.
- The KL (k3, weight ``beta``) is taken per trained step between the policy's and the reference's log-densities of the
  same stored transition, as the token-level KL of GRPO.

Run it with ``python -m app fit --config configs/<a flow-grpo recipe>.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import Tensor

from app.algorithms import GRPOLossOutput, grpo_loss
from app.models.flow import FlowPolicy
from app.modules.checkpoints import derived_seed
from app.modules.flow_evaluation import FlowEvaluation
from app.modules.grpo import GRPOModule, ScoredGroups
from app.modules.pipeline import Generation, PipelineSettings
from app.rewards import RewardComponent, WeightedReward
from app.sampling.batching import micro_batches
from app.sampling.flow_rollout import FlowSampler, FlowSamplingSettings, rows_of, stochastic_steps, train_steps
from app.types import FlowTrajectory, VisualSample

__all__ = ["FlowGRPOModule"]


class FlowGRPOModule(FlowEvaluation, GRPOModule):
    """GRPO on a :class:`~app.models.flow.FlowPolicy` (manual optimisation).

    Args:
        policy: the generator to train (LoRA adapter or full fine-tuning, as the policy sets it up).
        rewards: reward components scoring the decoded samples (``completions[i]`` is a ``[3, H, W]`` or
            ``[F, 3, H, W]`` float tensor in [0, 1]); their weighted sum is the reward.
        sampling: group size K (``num_generations``), denoising steps, sampler and its ``eta``, trained steps
            (``timestep_fraction``, ``sde_window``), shared initial noise and guidance; see
            :class:`~app.sampling.FlowSamplingSettings`.
        eps_low, eps_high: clip range of the ratio of per-step mean log-densities (see the module docstring).
        eval_rewards: rewards logged as ``val/reward/<name>`` on deterministic (Euler) samples; default: ``rewards``.
        records_per_step: samples handed to logging callbacks per step (``outputs["records"]``, ``outputs["images"]``).
        micro_batch_size: trajectories per transformer forward (rollout, reference and training passes).
        seed: seeds the rollout noise (offset by the global rank, state saved in checkpoints) and, per batch index,
            the validation noise, so every evaluation sees the same starting noise.
        beta, num_iterations, advantage_scale, drop_zero_std_groups, gradient_clip_val, learning_rate, weight_decay,
            warmup_steps, max_nonfinite_steps, pipeline, restore_nonfinite_steps: see
            :class:`~app.modules.grpo.GRPOModule`.
    """

    def __init__(
        self,
        policy: FlowPolicy,
        rewards: Sequence[RewardComponent],
        sampling: FlowSamplingSettings | None = None,
        eps_low: float = 1e-4,
        eps_high: float = 1e-4,
        beta: float = 0.0,
        num_iterations: int = 1,
        advantage_scale: Literal["group", "batch", "none"] = "group",
        drop_zero_std_groups: bool = False,
        learning_rate: float = 5e-6,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        gradient_clip_val: float = 1.0,
        eval_rewards: Sequence[RewardComponent] | None = None,
        records_per_step: int = 16,
        micro_batch_size: int | None = None,
        seed: int = 0,
        max_nonfinite_steps: int = 3,
        pipeline: PipelineSettings | None = None,
        restore_nonfinite_steps: bool = True,
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutation trampoline would hide it)
        sampling = sampling or FlowSamplingSettings()
        if sampling.num_steps < 2:
            raise ValueError(
                f"flow-GRPO needs num_steps >= 2 (the last step is never trained), got {sampling.num_steps}"
            )
        super().__init__(
            policy, rewards, sampling, eps_low=eps_low, eps_high=eps_high, beta=beta, num_iterations=num_iterations,
            advantage_scale=advantage_scale, drop_zero_std_groups=drop_zero_std_groups,
            micro_batch_size=micro_batch_size, gradient_clip_val=gradient_clip_val, records_per_step=records_per_step,
            learning_rate=learning_rate, weight_decay=weight_decay, warmup_steps=warmup_steps,
            max_nonfinite_steps=max_nonfinite_steps, pipeline=pipeline, restore_nonfinite_steps=restore_nonfinite_steps,
        )  # fmt: skip
        self.sampler = FlowSampler(policy, sampling, micro_batch_size)
        self.eval_rewards = WeightedReward(eval_rewards) if eval_rewards is not None else self.rewards
        self._generator: torch.Generator | None = None
        self._generator_state: Tensor | None = None  # restored from a checkpoint before the generator exists
        self._generator_seed: int | None = None  # a checkpoint without this rank's state: seeds it instead

    @property
    def generator(self) -> torch.Generator:
        """The rollout's random generator, on the module's device, seeded with ``seed + global_rank`` (or from this
        rank's state in the checkpoint a fit resumed from)."""
        if self._generator is None or self._generator.device != self.device:
            generator = torch.Generator(device=self.device)
            if self._generator_state is not None:
                generator.set_state(self._generator_state)
            elif self._generator_seed is not None:
                generator.manual_seed(self._generator_seed)
            else:
                generator.manual_seed(self.hparams.seed + self.global_rank)
            self._generator = generator
        return self._generator

    # --------------------------------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def generate_rollout(self, samples: list[VisualSample]) -> Generation:
        """Sample K trajectories per prompt and keep the trained transitions with their log-densities under the
        sampling policy, and the decoded samples the rewards score."""
        settings, sampler, k = self.sampling, self.sampler, self.group_size
        images = self.policy.condition_images(samples)  # problem frames of an image-conditioned policy, else None
        conditioning = sampler.conditioning([s.question for s in samples], repeats=k, images=images)
        sigmas = self.policy.sigmas(settings.num_steps).float().cpu()  # [T + 1]
        stochastic = stochastic_steps(sigmas, settings.sde_window)
        if not stochastic:
            raise ValueError(
                f"no trainable step with num_steps={settings.num_steps} and sde_window={settings.sde_window}"
            )
        steps = train_steps(stochastic, settings.timestep_fraction, self.generator)
        noise = sampler.initial_noise(len(samples), self.generator).to(self.device)  # [N, ...]
        kept = sampler.denoise(conditioning, noise, sigmas, stochastic, steps, self.generator)
        ref_logprobs = None
        if self.hparams.beta:
            ref_logprobs = sampler.reference_logprobs(conditioning, sigmas, steps, kept.latents, kept.next_latents)
        images = sampler.decode(kept.final)  # [N, 3, H, W] or [N, F, 3, H, W]
        parts = dict(
            conditioning=conditioning, sigmas=sigmas, step_indices=steps, latents=kept.latents,
            next_latents=kept.next_latents, old_logprobs=kept.logprobs, ref_logprobs=ref_logprobs, images=images,
        )  # fmt: skip
        return Generation(samples, list(images), parts, version=0)

    def finish_rollout(self, generation: Generation, scored: ScoredGroups) -> FlowTrajectory:
        return FlowTrajectory(
            **generation.parts, rewards=scored.rewards, advantages=scored.advantages, loss_mask=scored.keep,
            group_size=self.group_size,
        )  # fmt: skip

    # -------------------------------------------------------------------------------------------------- training
    def weighted_losses(self, trajectory: FlowTrajectory) -> Iterator[tuple[GRPOLossOutput, Tensor]]:
        """The loss of each trained step and micro-batch: the masked per-trajectory mean within the micro-batch,
        weighted by the micro-batch's share of the mask and by 1 / (number of trained steps)."""
        hp = self.hparams
        mask = trajectory.loss_mask[:, None]  # [N, 1], one "token" per sample and step
        num_steps = len(trajectory.step_indices)
        total = mask.sum().clamp(min=1)
        for j, i in enumerate(trajectory.step_indices):
            for rows in micro_batches(mask.shape[0], hp.micro_batch_size):
                x, x_next = trajectory.latents[rows, j], trajectory.next_latents[rows, j]
                conditioning = rows_of(trajectory.conditioning, rows)
                logprobs = self.sampler.step_logprob(conditioning, trajectory.sigmas, i, x, x_next)[:, None]  # [n, 1]
                old = trajectory.old_logprobs[rows, j : j + 1] if self.stores_behaviour_logprobs else logprobs.detach()
                ref = trajectory.ref_logprobs[rows, j : j + 1] if trajectory.ref_logprobs is not None else None
                out = grpo_loss(  # pragma: no mutate (equivalent: aggregation= dropped is the default token_mean)
                    logprobs, old, trajectory.advantages[rows], mask[rows], eps_low=hp.eps_low, eps_high=hp.eps_high,
                    beta=hp.beta, ref_logprobs=ref, aggregation="token_mean",
                )  # fmt: skip
                yield out, mask[rows].sum() / total / num_steps

    # --------------------------------------------------------------------------------------------------- logging
    def completion_text(self, trajectory: FlowTrajectory, row: int) -> str:
        return "<image>"

    def rollout_logs(self, trajectory: FlowTrajectory) -> dict[str, Tensor]:
        return {"train/num_trained_steps": torch.tensor(float(len(trajectory.step_indices)))}

    def step_outputs(self, trajectory: FlowTrajectory) -> dict[str, Tensor]:
        return {"images": trajectory.images[: self.hparams.records_per_step]}

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

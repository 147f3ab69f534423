"""Flow-GRPO for flow-matching image and video generators: stochastic rollout -> rewards -> per-step clipped loss.

The shared loop is :class:`~app.modules.grpo.GRPOModule`; the rollout is :class:`~app.sampling.FlowSampler` (see
:mod:`app.sampling.flow_rollout` for which steps are stochastic and which are trained). Each training step takes
B prompts, draws K denoising trajectories per prompt on this process (or K / R on each of ``grpo.group_ranks`` R ranks
that share the prompts), decodes and scores the
final samples, and makes ``num_iterations`` optimizer updates on that rollout. A trajectory's "tokens" are its trained
denoising steps: the log-density of each stored transition ``x_t -> x_{t+1}`` is one ``[N, 1]`` "token" for
:func:`~app.algorithms.grpo_loss`, and the per-step losses are averaged over the trained steps
(docs/algorithms.md#flow-grpo).

Departures from the public Flow-GRPO / CPS code, and why:

- Log-probs are the exact Gaussian density averaged over latent elements (:mod:`app.sampling.flow`). Flow-GRPO uses the
  same form; the CPS reference code scores ``-(x' - mu)^2`` instead, i.e. its log-ratio is this one times
  ``2 std^2``, so its clip range (1e-4 .. 1e-3) does not carry over. The default
  ``loss.eps_low = loss.eps_high = 1e-4`` is Flow-GRPO's clip range for this very log-prob. Per-sample means over
  thousands of elements move very little per update, so a PPO-style 0.2 would never clip. With ``num_iterations == 1``
  (the default) the ratio is exactly 1 and the clip range has no effect at all.
- The KL (k3, weight ``beta``) is taken per trained step between the policy's and the reference's log-densities of the
  same stored transition, as the token-level KL of GRPO.
- ``loss.ratio_normalization`` (GRPO-Guard, :func:`~app.algorithms.flow_guard.guarded_loss`) needs the sampling
  policy's transition means. They are not stored with the rollout: on-policy they are the current ones detached, and
  with ``num_iterations > 1`` the first update (still the sampling weights) keeps them for the later ones, so no extra
  pass is made; a delayed pipeline (trained after an update) is refused.

Run it with ``python -m app fit --config configs/flow/<recipe>.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from app.algorithms import LossOutput, grpo_loss
from app.algorithms.flow_guard import guarded_loss
from app.models.flow import FlowPolicy
from app.modules.flow_rl import FlowRLModule
from app.rewards import RewardComponent
from app.sampling.batching import micro_batches
from app.sampling.flow_rollout import rows_of
from app.settings import (
    EMASettings,
    FlowGRPOLossSettings,
    FlowGRPOSamplingSettings,
    GRPOSettings,
    OptimizerSettings,
    PipelineSettings,
    plain,
    settings_or_default,
)
from app.types import Generation, Rollout, SampledTrajectories, VisualSample

__all__ = ["FlowGRPOModule"]


class FlowGRPOModule(FlowRLModule):
    """GRPO on a :class:`~app.models.flow.FlowPolicy` (manual optimisation).

    Args:
        policy: the generator to train (LoRA adapter or full fine-tuning, as the policy sets it up).
        rewards: reward components scoring the decoded samples (``completions[i]`` is a ``[3, H, W]`` or
            ``[F, 3, H, W]`` float tensor in [0, 1]); their weighted sum is the reward.
        sampling: group size K, denoising steps, sampler and its ``eta``, trained steps (``timestep_fraction``,
            ``sde_window``), shared initial noise and guidance (:class:`~app.settings.FlowGRPOSamplingSettings`).
        grpo: KL weight, iterations, advantages, micro-batches (trajectories per transformer forward, in the
            rollout, reference and training passes), gradient clipping (:class:`~app.settings.GRPOSettings`).
        loss: the clip range of the ratio of per-step mean log-densities (default 1e-4 each way, see the module
            docstring), GRPO-Guard's ratio normalisation and DanceGRPO's advantage clamp
            (:class:`~app.settings.FlowGRPOLossSettings`).
        optimizer: AdamW (default learning rate 5e-6), warm-up, non-finite steps
            (:class:`~app.settings.OptimizerSettings`).
        pipeline: the delayed reward pipeline and dynamic sampling (:class:`~app.settings.PipelineSettings`).
        records_per_step: samples handed to logging callbacks per step (``outputs["records"]``, ``outputs["images"]``).
        eval_rewards: rewards logged as ``val/reward/<name>`` on deterministic (Euler) samples; default: ``rewards``.
        seed: seeds the rollout noise (offset by the global rank, state saved in checkpoints) and, per batch index,
            the validation noise, so every evaluation sees the same starting noise.
        ema: a moving average of the trainable weights for validation and export (:class:`~app.settings.EMASettings`);
            None: the trained weights.
    """

    sampling_settings = FlowGRPOSamplingSettings

    def __init__(
        self,
        policy: FlowPolicy,
        rewards: Sequence[RewardComponent],
        sampling: FlowGRPOSamplingSettings | None = None,
        grpo: GRPOSettings | None = None,
        loss: FlowGRPOLossSettings | None = None,
        optimizer: OptimizerSettings | None = None,
        pipeline: PipelineSettings | None = None,
        records_per_step: int = 16,
        eval_rewards: Sequence[RewardComponent] | None = None,
        seed: int = 0,
        ema: EMASettings | None = None,
    ):
        super().__init__(
            policy, rewards, sampling, grpo, optimizer, pipeline, records_per_step, eval_rewards, seed, ema
        )
        self.loss = settings_or_default(FlowGRPOLossSettings, loss)
        if self.loss.ratio_normalization and self.pipeline.delay > 0:
            raise ValueError(
                "loss.ratio_normalization (GRPO-Guard) needs the sampling policy's transition means, which a rollout "
                f"does not store: with pipeline.delay = {self.pipeline.delay} it is trained after an update, so they "
                "are gone; set pipeline.delay: 0 or ratio_normalization: false"
            )
        self._old_means: dict[tuple[int, int, int], Tensor] = {}  # GRPO-Guard's mu_old, kept from a step's 1st update
        self.record_hyperparameters(loss=plain(self.loss))

    # --------------------------------------------------------------------------------------------------- rollout
    def generate_rollout(self, samples: list[VisualSample]) -> Generation[SampledTrajectories]:
        """K trajectories per prompt (:meth:`~app.sampling.FlowSampler.draw`): the trained transitions with their
        log-densities under the sampling policy (and the reference's when ``beta > 0``), and the decoded samples the
        rewards score."""
        window = self.sampling.window_at(self.global_step)  # MixGRPO: moves with training when window_stride > 0
        return Generation(
            samples,
            self.sampler.draw(
                samples, self.generator, reference=self.grpo.beta > 0, window=window, share=self.group_share
            ),
        )

    # -------------------------------------------------------------------------------------------------- training
    def weighted_losses(self, rollout: Rollout[SampledTrajectories]) -> Iterator[tuple[LossOutput, Tensor]]:
        """The loss of each trained step and micro-batch: the masked per-trajectory mean within the micro-batch,
        weighted by the micro-batch's share of the mask and by the step's weight (1 / number of trained steps, or by
        its noise std with ``step_weighting: noise_std``). With ``loss.ratio_normalization`` each part is GRPO-Guard's
        loss (:meth:`_guarded_loss`); with ``loss.advantage_clip`` the advantages are clamped first."""
        grpo, sampled = self.grpo, rollout.sampled
        mask = rollout.loss_mask[:, None]  # [N, 1], one "token" per sample and step
        weights = self.sampler.step_weights(sampled.sigmas, sampled.step_indices)
        total = mask.sum().clamp(min=1)
        advantages = rollout.advantages  # [N]
        if self.loss.advantage_clip is not None:
            advantages = advantages.clamp(-self.loss.advantage_clip, self.loss.advantage_clip)  # [N]
        for j, i in enumerate(sampled.step_indices):
            for rows in micro_batches(mask.shape[0], grpo.micro_batch_size):
                share = mask[rows].sum() / total * weights[j]
                if self.loss.ratio_normalization:
                    yield self._guarded_loss(sampled, j, rows, advantages[rows], mask[rows, 0]), share
                    continue
                x, x_next = sampled.latents[rows, j], sampled.next_latents[rows, j]
                conditioning = rows_of(sampled.conditioning, rows)
                logprobs = self.sampler.step_logprob(conditioning, sampled.sigmas, i, x, x_next)[:, None]  # [n, 1]
                old = sampled.old_logprobs[rows, j : j + 1] if self.stores_behaviour_logprobs else logprobs.detach()
                ref = sampled.ref_logprobs[rows, j : j + 1] if sampled.ref_logprobs is not None else None
                out = grpo_loss(
                    logprobs,
                    old,
                    advantages[rows],
                    mask[rows],
                    eps_low=self.loss.eps_low,
                    eps_high=self.loss.eps_high,
                    beta=grpo.beta,
                    ref_logprobs=ref,
                )
                yield out, share

    def _guarded_loss(
        self, sampled: SampledTrajectories, j: int, rows: slice, advantages: Tensor, mask: Tensor
    ) -> LossOutput:
        """GRPO-Guard's loss of trained step ``j`` on ``rows``: the transition rescored as
        :meth:`~app.sampling.FlowSampler.step_logprob` does (same log-prob), with its mean and std; ``mu_old`` is the
        current mean detached on the first update of a step's rollouts and that one kept for the later updates."""
        i = sampled.step_indices[j]
        x, x_next = sampled.latents[rows, j], sampled.next_latents[rows, j]
        s, s_next = float(sampled.sigmas[i]), float(sampled.sigmas[i + 1])
        v = self.sampler.velocity(x, sampled.sigmas[i], rows_of(sampled.conditioning, rows))  # [n, ...]
        step = self.sampler.step(x, v, s, s_next, prev_sample=x_next)
        old = sampled.old_logprobs[rows, j] if self.stores_behaviour_logprobs else step.log_prob.detach()  # [n]
        old_mean = step.mean.detach()  # [n, ...]
        if self.grpo.num_iterations > 1:
            old_mean = self._old_means.setdefault((id(sampled), j, rows.start or 0), old_mean)
        ref = sampled.ref_logprobs[rows, j] if sampled.ref_logprobs is not None else None
        return guarded_loss(
            step.log_prob,
            old,
            step.mean,
            old_mean,
            step.std,
            s - s_next,
            advantages,
            mask,
            eps_low=self.loss.eps_low,
            eps_high=self.loss.eps_high,
            beta=self.grpo.beta,
            ref_logprobs=ref,
        )

    def after_updates(self) -> None:
        """GRPO-Guard's kept ``mu_old`` belong to this step's rollouts: dropped once their updates are made."""
        super().after_updates()
        self._old_means.clear()

    # --------------------------------------------------------------------------------------------------- logging
    def rollout_logs(self, rollout: Rollout[SampledTrajectories]) -> dict[str, Tensor]:
        logs = {"train/num_trained_steps": torch.tensor(float(len(rollout.sampled.step_indices)))}
        if self.sampling.window_stride:  # where the moving window was when this rollout was drawn
            logs["train/first_trained_step"] = torch.tensor(float(min(rollout.sampled.step_indices)))
        return logs

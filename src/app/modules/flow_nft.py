"""DiffusionNFT for flow-matching image and video generators: any-solver samples -> rewards -> negative-aware flow
matching on the forward process (Zheng et al. 2025; the loss is :func:`~app.algorithms.nft.nft_loss`, the equations
docs/algorithms.md#diffusionnft).

The same policies, rewards, data, delayed pipeline, dynamic sampling and advantages as flow-GRPO
(:class:`~app.modules.FlowGRPOModule`); what differs:

- The rollout is drawn by the sampling policy ``v_old``, a moving average of the trained weights
  (:class:`~app.modules.ema.PolicyEMA` moved by ``nft.old_decay*``, saved in checkpoints and sharded as the weights
  are), with any solver (``nft.solver``), and keeps only the clean latents: no transition, no log-density.
- An update noises each clean latent again at ``timestep_fraction`` of the schedule's noise levels (fresh noise per
  sample and level, from the rollout generator) and backpropagates the loss of ``v_theta`` against ``v_old``'s
  prediction at the same point; each level weighs ``1 / levels``, each micro-batch its share of the kept samples.
- The group advantage becomes the optimality probability ``r = 0.5 + 0.5 clip(A / c, -1, 1)`` (``c`` =
  ``nft.advantage_clip``).
- ``grpo.beta`` weighs the reference code's KL, ``||v_theta - v_ref||^2`` to the reference policy (adapter off).

Departures from the reference implementation, and why: its policy loss is multiplied by ``adv_clip_max`` (5), a
constant factor of the learning rate, left out here so that ``optimizer.learning_rate`` means what it says. It is
CFG-free, and so is this module: ``guidance_scale > 1`` is refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from app.algorithms import LossOutput
from app.algorithms.nft import nft_loss, optimality_probability
from app.models.flow import FlowPolicy
from app.modules.ema import PolicyEMA
from app.modules.flow_rl import FlowRLModule
from app.rewards import RewardComponent
from app.sampling.batching import micro_batches
from app.sampling.flow_rollout import rows_of, train_steps
from app.settings import (
    EMASettings,
    FlowSamplingSettings,
    GRPOSettings,
    NFTSettings,
    OptimizerSettings,
    PipelineSettings,
    plain,
    settings_or_default,
)
from app.types import Generation, Rollout, SampledImages, VisualSample

__all__ = ["FlowNFTModule", "check_nft_sampling"]


def check_nft_sampling(sampling: FlowSamplingSettings, nft: NFTSettings) -> None:
    """Refuse, with a ``ValueError`` naming the options, the sampling settings DiffusionNFT cannot train with: the
    stochastic sampler's with a deterministic ``nft.solver`` (they would be ignored), guidance (it is CFG-free), and a
    deterministic solver on shared starting noise (a group's samples would be one)."""
    defaults = FlowSamplingSettings()
    stochastic = {
        "sampling.sampler": sampling.sampler != defaults.sampler,
        "sampling.eta": sampling.eta != defaults.eta,
    }
    named = [option for option, is_set in stochastic.items() if is_set]
    if nft.solver != "stochastic" and named:
        raise ValueError(
            f"nft.solver {nft.solver!r} is deterministic: the sampler and eta set the stochastic solver's noise; drop "
            f"{', '.join(named)} or set nft.solver: stochastic"
        )
    if sampling.guidance_scale > 1.0:
        raise ValueError(
            f"DiffusionNFT is CFG-free (its loss trains the conditional velocity): set sampling.guidance_scale to 1, "
            f"got {sampling.guidance_scale}"
        )
    if nft.solver != "stochastic" and sampling.shared_initial_noise and sampling.group_size > 1:
        raise ValueError(
            f"nft.solver {nft.solver!r} is deterministic: with sampling.shared_initial_noise the {sampling.group_size} "
            f"samples of a group would be one; set shared_initial_noise: false or nft.solver: stochastic"
        )


class FlowNFTModule(FlowRLModule):
    """DiffusionNFT on a :class:`~app.models.flow.FlowPolicy` (manual optimisation).

    Args:
        policy: the generator to train (LoRA adapter or full fine-tuning, as the policy sets it up).
        rewards: reward components scoring the decoded samples; their weighted sum is the reward.
        sampling: group size K, denoising steps T (the noise levels the update trains at are the schedule's), the
            stochastic sampler and ``eta`` (with ``nft.solver: stochastic``), shared initial noise
            (:class:`~app.settings.FlowSamplingSettings`).
        nft: the implicit policies' ``beta``, the advantage clip, the solver, the trained noise levels, the weighting
            and the sampling policy's moving average (:class:`~app.settings.NFTSettings`).
        grpo: advantages (``advantage_scale``, ``drop_zero_std_groups``), ``beta`` (the KL weight, see the module
            docstring), iterations, micro-batches and gradient clipping (:class:`~app.settings.GRPOSettings`).
        optimizer: AdamW (default learning rate 5e-6), warm-up, non-finite steps
            (:class:`~app.settings.OptimizerSettings`).
        pipeline: the delayed reward pipeline and dynamic sampling (:class:`~app.settings.PipelineSettings`).
        records_per_step: samples handed to logging callbacks per step (``outputs["records"]``, ``outputs["images"]``).
        eval_rewards: rewards logged as ``val/reward/<name>`` on deterministic samples of the trained weights (or of
            ``ema``); default: ``rewards``.
        seed: seeds the rollout and training noise (offset by the global rank, state saved in checkpoints) and, per
            batch index, the validation noise.
        ema: a moving average of the trainable weights for validation and export, apart from the sampling policy
            (:class:`~app.settings.EMASettings`); None: the trained weights.
    """

    sampling_settings = FlowSamplingSettings

    def __init__(
        self,
        policy: FlowPolicy,
        rewards: Sequence[RewardComponent],
        sampling: FlowSamplingSettings | None = None,
        nft: NFTSettings | None = None,
        grpo: GRPOSettings | None = None,
        optimizer: OptimizerSettings | None = None,
        pipeline: PipelineSettings | None = None,
        records_per_step: int = 16,
        eval_rewards: Sequence[RewardComponent] | None = None,
        seed: int = 0,
        ema: EMASettings | None = None,
    ):
        nft = settings_or_default(NFTSettings, nft)
        check_nft_sampling(settings_or_default(FlowSamplingSettings, sampling), nft)
        super().__init__(
            policy, rewards, sampling, grpo, optimizer, pipeline, records_per_step, eval_rewards, seed, ema
        )
        self.nft = nft
        self.record_hyperparameters(nft=plain(nft))
        self.old_policy: PolicyEMA | None = None  # built on the (sharded) parameters, in configure_model
        self._old_decay = 0.0  # the decay of the last move of the sampling policy

    def configure_model(self) -> None:
        super().configure_model()
        self.sampling_policy()

    def sampling_policy(self) -> PolicyEMA:
        """``v_old``: the moving average of the trainable weights the rollouts are drawn with (built on first use,
        after sharding when FSDP2 shards the policy: each rank averages its shard)."""
        if self.old_policy is None:
            self.old_policy = PolicyEMA(self.policy.trainable_parameters())
        return self.old_policy

    # --------------------------------------------------------------------------------------------------- rollout
    def rollout_weights(self) -> AbstractContextManager[None]:
        """``v_old``, swapped into the shards before they are gathered."""
        return self.sampling_policy().swapped_in()

    def generate_rollout(self, samples: list[VisualSample]) -> Generation[SampledImages]:
        """K samples per prompt from ``v_old`` with ``nft.solver``, and their clean latents."""
        return Generation(
            samples, self.sampler.draw_samples(samples, self.generator, self.nft.solver, share=self.group_share)
        )

    # -------------------------------------------------------------------------------------------------- training
    def _noised(self, clean: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
        """``x_t = (1 - sigma) x_0 + sigma eps`` and the target velocity ``eps - x_0``, ``eps`` from the rollout
        generator (this rank's rows of the whole groups' draw when groups are spread over ranks)."""
        share = self.group_share
        if share is not None:
            noise = share.randn(tuple(clean.shape), self.generator, clean.device, clean.dtype)
        else:
            noise = torch.randn(clean.shape, generator=self.generator, device=clean.device, dtype=clean.dtype)
        sigma = sigma.to(clean.device, clean.dtype)
        return (1 - sigma) * clean + sigma * noise, noise - clean

    @torch.no_grad()
    def _velocities(self, noised: list[Tensor], sigmas: list[Tensor], conditioning: dict[str, Tensor]) -> list[Tensor]:
        with self.gathered_policy():
            return [self.sampler.velocity(x, s, conditioning) for x, s in zip(noised, sigmas, strict=True)]

    def weighted_losses(self, rollout: Rollout[SampledImages]) -> Iterator[tuple[LossOutput, Tensor]]:
        """The loss of each trained noise level and micro-batch, weighted by ``1 / levels`` and by the micro-batch's
        share of the kept samples. ``v_old`` (and ``v_ref`` with ``grpo.beta > 0``) are evaluated first, at every
        level, without gradients, so the weights are swapped once per update."""
        nft, sampled, mask = self.nft, rollout.sampled, rollout.loss_mask
        levels = train_steps(list(range(len(sampled.sigmas) - 1)), nft.timestep_fraction, self.generator)
        sigmas = [sampled.sigmas[i] for i in levels]
        noised, targets = zip(*(self._noised(sampled.latents, s) for s in sigmas), strict=True)
        with self.sampling_policy().swapped_in():
            old = self._velocities(list(noised), sigmas, sampled.conditioning)
        ref = None
        if self.grpo.beta > 0:
            # Gathered first, then the adapter off: FSDP2's gather re-reads which parameters train to choose the dtype
            # of the gradients it reduces, and while the adapter is off none does.
            with self.gathered_policy(), self.policy.reference():
                ref = self._velocities(list(noised), sigmas, sampled.conditioning)
        optimality = optimality_probability(rollout.advantages, nft.advantage_clip)  # [N]
        total = mask.sum().clamp(min=1)
        for j, sigma in enumerate(sigmas):
            for rows in micro_batches(len(mask), self.grpo.micro_batch_size):
                velocity = self.sampler.velocity(noised[j][rows], sigma, rows_of(sampled.conditioning, rows))
                out = nft_loss(
                    velocity,
                    old[j][rows],
                    targets[j][rows],
                    sigma,
                    optimality[rows],
                    mask[rows],
                    beta=nft.beta,
                    weighting=nft.weighting,
                    kl_weight=self.grpo.beta,
                    ref_velocity=ref[j][rows] if ref is not None else None,
                )
                yield out, mask[rows].sum() / total / len(sigmas)

    def after_updates(self) -> None:
        """``v_old`` moves towards the trained weights by the scheduled decay."""
        old = self.sampling_policy()
        self._old_decay = self.nft.old_decay(int(old.steps))
        old.follow(self._old_decay)

    # --------------------------------------------------------------------------------------------------- logging
    def rollout_logs(self, rollout: Rollout[SampledImages]) -> dict[str, Tensor]:
        return {
            "train/nft/old_decay": torch.tensor(self._old_decay),
            "train/nft/optimality": optimality_probability(rollout.advantages, self.nft.advantage_clip).mean(),
        }

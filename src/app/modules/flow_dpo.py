"""Online Diffusion-DPO for flow-matching generators: K samples per prompt -> rewards -> the best and the worst of each
group as a preference pair -> the Diffusion-DPO loss on the forward process (Wallace et al. 2023; the loss is
:func:`~app.algorithms.dpo.diffusion_dpo_loss`, the equations docs/algorithms.md#diffusion-dpo).

The same policies, rewards, data, delayed pipeline, dynamic sampling and advantages as flow-GRPO
(:class:`~app.modules.FlowGRPOModule`); what differs:

- The rollout keeps only the clean latents (any solver, ``dpo.solver``), as DiffusionNFT's.
- Each group gives at most one pair: its kept sample of the highest advantage (preferred) and of the lowest
  (dispreferred); a group whose kept samples all score the same gives none. Advantages rank the samples as their
  rewards do within a group, whatever ``grpo.advantage_scale``.
- An update noises both samples of a pair with the same noise at the same level, at ``dpo.timestep_fraction`` of the
  schedule's levels, and compares the policy's flow-matching errors with the reference's (the adapter off, or a frozen
  copy under full fine-tuning). Each level weighs ``1 / levels``, each micro-batch its share of the pairs; a rollout
  weighs its number of pairs, and a step with no pair on any rank makes no update.

Departures: Diffusion-DPO trains offline on human preference pairs with the epsilon-prediction error; this is its
online form on reward-ranked pairs of the policy's own samples (verl-omni's online DPO pairs the same way), with the
velocity error. Groups spread over ranks (``grpo.group_ranks > 1``) and classifier-free guidance are refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from app.algorithms import LossOutput
from app.algorithms.dpo import diffusion_dpo_loss
from app.models.flow import FlowPolicy
from app.modules.flow_rl import FlowRLModule
from app.rewards import RewardComponent
from app.sampling.flow_rollout import train_steps
from app.settings import (
    EMASettings,
    FlowDPOSettings,
    FlowSamplingSettings,
    GRPOSettings,
    OptimizerSettings,
    PipelineSettings,
    plain,
    settings_or_default,
)
from app.types import Generation, Rollout, SampledImages, VisualSample

__all__ = ["FlowDPOModule", "preference_pairs"]


def preference_pairs(advantages: Tensor, keep: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """``(preferred [P], dispreferred [P])`` row indices: per group of ``group_size`` rows, the kept row of the highest
    advantage and the kept row of the lowest (the first of equals), where they differ in advantage."""
    adv = advantages.detach().float().view(-1, group_size)  # [B, K]
    kept = keep.bool().view(-1, group_size)  # [B, K]
    high = torch.where(kept, adv, torch.full_like(adv, -torch.inf)).max(dim=1)  # [B] x 2
    low = torch.where(kept, adv, torch.full_like(adv, torch.inf)).min(dim=1)  # [B] x 2
    has_pair = kept.any(dim=1) & (high.values > low.values)  # [B]
    offsets = torch.arange(adv.shape[0], device=adv.device) * group_size  # [B]
    return (offsets + high.indices)[has_pair], (offsets + low.indices)[has_pair]


def _rows(conditioning: dict[str, Tensor], index: Tensor) -> dict[str, Tensor]:
    """The conditioning of rows ``index``; a one-row conditioning (broadcast to every row) is kept whole."""
    return {k: v if v.shape[0] == 1 else v[index.to(v.device)] for k, v in conditioning.items()}


class FlowDPOModule(FlowRLModule):
    """Online Diffusion-DPO on a :class:`~app.models.flow.FlowPolicy` (manual optimisation).

    Args:
        policy: the generator to train (LoRA adapter or full fine-tuning; the reference is the adapter off or a frozen
            copy of the starting weights).
        rewards: reward components scoring the decoded samples; their weighted sum ranks a group's samples.
        sampling: group size K (>= 2), denoising steps T (the noise levels the update trains at are the schedule's),
            the stochastic sampler and ``eta`` (with ``dpo.solver: stochastic``), shared initial noise
            (:class:`~app.settings.FlowSamplingSettings`).
        dpo: ``beta``, the solver and the trained noise levels (:class:`~app.settings.FlowDPOSettings`).
        grpo: advantages (they rank the samples), ``drop_zero_std_groups``, iterations, micro-batches (rows per
            forward: a pair is two) and gradient clipping (:class:`~app.settings.GRPOSettings`); ``beta`` is not read
            (the reference enters the DPO loss itself).
        optimizer: AdamW (default learning rate 5e-6), warm-up, non-finite steps
            (:class:`~app.settings.OptimizerSettings`).
        pipeline: the delayed reward pipeline and dynamic sampling (:class:`~app.settings.PipelineSettings`).
        records_per_step: samples handed to logging callbacks per step (``outputs["records"]``, ``outputs["images"]``).
        eval_rewards: rewards logged as ``val/reward/<name>`` on deterministic samples; default: ``rewards``.
        seed: seeds the rollout and training noise (offset by the global rank, state saved in checkpoints) and, per
            batch index, the validation noise.
        ema: a moving average of the trainable weights for validation and export (:class:`~app.settings.EMASettings`).
    """

    sampling_settings = FlowSamplingSettings

    def __init__(
        self,
        policy: FlowPolicy,
        rewards: Sequence[RewardComponent],
        sampling: FlowSamplingSettings | None = None,
        dpo: FlowDPOSettings | None = None,
        grpo: GRPOSettings | None = None,
        optimizer: OptimizerSettings | None = None,
        pipeline: PipelineSettings | None = None,
        records_per_step: int = 16,
        eval_rewards: Sequence[RewardComponent] | None = None,
        seed: int = 0,
        ema: EMASettings | None = None,
    ):
        dpo = settings_or_default(FlowDPOSettings, dpo)
        _check_dpo_options(
            settings_or_default(FlowSamplingSettings, sampling), dpo, settings_or_default(GRPOSettings, grpo)
        )
        super().__init__(
            policy, rewards, sampling, grpo, optimizer, pipeline, records_per_step, eval_rewards, seed, ema
        )
        self.dpo = dpo
        policy.enable_reference()
        self.record_hyperparameters(dpo=plain(dpo))

    # --------------------------------------------------------------------------------------------------- rollout
    def generate_rollout(self, samples: list[VisualSample]) -> Generation[SampledImages]:
        """K samples per prompt from the current weights with ``dpo.solver``, and their clean latents."""
        return Generation(
            samples, self.sampler.draw_samples(samples, self.generator, self.dpo.solver, share=self.group_share)
        )

    # -------------------------------------------------------------------------------------------------- training
    def pairs(self, rollout: Rollout[SampledImages]) -> tuple[Tensor, Tensor]:
        """The rollout's preference pairs (:func:`preference_pairs` over its kept rows)."""
        return preference_pairs(rollout.advantages, rollout.loss_mask, rollout.rows_per_prompt)

    def loss_mass(self, rollout: Rollout[SampledImages]) -> Tensor:
        """The number of pairs: rollouts weigh by it, and no pair on any rank leaves the update out."""
        return torch.tensor(float(len(self.pairs(rollout)[0])), device=rollout.advantages.device)

    def weighted_losses(self, rollout: Rollout[SampledImages]) -> Iterator[tuple[LossOutput, Tensor]]:
        """The loss of each trained noise level and micro-batch of pairs, weighted by ``1 / levels`` and by the
        micro-batch's share of the pairs. The reference's velocities are evaluated first, without gradients. A rank
        without a pair (when another has one) yields one part of weight 0 connected to the weights."""
        sampled = rollout.sampled
        preferred, dispreferred = self.pairs(rollout)
        count = len(preferred)
        if count == 0:  # every rank backpropagates once per update (FSDP2's collectives), here a zero
            yield self._empty_part(sampled), torch.zeros((), device=sampled.latents.device)
            return
        levels = train_steps(list(range(len(sampled.sigmas) - 1)), self.dpo.timestep_fraction, self.generator)
        sigmas = [sampled.sigmas[i] for i in levels]
        rows = torch.cat([preferred, dispreferred])  # [2P]: the pairs' preferred, then dispreferred samples
        clean = sampled.latents[rows.to(sampled.latents.device)]  # [2P, ...]
        conditioning = _rows(sampled.conditioning, rows)
        noised, targets = [], []
        for sigma in sigmas:
            noise = torch.randn(
                (count, *clean.shape[1:]), generator=self.generator, device=clean.device, dtype=clean.dtype
            ).repeat(2, *([1] * (clean.ndim - 1)))  # [2P, ...]: one noise per pair, shared by its two samples
            s = sigma.to(clean.device, clean.dtype)
            noised.append((1 - s) * clean + s * noise)
            targets.append(noise - clean)
        with torch.no_grad(), self.gathered_policy(), self.policy.reference():
            ref = [self.sampler.velocity(x, s, conditioning) for x, s in zip(noised, sigmas, strict=True)]
        per_micro = max(1, (self.grpo.micro_batch_size or 2 * count) // 2)  # pairs per forward (two rows each)
        for j, sigma in enumerate(sigmas):
            for start in range(0, count, per_micro):
                pair = torch.arange(start, min(start + per_micro, count))
                both = torch.cat([pair, pair + count])  # [2n]
                velocity = self.sampler.velocity(noised[j][both], sigma, _rows(conditioning, both))  # [2n, ...]
                v_w, v_l = velocity.chunk(2)
                r_w, r_l = ref[j][both].chunk(2)
                t_w, t_l = targets[j][both].chunk(2)
                mask = torch.ones(len(pair), dtype=torch.bool, device=velocity.device)
                out = diffusion_dpo_loss(v_w, v_l, r_w, r_l, t_w, t_l, mask, beta=self.dpo.beta)
                yield out, torch.tensor(len(pair) / count / len(sigmas), device=velocity.device)

    def _empty_part(self, sampled: SampledImages) -> LossOutput:
        """A zero loss connected to the trainable weights: one row's velocity, masked out."""
        row = torch.zeros(1, dtype=torch.long)
        x = sampled.latents[:1]
        velocity = self.sampler.velocity(x, sampled.sigmas[0], _rows(sampled.conditioning, row))
        mask = torch.zeros(1, dtype=torch.bool, device=velocity.device)
        return diffusion_dpo_loss(velocity, velocity, x, x, x, x, mask, beta=self.dpo.beta)

    # --------------------------------------------------------------------------------------------------- logging
    def rollout_logs(self, rollout: Rollout[SampledImages]) -> dict[str, Tensor]:
        return {"train/dpo/pairs": torch.tensor(float(len(self.pairs(rollout)[0])))}


def _check_dpo_options(sampling: FlowSamplingSettings, dpo: FlowDPOSettings, grpo: GRPOSettings) -> None:
    """Refuse, naming the option, what online DPO cannot train with."""
    if sampling.group_size < 2:
        raise ValueError(
            f"DPO pairs the samples of a group: sampling.group_size must be >= 2, got {sampling.group_size}"
        )
    if grpo.group_ranks > 1:
        raise ValueError(
            f"DPO pairs a group's best and worst samples on one rank: grpo.group_ranks must be 1, got "
            f"{grpo.group_ranks}"
        )
    if sampling.guidance_scale > 1.0:
        raise ValueError(
            f"DPO trains the conditional velocity (no guidance): set sampling.guidance_scale to 1, got "
            f"{sampling.guidance_scale}"
        )
    if dpo.solver != "stochastic" and sampling.shared_initial_noise:
        raise ValueError(
            f"dpo.solver {dpo.solver!r} is deterministic: with sampling.shared_initial_noise the samples of a group "
            "would be one; set shared_initial_noise: false or dpo.solver: stochastic"
        )

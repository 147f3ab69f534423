"""The rollout of a flow-matching policy: step selection, the denoising loop, the trajectories a rollout keeps, the
re-scoring of stored transitions, and deterministic samples (the flow family's counterpart of
:mod:`app.sampling.vlm_rollout`; its settings are :class:`~app.settings.FlowSamplingSettings`, and flow-GRPO's
trajectories' :class:`~app.settings.FlowGRPOSamplingSettings`).

Which steps are stochastic and which are trained (see docs/algorithms.md#training-steps):

- The step onto ``s' = 0`` (the last one) is deterministic for every sampler: it is an Euler step and never trained.
- Without ``sde_window`` every other step uses the sampler (``cps`` or ``sde``). With ``sde_window = (start, end)``
  (MixGRPO / "ODE prefix then a short SDE window") only steps ``start <= i < end`` do; the rest are ODE steps: Euler
  before the window, and after it Euler or, with ``ode_tail: unipc``, diffusers' UniPC (order 2) from the window's end
  to the sample (on ``ode_tail_steps`` of the remaining steps, :func:`coarser`, when set). With ``window_stride`` the
  window moves later as training goes on (:meth:`~app.settings.FlowGRPOSamplingSettings.window_at`).
- ``timestep_fraction`` trains on ``max(1, int(fraction * S))`` of those S stochastic steps (Flow-GRPO's rounding):
  a RANDOM subset, drawn anew every rollout from the rollout generator and shared by all N trajectories of the batch
  (one sigma per forward pass). With 1.0 (default) every stochastic step is trained.

All step math runs in float32 on float32 latents, and the log-probs a rollout stores are the ones computed while
sampling, so re-scoring a stored transition with unchanged weights reproduces them exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from app.sampling.batching import micro_batches
from app.sampling.flow import StepOutput, cps_step, is_trainable_step, ode_step, sde_step, unipc_sample
from app.settings import FlowGRPOSamplingSettings, FlowSamplingSettings
from app.types import GroupShare, SampledImages, SampledTrajectories, VisualSample

log = logging.getLogger(__name__)

__all__ = ["DenoisingPolicy", "FlowSampler", "Transitions", "coarser", "rows_of", "stochastic_steps", "train_steps"]


def stochastic_steps(sigmas: Tensor, sde_window: tuple[int, int] | None = None) -> list[int]:
    """The steps ``i`` (``sigmas[i] -> sigmas[i + 1]``) sampled with the SDE / CPS sampler, in order.

    Every step whose next sigma is > 0, restricted to ``[start, end)`` with an ``sde_window``; the step onto 0 is
    always an Euler step.
    """
    num_steps = sigmas.shape[0] - 1
    start, end = sde_window if sde_window is not None else (0, num_steps)
    return [i for i in range(start, min(end, num_steps)) if is_trainable_step(float(sigmas[i + 1]))]


def train_steps(candidates: list[int], fraction: float, generator: torch.Generator | None = None) -> list[int]:
    """``max(1, int(fraction * S))`` of the S ``candidates``: all of them at 1.0, else a random subset (sorted)."""
    count = max(1, int(fraction * len(candidates)))
    if count >= len(candidates):
        return list(candidates)
    device = generator.device if generator is not None else "cpu"
    order = torch.randperm(len(candidates), generator=generator, device=device)[:count]
    return sorted(candidates[j] for j in order.tolist())


def coarser(sigmas: Tensor, steps: int | None) -> Tensor:
    """``steps`` steps along the schedule ``sigmas`` ``[L + 1]``: the sigmas at indices spaced evenly from its first
    to its last (both kept); the whole schedule when ``steps`` is None or not fewer than its L steps."""
    length = sigmas.shape[0] - 1
    if steps is None or steps >= length:
        return sigmas
    picks = torch.linspace(0, length, steps + 1).round().long()  # strictly increasing: steps < length
    return sigmas[picks]


def rows_of(conditioning: dict[str, Tensor], rows: slice) -> dict[str, Tensor]:
    """The conditioning of rows ``rows``; a one-row conditioning (broadcast to every row) is kept whole."""
    return {k: v if v.shape[0] == 1 else v[rows] for k, v in conditioning.items()}


@runtime_checkable
class DenoisingPolicy(Protocol):
    """What :class:`FlowSampler` asks of a flow policy (:class:`~app.models.flow.FlowPolicy` has it all): the
    noise schedule, starting noise, text and image conditioning, the velocity, decoding, and the KL reference.

    A policy with ``guidance_distilled`` true (FLUX.1-dev) also has ``flux_guidance``, read only for a warning."""

    @property
    def device(self) -> torch.device: ...

    def sigmas(self, num_steps: int) -> Tensor: ...

    def initial_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor: ...

    def encode_prompts(self, prompts: list[str]) -> dict[str, Tensor]: ...

    def condition_images(self, samples: Sequence[VisualSample]) -> Tensor | None: ...

    def encode_conditions(self, images: Tensor) -> dict[str, Tensor]: ...

    def velocity(self, latents: Tensor, sigma: Tensor, conditioning: dict[str, Tensor]) -> Tensor: ...

    def decode(self, latents: Tensor) -> Tensor: ...

    def reference(self) -> AbstractContextManager[None]: ...


@dataclass
class Transitions:
    """The kept transitions of N trajectories, stacked over the S kept steps.

    Attributes:
        final: ``[N, ...]`` float32 final latents.
        latents: ``[N, S, ...]`` float32 ``x_t`` before each kept step.
        next_latents: ``[N, S, ...]`` float32 ``x_{t+1}`` sampled by each kept step.
        logprobs: ``[N, S]`` float32 log-density of each sampled transition (mean over latent elements).
    """

    final: Tensor
    latents: Tensor
    next_latents: Tensor
    logprobs: Tensor


class FlowSampler:
    """Runs a flow policy's denoising loop with the configured sampler, ``micro_batch_size`` rows per forward pass.

    Args:
        policy: the generator (a :class:`DenoisingPolicy`, such as :class:`~app.models.flow.FlowPolicy`).
        settings: how samples are drawn; :meth:`draw` and :meth:`step_weights` (flow-GRPO's trajectories) read the
            trajectory options of :class:`~app.settings.FlowGRPOSamplingSettings`.
        micro_batch_size: rows per forward pass without gradients (rollout, reference, decoding); None: all at once.
    """

    def __init__(
        self,
        policy: DenoisingPolicy,
        settings: FlowSamplingSettings | FlowGRPOSamplingSettings,
        micro_batch_size: int | None = None,
    ):
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        self.policy = policy
        self.settings = settings
        self.micro_batch_size = micro_batch_size
        if settings.guidance_scale > 1.0 and getattr(policy, "guidance_distilled", False):
            log.warning(
                "guidance_scale=%s runs true CFG on a guidance-distilled FLUX (twice the compute per step) on top of "
                "flux_guidance=%s",
                settings.guidance_scale,
                policy.flux_guidance,
            )

    # ------------------------------------------------------------------------------------------------ one step
    def step(self, x: Tensor, v: Tensor, s: float, s_next: float, **kwargs) -> StepOutput:
        """One stochastic step of the configured sampler (``prev_sample=`` scores a stored transition)."""
        step = cps_step if self.settings.sampler == "cps" else sde_step
        return step(x, v, s, s_next, self.settings.eta, **kwargs)

    def step_weights(self, sigmas: Tensor, steps: Sequence[int]) -> list[float]:
        """The loss weight of each trained step in ``steps`` (they sum to 1): ``1 / S`` each, or with
        ``step_weighting: noise_std`` in proportion to the noise std of the sampler's transition at that step."""
        if self.settings.step_weighting == "uniform" or not steps:
            return [1.0 / len(steps)] * len(steps)
        probe = torch.zeros(1, 1)  # the transition's std depends on the sigmas and eta only
        stds = [
            float(self.step(probe, probe, float(sigmas[i]), float(sigmas[i + 1]), noise=probe).std[0]) for i in steps
        ]
        total = sum(stds)
        return [std / total for std in stds] if total > 0 else [1.0 / len(steps)] * len(steps)

    def velocity(self, x: Tensor, sigma: Tensor, conditioning: dict[str, Tensor]) -> Tensor:
        """``[N, ...]`` float32 (guided) velocities at one noise level; without gradients ``micro_batch_size`` rows at
        a time, with gradients all rows at once (the caller micro-batches the backward pass)."""
        sigma = sigma.to(x.device).expand(x.shape[0])
        if torch.is_grad_enabled():
            return self._guided_velocity(x, sigma, conditioning)
        parts = [
            self._guided_velocity(x[rows], sigma[rows], rows_of(conditioning, rows))
            for rows in micro_batches(len(x), self.micro_batch_size)
        ]
        return torch.cat(parts)

    def _guided_velocity(self, x: Tensor, sigma: Tensor, conditioning: dict[str, Tensor]) -> Tensor:
        scale = self.settings.guidance_scale
        if scale <= 1.0:
            return self.policy.velocity(x, sigma, conditioning)
        batch = x.shape[0]
        conditioning = {k: v.expand(batch, *v.shape[1:]) for k, v in conditioning.items()}  # one row: broadcast
        empty = self.policy.encode_prompts([""])  # text only: an image condition is kept in both branches
        both = {k: torch.cat([empty[k].expand_as(v) if k in empty else v, v]) for k, v in conditioning.items()}
        uncond, cond = self.policy.velocity(torch.cat([x, x]), torch.cat([sigma, sigma]), both).chunk(2)
        return uncond + scale * (cond - uncond)

    # ------------------------------------------------------------------------------------------------ the loop
    def conditioning(
        self, prompts: Sequence[str], rows_per_prompt: int = 1, images: Tensor | None = None
    ) -> dict[str, Tensor]:
        """The text conditioning of each prompt, and with ``images`` (``[B, 3, H, W]`` problem frames, one per
        prompt) the policy's image conditions, encoded once per prompt; every row repeated ``rows_per_prompt`` times
        (group-major rows)."""
        with torch.no_grad():
            conditioning = self.policy.encode_prompts([p for p in prompts for _ in range(rows_per_prompt)])
            if images is not None:
                if len(images) != len(prompts):
                    raise ValueError(f"got {len(images)} condition images for {len(prompts)} prompts")
                encoded = self.policy.encode_conditions(images)  # [B, ...] each
                conditioning |= {k: v.repeat_interleave(rows_per_prompt, dim=0) for k, v in encoded.items()}
            return conditioning

    @torch.no_grad()
    def draw(
        self,
        samples: Sequence[VisualSample],
        generator: torch.Generator,
        reference: bool,
        window: tuple[int, int] | None = None,
        share: GroupShare | None = None,
    ) -> SampledTrajectories:
        """K trajectories per prompt (conditioned on the policy's problem frames where it takes them), the trained
        transitions with their log-densities under the sampling policy, with ``reference`` under the reference too,
        and the decoded samples the rewards score. ``generator`` draws the trained steps and every noise; ``window``:
        the SDE window of this rollout (default: ``sde_window``; a moving one comes from ``window_at``); ``share``:
        this rank's part of groups spread over ranks (only those K / ranks trajectories per prompt are drawn)."""
        settings = self.settings
        window = window if window is not None else settings.sde_window
        images = self.policy.condition_images(samples)  # problem frames of an image-conditioned policy, else None
        conditioning = self.conditioning([s.question for s in samples], self.rows_per_prompt(share), images=images)
        sigmas = self.policy.sigmas(settings.num_steps).float().cpu()  # [T + 1]
        stochastic = stochastic_steps(sigmas, window)
        if not stochastic:
            raise ValueError(f"no trainable step with num_steps={settings.num_steps} and sde_window={window}")
        steps = train_steps(stochastic, settings.timestep_fraction, generator)
        noise = self.initial_noise(len(samples), generator, share).to(self.policy.device)  # [N, ...]
        kept = self.denoise(
            conditioning, noise, sigmas, stochastic, steps, generator, ode_tail=settings.ode_tail, share=share
        )
        ref_logprobs = None
        if reference:
            ref_logprobs = self.reference_logprobs(conditioning, sigmas, steps, kept.latents, kept.next_latents)
        return SampledTrajectories(
            conditioning=conditioning,
            sigmas=sigmas,
            step_indices=steps,
            latents=kept.latents,
            next_latents=kept.next_latents,
            old_logprobs=kept.logprobs,
            ref_logprobs=ref_logprobs,
            images=self.decode(kept.final),  # [N, 3, H, W] or [N, F, 3, H, W]
        )

    @torch.no_grad()
    def draw_samples(
        self,
        samples: Sequence[VisualSample],
        generator: torch.Generator,
        solver: str,
        share: GroupShare | None = None,
    ) -> SampledImages:
        """K final samples per prompt (conditioned on the policy's problem frames where it takes them) and their clean
        latents, from any ``solver``: ``euler`` or ``unipc`` (deterministic, so the K samples of a prompt differ only
        by their starting noise) or ``stochastic`` (the settings' ``sampler`` at their ``eta`` on every step but the
        last). No transition is kept: DiffusionNFT trains on the clean latents (:class:`~app.modules.FlowNFTModule`).
        ``share``: this rank's part of groups spread over ranks, as in :meth:`draw`."""
        settings = self.settings
        images = self.policy.condition_images(samples)
        conditioning = self.conditioning([s.question for s in samples], self.rows_per_prompt(share), images=images)
        sigmas = self.policy.sigmas(settings.num_steps).float().cpu()  # [T + 1]
        noise = self.initial_noise(len(samples), generator, share).to(self.policy.device)  # [N, ...]
        if solver == "unipc":
            final = unipc_sample(lambda x, sigma: self.velocity(x, sigma, conditioning), noise.float(), sigmas)
        else:
            stochastic = stochastic_steps(sigmas) if solver == "stochastic" else ()
            final = self.denoise(conditioning, noise, sigmas, stochastic, generator=generator, share=share).final
        return SampledImages(conditioning=conditioning, sigmas=sigmas, latents=final, images=self.decode(final))

    @torch.no_grad()
    def denoise(
        self,
        conditioning: dict[str, Tensor],
        noise: Tensor,
        sigmas: Tensor,
        stochastic: Sequence[int] = (),
        keep: Sequence[int] = (),
        generator: torch.Generator | None = None,
        ode_tail: str = "euler",
        share: GroupShare | None = None,
    ) -> Transitions:
        """Run the T steps from ``noise`` ``[N, ...]``: sampler steps at ``stochastic``, Euler steps elsewhere (after
        the last stochastic step, UniPC with ``ode_tail="unipc"``); keep the transitions of the steps in ``keep`` (a
        subset of ``stochastic``). With a ``share`` each step's noise is the whole groups' draw, sliced."""
        stochastic, keep = set(stochastic), set(keep)
        if not keep <= stochastic:
            raise ValueError(f"kept steps {sorted(keep - stochastic)} are not stochastic")
        x = noise.float()  # [N, ...]
        kept = []
        tail_from = max(stochastic) + 1 if stochastic and ode_tail == "unipc" else sigmas.shape[0] - 1
        for i in range(sigmas.shape[0] - 1):
            if i == tail_from and i < sigmas.shape[0] - 2:  # two or more steps left: UniPC's multistep pays off
                tail = coarser(sigmas[i:], self.settings.ode_tail_steps)
                x = unipc_sample(lambda z, sigma: self.velocity(z, sigma, conditioning), x, tail)
                break
            s, s_next = float(sigmas[i]), float(sigmas[i + 1])
            v = self.velocity(x, sigmas[i], conditioning)  # [N, ...]
            if i in stochastic:
                z = share.randn(tuple(x.shape), generator, x.device) if share is not None else None
                out = self.step(x, v, s, s_next, noise=z, generator=generator)
            else:
                out = ode_step(x, v, s, s_next)
            if i in keep:
                kept.append((x, out.sample, out.log_prob))
            x = out.sample
        if not kept:
            empty = x.new_zeros((x.shape[0], 0, *x.shape[1:]))
            return Transitions(x, empty, empty, x.new_zeros((x.shape[0], 0)))
        return Transitions(
            final=x,
            latents=torch.stack([a for a, _, _ in kept], dim=1),  # [N, S, ...]
            next_latents=torch.stack([b for _, b, _ in kept], dim=1),  # [N, S, ...]
            logprobs=torch.stack([lp for _, _, lp in kept], dim=1),  # [N, S]
        )

    def rows_per_prompt(self, share: GroupShare | None = None) -> int:
        """Trajectories drawn per prompt on this rank: K, or this rank's part of K under a ``share``."""
        return share.rows_per_prompt if share is not None else self.settings.group_size

    def initial_noise(self, num_prompts: int, generator: torch.Generator, share: GroupShare | None = None) -> Tensor:
        """``[N, ...]`` starting noise of K trajectories per prompt (shared within a group if the settings say so);
        under a ``share``, this rank's rows of the whole groups' noise."""
        k = self.settings.group_size
        if self.settings.shared_initial_noise:
            start = self.policy.initial_noise(num_prompts, generator=generator)
            return start.repeat_interleave(self.rows_per_prompt(share), dim=0)
        noise = self.policy.initial_noise(num_prompts * k, generator=generator)
        return share.local(noise) if share is not None else noise

    def transition_logprobs(
        self,
        conditioning: dict[str, Tensor],
        sigmas: Tensor,
        steps: Sequence[int],
        latents: Tensor,
        next_latents: Tensor,
    ) -> Tensor:
        """``[N, S]`` log-densities of stored transitions (``latents[:, j] -> next_latents[:, j]`` at step
        ``steps[j]``) under the current velocity; inside ``policy.reference()`` under the reference."""
        values = [
            self.step_logprob(conditioning, sigmas, i, latents[:, j], next_latents[:, j]) for j, i in enumerate(steps)
        ]
        return torch.stack(values, dim=1)  # [N, S]

    def step_logprob(
        self, conditioning: dict[str, Tensor], sigmas: Tensor, index: int, latents: Tensor, next_latents: Tensor
    ) -> Tensor:
        """``[N]`` log-density of one stored transition, ``latents -> next_latents`` at step ``index`` of ``sigmas``,
        under the current velocity (with gradients where they are enabled): the one place a flow transition is scored,
        for the reference pass and for the loss."""
        v = self.velocity(latents, sigmas[index], conditioning)  # [N, ...]
        step = self.step(latents, v, float(sigmas[index]), float(sigmas[index + 1]), prev_sample=next_latents)
        return step.log_prob  # [N]

    @torch.no_grad()
    def reference_logprobs(self, conditioning, sigmas, steps, latents, next_latents) -> Tensor:
        """``[N, S]`` log-densities of the stored transitions under the reference policy."""
        with self.policy.reference():
            return self.transition_logprobs(conditioning, sigmas, steps, latents, next_latents)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Pixels in [0, 1] of ``[N, ...]`` latents, ``micro_batch_size`` rows at a time."""
        return torch.cat(
            [self.policy.decode(latents[rows]) for rows in micro_batches(len(latents), self.micro_batch_size)]
        )

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        seed: int,
        device: torch.device | str = "cpu",
        images: Tensor | None = None,
    ) -> Tensor:
        """One deterministic sample per prompt (conditioned on ``images`` ``[B, 3, H, W]`` where given) from noise
        seeded by ``seed``, with the ``eval_sampler`` (Euler or UniPC): ``[B, 3, H, W]`` (or video)."""
        generator = torch.Generator(device=device).manual_seed(seed)
        noise = self.policy.initial_noise(len(prompts), generator=generator).to(device)
        sigmas = self.policy.sigmas(self.settings.num_steps).float().cpu()
        conditioning = self.conditioning(prompts, images=images)
        if self.settings.eval_sampler == "unipc":
            final = unipc_sample(lambda x, s: self.velocity(x, s, conditioning), noise.float(), sigmas)
        else:
            final = self.denoise(conditioning, noise, sigmas).final
        return self.decode(final)

"""Flow-GRPO for flow-matching image and video generators: stochastic rollout -> rewards -> per-step clipped loss.

Follows ../shared/ALGORITHMS.md ("GRPO" and "Flow matching samplers"). Each training step takes B prompts, draws K
denoising trajectories per prompt on this process (groups never cross ranks), decodes and scores the final samples,
and makes ``num_iterations`` optimizer updates on that rollout. A trajectory's "tokens" are its trained denoising
steps: the log-density of each stored transition ``x_t -> x_{t+1}`` is one ``[N, 1]`` "token" for
:func:`~app.algorithms.grpo_loss`, and the per-step losses are averaged over the trained steps.

Which steps are stochastic and which are trained:

- The step onto ``s' = 0`` (the last one) is deterministic for every sampler: it is an Euler step and never trained.
- Without ``sde_window`` every other step uses the sampler (``cps`` or ``sde``). With ``sde_window = (start, end)``
  (MixGRPO / "ODE prefix then a short SDE window") only steps ``start <= i < end`` do; the rest are Euler steps.
- ``timestep_fraction`` trains on ``max(1, int(fraction * S))`` of those S stochastic steps (Flow-GRPO's rounding):
  a RANDOM subset, drawn anew every rollout from the module's generator and shared by all N trajectories of the batch
  (one sigma per forward pass). With 1.0 (default) every stochastic step is trained.

Departures from the public Flow-GRPO / CPS code, and why:

- Log-probs are the exact Gaussian density averaged over latent elements (:mod:`app.sampling.flow`). Flow-GRPO uses the
  same form; the CPS reference code scores ``-(x' - mu)^2`` instead, i.e. its log-ratio is this one times
  ``2 std^2``, so its clip range (1e-4 .. 1e-3) does not carry over. The default ``eps_low = eps_high = 1e-4`` is
  Flow-GRPO's clip range for this very log-prob. Per-sample means over thousands of elements move very little per
  update, so a PPO-style 0.2 would never clip. With ``num_iterations == 1`` (the default) the ratio is exactly 1 and
  the clip range has no effect at all.
- All step math runs in float32 on float32 latents, and the old log-probs are the ones computed while sampling, so
  re-scoring a stored transition with unchanged weights reproduces them exactly.
- The KL (k3, weight ``beta``) is taken per trained step between the policy's and the reference's (adapter disabled)
  log-densities of the same stored transition, as the token-level KL of GRPO.

Run it with ``python -m app fit --config configs/<a flow-grpo recipe>.yaml``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import lightning as L
import torch
from torch import Tensor

from app.algorithms import group_advantages, grpo_loss, zero_std_groups
from app.models.flow import FlowPolicy
from app.modules.base import restore_rng_states, rng_states
from app.modules.checkpoints import fit_optimizers, omit_frozen_parameters, restore_frozen_parameters
from app.modules.optim import adamw_with_warmup
from app.rewards import RewardComponent, WeightedReward
from app.sampling.flow import StepOutput, cps_step, is_trainable_step, ode_step, sde_step
from app.types import CompletionRecord, FlowTrajectory, VisualSample

log = logging.getLogger(__name__)

__all__ = ["FlowGRPOModule", "stochastic_steps", "train_steps"]


def _rows(conditioning: dict[str, Tensor], rows: slice) -> dict[str, Tensor]:
    """The conditioning of rows ``rows``; a one-row conditioning (broadcast to every row) is kept whole."""
    return {k: v if v.shape[0] == 1 else v[rows] for k, v in conditioning.items()}


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


class FlowGRPOModule(L.LightningModule):
    """GRPO on a :class:`~app.models.flow.FlowPolicy` (manual optimisation).

    Args:
        policy: the generator to train (LoRA adapter or full fine-tuning, as the policy sets it up).
        rewards: reward components scoring the decoded samples (``completions[i]`` is a ``[3, H, W]`` or
            ``[F, 3, H, W]`` float tensor in [0, 1]); their weighted sum is the reward.
        num_generations: group size K, trajectories per prompt.
        num_steps: denoising steps T of a rollout (and of validation sampling).
        sampler: ``cps`` (coefficients-preserving) or ``sde`` (Flow-GRPO) for the stochastic steps.
        eta: the sampler's noise level, > 0 (``cps``: at most 1).
        timestep_fraction: fraction of the stochastic steps trained per rollout (a random subset, see the module
            docstring); 1.0 trains all of them.
        sde_window: ``(start, end)``: only steps ``start <= i < end`` are stochastic (and trained), the others are
            Euler steps; None: every step but the last.
        eps_low, eps_high: clip range of the ratio of per-step mean log-densities (see the module docstring).
        beta: weight of the k3 KL to the reference (adapter disabled); 0 skips the reference passes.
        num_iterations: optimizer updates per rollout.
        advantage_scale: ``group``, ``batch`` or ``none`` (Dr. GRPO).
        drop_zero_std_groups: leave groups whose rewards are all equal out of the loss.
        learning_rate, weight_decay, warmup_steps: AdamW and its linear warm-up (in optimizer steps).
        gradient_clip_val: clip the global gradient norm before each step (0 disables).
        eval_rewards: rewards logged as ``val/reward/<name>`` on deterministic (Euler) samples; default: ``rewards``.
        records_per_step: samples handed to logging callbacks per step (``outputs["records"]``, ``outputs["images"]``).
        shared_initial_noise: the K trajectories of a prompt start from the same noise (DanceGRPO), so the rewards within
            a group differ only through the sampler's noise, which the policy gradient can credit; False (Flow-GRPO)
            draws one starting noise per trajectory, whose effect on the reward the gradient cannot credit.
        micro_batch_size: trajectories per transformer forward (rollout, reference and training passes); gradients
            accumulate over the micro-batches of a rollout and reproduce the full-batch gradient. None: all N at once.
        seed: seeds the rollout noise (offset by the global rank, state saved in checkpoints) and, per batch index,
            the validation noise, so every evaluation sees the same starting noise.
    """

    def __init__(
        self,
        policy: FlowPolicy,
        rewards: Sequence[RewardComponent],
        num_generations: int = 8,
        num_steps: int = 10,
        sampler: Literal["sde", "cps"] = "cps",
        eta: float = 0.7,
        timestep_fraction: float = 1.0,
        sde_window: tuple[int, int] | None = None,
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
        shared_initial_noise: bool = False,
        micro_batch_size: int | None = None,
        seed: int = 0,
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutation trampoline would hide it)
        super().__init__()
        if num_generations < 1 or num_steps < 2 or num_iterations < 1:
            raise ValueError(
                f"need num_generations >= 1, num_steps >= 2 and num_iterations >= 1, "
                f"got {num_generations}, {num_steps}, {num_iterations}"
            )
        if sampler not in ("sde", "cps"):
            raise ValueError(f"sampler must be 'sde' or 'cps', got {sampler!r}")
        if not (eta > 0 and (sampler == "sde" or eta <= 1)):
            raise ValueError(f"eta must be > 0 (and <= 1 for cps): eta = 0 makes every step deterministic, got {eta}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        if not 0 < timestep_fraction <= 1:
            raise ValueError(f"timestep_fraction must be in (0, 1], got {timestep_fraction}")
        if sde_window is not None:
            sde_window = tuple(int(i) for i in sde_window)
            if len(sde_window) != 2 or not 0 <= sde_window[0] < min(sde_window[1], num_steps - 1):
                raise ValueError(
                    f"sde_window must be (start, end) with 0 <= start < end and start < num_steps - 1 = "
                    f"{num_steps - 1} (the last step is never trained), got {sde_window}"
                )
        self.save_hyperparameters(ignore=["policy", "rewards", "eval_rewards"])
        self.automatic_optimization = False
        self.policy = policy
        self.rewards = WeightedReward(rewards)
        self.eval_rewards = WeightedReward(eval_rewards) if eval_rewards is not None else self.rewards
        self._generator: torch.Generator | None = None
        self._generator_state: Tensor | None = None  # restored from a checkpoint before the generator exists

    # ------------------------------------------------------------------------------------------------ optimizer
    def configure_optimizers(self):
        parameters = self.policy.trainable_parameters()
        if not parameters:
            raise ValueError("the policy has no trainable parameters: set a LoRA adapter or freeze less")
        hp = self.hparams
        return adamw_with_warmup(parameters, hp.learning_rate, hp.weight_decay, hp.warmup_steps)

    # ------------------------------------------------------------------------------------------------ sampling
    @property
    def generator(self) -> torch.Generator:
        """The rollout's random generator, on the module's device, seeded with ``seed + global_rank``."""
        if self._generator is None or self._generator.device != self.device:
            generator = torch.Generator(device=self.device)
            if self._generator_state is not None:
                generator.set_state(self._generator_state)
            else:
                generator.manual_seed(self.hparams.seed + self.global_rank)
            self._generator = generator
        return self._generator

    def _step(self, x: Tensor, v: Tensor, s: float, s_next: float, **kwargs) -> StepOutput:
        step = cps_step if self.hparams.sampler == "cps" else sde_step
        return step(x, v, s, s_next, self.hparams.eta, **kwargs)

    def _velocity(self, x: Tensor, sigma: Tensor, conditioning: dict[str, Tensor]) -> Tensor:
        """``[N, ...]`` float32 velocities; without gradients, computed ``micro_batch_size`` rows at a time."""
        sigma = sigma.to(self.device).expand(x.shape[0])
        if torch.is_grad_enabled():
            return self.policy.velocity(x, sigma, conditioning)
        parts = [
            self.policy.velocity(x[rows], sigma[rows], _rows(conditioning, rows))
            for rows in self._micro_batches(len(x))
        ]
        return torch.cat(parts)

    def _decode(self, latents: Tensor) -> Tensor:
        return torch.cat([self.policy.decode(latents[rows]) for rows in self._micro_batches(len(latents))])

    def _micro_batches(self, n: int) -> list[slice]:
        size = self.hparams.micro_batch_size or n
        return [slice(start, min(start + size, n)) for start in range(0, n, size)]

    @torch.no_grad()
    def denoise(
        self,
        conditioning: dict[str, Tensor],
        noise: Tensor,
        sigmas: Tensor,
        stochastic: Sequence[int] = (),
        keep: Sequence[int] = (),
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor, Tensor]]]:
        """Run the T steps from ``noise`` ``[N, ...]``: sampler steps at ``stochastic``, Euler steps elsewhere.

        Returns the final latents ``[N, ...]`` and, for each step in ``keep`` (a subset of ``stochastic``), the
        float32 ``(x_t [N, ...], x_{t+1} [N, ...], log_prob [N])`` of its transition.
        """
        stochastic, keep = set(stochastic), set(keep)
        if not keep <= stochastic:
            raise ValueError(f"kept steps {sorted(keep - stochastic)} are not stochastic")
        x = noise.float()  # [N, ...]
        kept = []
        for i in range(sigmas.shape[0] - 1):
            s, s_next = float(sigmas[i]), float(sigmas[i + 1])
            v = self._velocity(x, sigmas[i], conditioning)  # [N, ...]
            out = self._step(x, v, s, s_next, generator=generator) if i in stochastic else ode_step(x, v, s, s_next)
            if i in keep:
                kept.append((x, out.sample, out.log_prob))
            x = out.sample
        return x, kept

    def _conditioning(self, samples: list[VisualSample], repeats: int) -> dict[str, Tensor]:
        with torch.no_grad():
            return self.policy.encode_prompts([s.question for s in samples for _ in range(repeats)])  # N rows

    # --------------------------------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def rollout(self, samples: list[VisualSample]) -> FlowTrajectory:
        """Sample K trajectories per prompt, keep the trained transitions, score the decoded samples."""
        hp, k = self.hparams, self.hparams.num_generations
        conditioning = self._conditioning(samples, k)
        sigmas = self.policy.sigmas(hp.num_steps).float().cpu()  # [T + 1]
        stochastic = stochastic_steps(sigmas, hp.sde_window)
        if not stochastic:
            raise ValueError(f"no trainable step with num_steps={hp.num_steps} and sde_window={hp.sde_window}")
        steps = train_steps(stochastic, hp.timestep_fraction, self.generator)
        if hp.shared_initial_noise:
            noise = self.policy.initial_noise(len(samples), generator=self.generator).repeat_interleave(k, dim=0)
        else:
            noise = self.policy.initial_noise(len(samples) * k, generator=self.generator)
        noise = noise.to(self.device)  # [N, ...]
        final, kept = self.denoise(conditioning, noise, sigmas, stochastic, steps, self.generator)
        latents = torch.stack([x for x, _, _ in kept], dim=1)  # [N, S, ...]
        next_latents = torch.stack([x for _, x, _ in kept], dim=1)  # [N, S, ...]
        old_logprobs = torch.stack([lp for _, _, lp in kept], dim=1)  # [N, S]
        ref_logprobs = self._reference_logprobs(conditioning, sigmas, steps, latents, next_latents) if hp.beta else None
        images = self._decode(final)  # [N, 3, H, W] or [N, F, 3, H, W]
        grouped_samples = [s for s in samples for _ in range(k)]
        rewards = self.rewards(list(images), grouped_samples)
        total = rewards.total.float().to(self.device)  # [N]
        advantages = group_advantages(total, k, scale=hp.advantage_scale)  # [N]
        loss_mask = torch.ones_like(advantages, dtype=torch.bool)  # [N]
        if hp.drop_zero_std_groups:
            loss_mask = ~zero_std_groups(total, k).repeat_interleave(k)  # [N]
        return FlowTrajectory(
            conditioning, sigmas, steps, latents, next_latents, old_logprobs, ref_logprobs, images, rewards,
            advantages, loss_mask,
        )  # fmt: skip

    def _reference_logprobs(self, conditioning, sigmas, steps, latents, next_latents) -> Tensor:
        """``[N, S]`` log-densities of the stored transitions under the reference (adapter disabled)."""
        values = []
        with self.policy.reference():
            for j, i in enumerate(steps):
                v = self._velocity(latents[:, j], sigmas[i], conditioning)  # [N, ...]
                out = self._step(
                    latents[:, j], v, float(sigmas[i]), float(sigmas[i + 1]), prev_sample=next_latents[:, j]
                )
                values.append(out.log_prob)  # [N]
        return torch.stack(values, dim=1)  # [N, S]

    # -------------------------------------------------------------------------------------------------- training
    def training_step(self, batch: list[VisualSample], batch_idx: int):
        trajectory = self.rollout(batch)
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        for _ in range(self.hparams.num_iterations):
            stats = self._update(trajectory, optimizer)
            if scheduler is not None:
                scheduler.step()
        self._log_step(trajectory, stats, batch_size=len(batch))
        limit = self.hparams.records_per_step
        return {"loss": stats["loss"], "records": self._records(batch, trajectory), "images": trajectory.images[:limit]}

    def _update(self, trajectory: FlowTrajectory, optimizer) -> dict[str, Tensor]:
        """One optimizer step: backward once per trained step and micro-batch (bounded memory); the loss is the mean
        over trained steps of the masked per-trajectory mean, each micro-batch weighted by its share of the mask."""
        hp = self.hparams
        mask = trajectory.loss_mask[:, None]  # [N, 1], one "token" per sample and step
        num_steps = len(trajectory.step_indices)
        total = mask.sum().clamp(min=1)
        sums: dict[str, Tensor] = {}
        for j, i in enumerate(trajectory.step_indices):
            sigma, sigma_next = float(trajectory.sigmas[i]), float(trajectory.sigmas[i + 1])
            for rows in self._micro_batches(mask.shape[0]):
                x, x_next = trajectory.latents[rows, j], trajectory.next_latents[rows, j]
                conditioning = _rows(trajectory.conditioning, rows)
                v = self._velocity(x, trajectory.sigmas[i], conditioning)  # [n, ...], with grad
                logprobs = self._step(x, v, sigma, sigma_next, prev_sample=x_next).log_prob[:, None]  # [n, 1]
                old = logprobs.detach() if hp.num_iterations == 1 else trajectory.old_logprobs[rows, j : j + 1]
                ref = trajectory.ref_logprobs[rows, j : j + 1] if trajectory.ref_logprobs is not None else None
                out = grpo_loss(
                    logprobs, old, trajectory.advantages[rows], mask[rows], eps_low=hp.eps_low, eps_high=hp.eps_high,
                    beta=hp.beta, ref_logprobs=ref, aggregation="token_mean",
                )  # fmt: skip
                share = mask[rows].sum() / total  # token_mean within the micro-batch -> over the whole rollout
                self.manual_backward(out.loss * share / num_steps)
                for key in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
                    sums[key] = sums.get(key, 0.0) + getattr(out, key).detach() * share / num_steps
        if hp.gradient_clip_val > 0:
            sums["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), hp.gradient_clip_val)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return sums

    # --------------------------------------------------------------------------------------------------- logging
    def _log_step(self, trajectory: FlowTrajectory, stats: dict[str, Tensor], batch_size: int) -> None:
        total = trajectory.rewards.total.float()
        values = {
            "train/reward/total": total.mean(),
            "train/loss/policy": stats["policy_loss"],
            "train/kl": stats["kl"],
            "train/clip_fraction": stats["clip_fraction"],
            "train/ratio_mean": stats["ratio_mean"],
            "train/frac_zero_std": zero_std_groups(total, self.hparams.num_generations).float().mean(),
            "train/num_trained_steps": torch.tensor(float(len(trajectory.step_indices))),
            "train/nonfinite_rewards": torch.tensor(float(self.rewards.num_nonfinite)),
        }
        if "grad_norm" in stats:
            values["train/grad_norm"] = stats["grad_norm"]
        for name, component in trajectory.rewards.components.items():
            values[f"train/reward/{name}"] = component.float().mean()
        values = {key: value.to(self.device) for key, value in values.items()}
        self.log_dict(values, batch_size=batch_size)
        self.log("reward", values["train/reward/total"], prog_bar=True, batch_size=batch_size, logger=False)

    def _records(self, samples: list[VisualSample], trajectory: FlowTrajectory) -> list[CompletionRecord]:
        k, rewards = self.hparams.num_generations, trajectory.rewards
        return [
            CompletionRecord(
                step=self.global_step,
                task=samples[i // k].task,
                question=samples[i // k].question,
                completion="<image>",
                answer=samples[i // k].answer,
                reward=float(rewards.total[i]),
                advantage=float(trajectory.advantages[i]),
                components={name: float(v[i]) for name, v in rewards.components.items()},
            )
            for i in range(min(self.hparams.records_per_step, len(rewards.total)))
        ]

    # ------------------------------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def generate(self, samples: list[VisualSample], batch_idx: int = 0) -> Tensor:
        """One deterministic (Euler) sample per prompt, from noise seeded by ``seed + batch_idx``: ``[B, 3, H, W]``."""
        generator = torch.Generator(device=self.device).manual_seed(self.hparams.seed + batch_idx)
        noise = self.policy.initial_noise(len(samples), generator=generator).to(self.device)
        sigmas = self.policy.sigmas(self.hparams.num_steps).float().cpu()
        final, _ = self.denoise(self._conditioning(samples, 1), noise, sigmas)
        return self._decode(final)

    def validation_step(self, batch: list[VisualSample], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, stage="val")

    def test_step(self, batch: list[VisualSample], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, stage="test")

    def _evaluate(self, samples: list[VisualSample], batch_idx: int, stage: str) -> None:
        rewards = self.eval_rewards(list(self.generate(samples, batch_idx)), samples)
        self.log(f"{stage}/reward/total", rewards.total.mean().to(self.device), batch_size=len(samples), sync_dist=True)
        for name, values in rewards.components.items():
            self.log(f"{stage}/reward/{name}", values.mean().to(self.device), batch_size=len(samples), sync_dist=True)

    def predict_step(self, batch: list[VisualSample], batch_idx: int) -> list[dict]:
        """Deterministic samples for ``python -m app predict``: the prompt and its image (``[3, H, W]``, CPU)."""
        images = self.generate(batch, batch_idx).cpu()
        return [
            {"task": s.task, "question": s.question, "image": image} for s, image in zip(batch, images, strict=True)
        ]

    # ------------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # The rollout noise comes from the module's generator (and the global ones): a resumed run samples what an
        # uninterrupted one would.
        checkpoint["rng_states"] = rng_states()
        checkpoint["rollout_generator"] = self.generator.get_state()
        omit_frozen_parameters(self, checkpoint, fit_optimizers(self))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:
            restore_rng_states(checkpoint["rng_states"])
        if "rollout_generator" in checkpoint:
            self._generator_state, self._generator = checkpoint["rollout_generator"], None
        restore_frozen_parameters(self, checkpoint)

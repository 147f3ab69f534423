"""Rectified-flow pretraining of a :class:`~app.models.flow.FlowPolicy` on (prompt, target image) pairs.

Each step encodes the targets with the policy's VAE (``x0``), draws a noise level ``s`` per image (logit-normal as
SD3 trains, or uniform) and noise ``eps``, forms ``x_s = (1 - s) x0 + s eps`` and regresses the policy's velocity on
``v = eps - x0`` (mean squared error). The embedded tiny models start from random weights, VAE included, so a random
decoder would turn any latent into noise: with ``train_vae`` (default) the VAE learns to reconstruct the targets in the
same step (an L1 weighted up on foreground pixels, see :func:`foreground_mask`, + ``kl_weight`` * KL of its
posterior, at ``vae_learning_rate``) and the flow learns on its current,
detached latents. After ``vae_warmup_steps`` steps of VAE-only training the flow loss is switched on; after
``vae_train_steps`` steps the VAE stops training (frozen, in eval mode), so the flow learns on fixed latents and each
step is cheaper.

An image-conditioned policy (image edit, e.g. ``tiny-flux-kontext``) learns ``problem -> solution`` pairs: a sample's
``images`` are ``[problem, solution]``; the flow is conditioned on the problem frame's latents and regresses onto the
solution's (the VAE learns both). Video targets are not supported here.

Validation samples one image per prompt with the Euler (ODE) sampler from noise seeded per batch and logs
``val/reward/total`` and ``val/reward/<name>`` of ``eval_rewards``, as :class:`~app.modules.FlowGRPOModule` does, so the
two stages report comparable figures. Export the result with :class:`app.export.ExportPolicy` (it calls
``policy.export``, which writes the trained VAE too); a flow-GRPO config then loads that folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from app.models.flow import FlowPolicy
from app.modules.flow_evaluation import FlowEvaluation
from app.modules.optim import adamw_with_warmup
from app.modules.policy_module import PolicyModule
from app.rewards import RewardComponent, WeightedReward
from app.sampling.flow_rollout import FlowSampler
from app.settings import FlowSamplingSettings, OptimizerSettings
from app.types import VisualSample

__all__ = ["FlowMatchingModule", "foreground_mask", "images_to_tensor"]


def images_to_tensor(samples: Sequence[VisualSample], index: int = 0) -> Tensor:
    """Image ``index`` (default the first) of each sample as float32 ``[B, 3, H, W]`` in [0, 1]."""
    arrays = [np.asarray(s.images[index].convert("RGB"), dtype=np.float32) / 255.0 for s in samples]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def foreground_mask(images: Tensor, threshold: float = 0.1) -> Tensor:
    """``[B, 1, H, W]`` float: 1 where a pixel's colour differs from its image's background colour (the per-channel
    median over the image, i.e. the dominant colour) by more than ``threshold`` in summed absolute RGB (images in
    [0, 1]), else 0."""
    background = images.flatten(2).median(dim=2).values[:, :, None, None]  # [B, 3, 1, 1]
    return ((images - background).abs().sum(dim=1, keepdim=True) > threshold).float()


class FlowMatchingModule(FlowEvaluation, PolicyModule):
    """Flow-matching (rectified flow) pretraining, usually of the whole transformer (``policy.lora = None``).

    Args:
        policy: the generator; every trainable parameter of it (``trainable_parameters()``) is optimised.
        optimizer: AdamW on the transformer (default learning rate 1e-3), its linear warm-up, non-finite steps
            (:class:`~app.settings.OptimizerSettings`).
        sigma_sampling: ``logit_normal`` (``sigmoid(N(0, 1))``, SD3's default) or ``uniform``.
        train_vae: also train the VAE to reconstruct the targets (needed for randomly initialised models).
        vae_learning_rate: AdamW learning rate of the VAE.
        kl_weight: weight of the VAE posterior's KL to N(0, 1) (keeps the latent scale near the flow's noise).
        foreground_weight: extra weight of the reconstruction error on foreground pixels (those whose colour differs
            from the image's dominant, background colour): an error weighted by ``1 + foreground_weight`` there. Small
            objects on a flat background are a few percent of the pixels; with a plain L1 the VAE learns the
            background and averages the objects' colours away (the tiny VAE then decodes red and blue as grey-yellow,
            and no flow on top of it can draw them). 0 gives the plain L1.
        vae_warmup_steps: steps that train the VAE only, before the flow loss starts.
        vae_train_steps: steps after which the VAE is frozen (its optimizer state is kept but no longer used); None
            trains it to the end.
        num_steps: Euler steps of validation sampling.
        eval_rewards: rewards logged as ``val/reward/<name>`` on validation samples; None logs only the losses.
        seed: seeds the validation noise (``seed + batch_idx``).
    """

    def __init__(
        self,
        policy: FlowPolicy,
        optimizer: OptimizerSettings | None = None,
        sigma_sampling: Literal["logit_normal", "uniform"] = "logit_normal",
        train_vae: bool = True,
        vae_learning_rate: float = 2e-3,
        kl_weight: float = 1e-3,
        foreground_weight: float = 10.0,
        vae_warmup_steps: int = 0,
        vae_train_steps: int | None = None,
        num_steps: int = 10,
        eval_rewards: Sequence[RewardComponent] | None = None,
        seed: int = 0,
    ):
        if sigma_sampling not in ("logit_normal", "uniform"):
            raise ValueError(f"sigma_sampling must be 'logit_normal' or 'uniform', got {sigma_sampling!r}")
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        if vae_train_steps is not None and vae_train_steps < 1:
            raise ValueError(f"vae_train_steps must be >= 1 or null, got {vae_train_steps}")
        super().__init__(policy, optimizer, default_learning_rate=1e-3)
        self.record_hyperparameters(
            sigma_sampling=sigma_sampling,
            train_vae=train_vae,
            vae_learning_rate=vae_learning_rate,
            kl_weight=kl_weight,
            foreground_weight=foreground_weight,
            vae_warmup_steps=vae_warmup_steps,
            vae_train_steps=vae_train_steps,
            num_steps=num_steps,
            seed=seed,
        )
        # validation samples: Euler steps only (the sampler's stochastic settings are unused), no guidance
        self.sampler = FlowSampler(policy, FlowSamplingSettings(group_size=1, num_steps=num_steps))
        if train_vae:
            policy.vae.requires_grad_(True)
        self.eval_rewards = WeightedReward(eval_rewards) if eval_rewards else None

    # ------------------------------------------------------------------------------------------------ optimizer
    def configure_optimizers(self):
        hp, settings = self.hparams, self.optimizer_settings
        groups = [{"params": self.policy.trainable_parameters(), "lr": settings.learning_rate}]
        if not groups[0]["params"]:
            raise ValueError("the policy has no trainable parameters")
        if hp.train_vae:
            groups.append({"params": list(self.policy.vae.parameters()), "lr": hp.vae_learning_rate})
        return adamw_with_warmup(groups, settings.learning_rate, settings.weight_decay, settings.warmup_steps)

    # -------------------------------------------------------------------------------------------------- training
    def _sigmas(self, batch: int) -> Tensor:
        if self.hparams.sigma_sampling == "uniform":
            return torch.rand(batch, device=self.device)
        return torch.sigmoid(torch.randn(batch, device=self.device))

    def _vae_loss(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """L1 reconstruction + ``kl_weight`` KL of the VAE, and the (detached) scaled latents of the targets."""
        vae, config = self.policy.vae, self.policy.vae.config
        pixels = images.to(vae.dtype) * 2 - 1  # [B, 3, H, W] in [-1, 1]
        posterior = vae.encode(pixels).latent_dist
        z = posterior.sample()
        recon = vae.decode(z, return_dict=False)[0]
        weights = 1.0 + self.hparams.foreground_weight * foreground_mask(images)  # [B, 1, H, W]
        error = (weights * (recon.float() - pixels.float()).abs()).mean()
        loss = error + self.hparams.kl_weight * posterior.kl().mean() / z[0].numel()
        latents = (posterior.mode().detach() - (config.shift_factor or 0.0)) * config.scaling_factor
        return loss, latents.float()

    def on_train_start(self) -> None:
        if self._vae_training():  # the policy keeps its VAE in eval mode; here it trains, so it is put in train mode
            self.policy.vae.train()
        super().on_train_start()

    def _vae_training(self) -> bool:
        """Whether this step trains the VAE; past ``vae_train_steps`` the VAE is frozen once and for all."""
        hp = self.hparams
        if not hp.train_vae:
            return False
        if hp.vae_train_steps is not None and self.global_step >= hp.vae_train_steps:
            if self.policy.vae.training or any(p.requires_grad for p in self.policy.vae.parameters()):
                self.policy.vae.requires_grad_(False).eval()
            return False
        return True

    def _targets(self, batch: list[VisualSample]) -> tuple[Tensor, Tensor | None]:
        """The target images ``[B, 3, H, W]``, and for an image-conditioned policy the problem frames: a sample is
        then ``images = [problem, solution]`` (the solution is the target)."""
        if not self.policy.is_conditioned:
            return images_to_tensor(batch).to(self.device), None
        short = [i for i, s in enumerate(batch) if len(s.images) < 2]
        if short:
            raise ValueError(
                f"conditioned flow matching needs images = [problem, solution] per sample; samples {short} have fewer "
                "(VBVRPromptDataset(with_solution=True) provides them)"
            )
        return images_to_tensor(batch, index=-1).to(self.device), images_to_tensor(batch).to(self.device)

    def training_step(self, batch: list[VisualSample], batch_idx: int) -> Tensor:
        images, problems = self._targets(batch)  # [B, 3, H, W] each
        logs = {}
        loss = images.new_zeros(())
        if self._vae_training():  # the VAE also learns the problem frames, whose latents condition the flow
            vae_loss, x0 = self._vae_loss(images if problems is None else torch.cat([images, problems]))
            x0 = x0[: len(images)]
            loss = loss + vae_loss
            logs["train/loss/vae"] = vae_loss.detach()
        else:
            x0 = self.policy.encode(images)  # [B, *latent_shape]
        if self.global_step >= self.hparams.vae_warmup_steps or not self._vae_training():
            conditioning = self.policy.encode_prompts([s.question for s in batch])
            if problems is not None:
                conditioning |= self.policy.encode_conditions(problems)
            sigma = self._sigmas(x0.shape[0])  # [B]
            noise = torch.randn_like(x0)
            s = sigma.view(-1, *([1] * (x0.ndim - 1)))
            x_s = (1 - s) * x0 + s * noise
            v = self.policy.velocity(x_s, sigma, conditioning)
            flow_loss = F.mse_loss(v, noise - x0)
            loss = loss + flow_loss
            logs["train/loss/flow"] = flow_loss.detach()
        logs["train/loss"] = loss.detach()
        self.log_dict(logs, batch_size=len(batch))
        self.log("loss", loss.detach(), prog_bar=True, batch_size=len(batch), logger=False)
        return loss

    # ------------------------------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def _evaluate(self, samples: list[VisualSample], batch_idx: int, stage: str) -> dict[str, Tensor] | None:
        if samples and samples[0].images and not self.policy.is_video:
            images = images_to_tensor(samples).to(self.device)
            recon = self.policy.decode(self.policy.encode(images))
            self.log(f"{stage}/loss/reconstruction", F.l1_loss(recon, images), batch_size=len(samples), sync_dist=True)
        return super()._evaluate(samples, batch_idx, stage)

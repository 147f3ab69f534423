"""Evaluation of a flow policy on deterministic samples, shared by flow-matching pretraining and flow-GRPO.

Image-conditioned policies (:mod:`app.models.flow_conditioning`) see each sample's problem frame (``images[0]``).
Scoring beyond the evaluation rewards (VBVR's per split, task and regime scores:
:class:`callbacks.vbvr_eval.VBVRScores`) is a callback's, from the samples the steps return.
"""

from __future__ import annotations

import torch
from torch import Tensor

from app.types import VisualSample


class FlowEvaluation:
    """Validation, test and predict steps of a LightningModule holding a ``policy``, a ``sampler``
    (:class:`~app.sampling.FlowSampler`), ``eval_rewards`` (a :class:`~app.rewards.WeightedReward` or None) and a
    ``seed`` hyper-parameter.

    Every evaluation samples one image per prompt from noise seeded by ``seed + batch_idx`` (so every evaluation sees
    the same starting noise) with the sampler's ``eval_sampler`` (Euler or UniPC) and logs ``<stage>/reward/total`` and
    ``<stage>/reward/<name>``. The steps return ``{"images": ...}`` (the samples, on the CPU) for callbacks such as
    :class:`callbacks.vbvr_eval.VBVRScores` and :class:`callbacks.vbvr_eval.VBVRGridWriter`.
    """

    @torch.no_grad()
    def generate(self, samples: list[VisualSample], batch_idx: int = 0) -> Tensor:
        """One deterministic sample per prompt, from noise seeded by ``seed + batch_idx``: ``[B, 3, H, W]`` (or
        ``[B, F, 3, H, W]``)."""
        prompts = [s.question for s in samples]
        images = self.policy.condition_images(samples)
        with self.gathered_policy():  # FSDP2: one all-gather for all denoising steps
            return self.sampler.generate(prompts, seed=self.hparams.seed + batch_idx, device=self.device, images=images)

    def validation_step(self, batch: list[VisualSample], batch_idx: int) -> dict[str, Tensor] | None:
        return self._evaluate(batch, batch_idx, stage="val")

    def test_step(self, batch: list[VisualSample], batch_idx: int) -> dict[str, Tensor] | None:
        return self._evaluate(batch, batch_idx, stage="test")

    @torch.no_grad()
    def _evaluate(self, samples: list[VisualSample], batch_idx: int, stage: str) -> dict[str, Tensor] | None:
        if self.eval_rewards is None:
            return None
        generated = self.generate(samples, batch_idx)
        rewards = self.eval_rewards(list(generated), samples)
        self.log(f"{stage}/reward/total", rewards.total.mean().to(self.device), batch_size=len(samples), sync_dist=True)
        for name, values in rewards.components.items():
            self.log(f"{stage}/reward/{name}", values.mean().to(self.device), batch_size=len(samples), sync_dist=True)
        return {"images": generated.cpu()}

    def predict_step(self, batch: list[VisualSample], batch_idx: int) -> list[dict]:
        """Deterministic samples for ``python -m app predict``: the prompt and its image (``[3, H, W]``, CPU)."""
        images = self.generate(batch, batch_idx).cpu()
        return [
            {"task": s.task, "question": s.question, "image": image} for s, image in zip(batch, images, strict=True)
        ]

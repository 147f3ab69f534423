"""Evaluation of a flow policy on deterministic (Euler) samples, shared by flow-matching pretraining and flow-GRPO."""

from __future__ import annotations

import torch
from torch import Tensor

from app.types import VisualSample


class FlowEvaluation:
    """Validation, test and predict steps of a LightningModule holding a ``sampler``
    (:class:`~app.sampling.FlowSampler`), ``eval_rewards`` (a :class:`~app.rewards.WeightedReward` or None) and a
    ``seed`` hyper-parameter.

    Every evaluation samples one image per prompt from noise seeded by ``seed + batch_idx`` (so every evaluation sees
    the same starting noise) and logs ``<stage>/reward/total`` and ``<stage>/reward/<name>``.
    """

    @torch.no_grad()
    def generate(self, samples: list[VisualSample], batch_idx: int = 0) -> Tensor:
        """One deterministic (Euler) sample per prompt, from noise seeded by ``seed + batch_idx``: ``[B, 3, H, W]``."""
        prompts = [s.question for s in samples]
        return self.sampler.generate(prompts, seed=self.hparams.seed + batch_idx, device=self.device)

    def validation_step(self, batch: list[VisualSample], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, stage="val")

    def test_step(self, batch: list[VisualSample], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, stage="test")

    @torch.no_grad()
    def _evaluate(self, samples: list[VisualSample], batch_idx: int, stage: str) -> None:
        if self.eval_rewards is None:
            return
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

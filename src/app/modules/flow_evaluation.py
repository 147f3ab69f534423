"""Evaluation of a flow policy on deterministic samples, shared by flow-matching pretraining and flow-GRPO.

Image-conditioned policies (:mod:`app.models.flow_conditioning`) see each sample's problem frame (``images[0]``).
VBVR samples (``meta["vbvr"]``) are also scored per split, task and regime (:mod:`app.tasks.vbvr.regimes`), with the
scorer's failed checks counted per task, so one ``validate`` run gives the in-domain and out-of-domain tables side by
side.
"""

from __future__ import annotations

import torch
from torch import Tensor

from app.modules.grouped_means import GroupedEvaluation
from app.tasks.vbvr.regimes import score_regimes
from app.types import VisualSample


class FlowEvaluation(GroupedEvaluation):
    """Validation, test and predict steps of a LightningModule holding a ``policy``, a ``sampler``
    (:class:`~app.sampling.FlowSampler`), ``eval_rewards`` (a :class:`~app.rewards.WeightedReward` or None) and a
    ``seed`` hyper-parameter.

    Every evaluation samples one image per prompt from noise seeded by ``seed + batch_idx`` (so every evaluation sees
    the same starting noise) with the sampler's ``eval_sampler`` (Euler or UniPC) and logs ``<stage>/reward/total`` and
    ``<stage>/reward/<name>``. Samples with ``meta["vbvr"]`` add ``<stage>/<split>/<task>/<regime>`` (the scorer's mean
    score; split from ``meta["split"]``, ``in_domain`` when absent) and ``<stage>/failed/<split>/<task>/<check>`` (the
    fraction of that task's measured Last-Frame samples failing the check), means over every process's samples. The
    steps return ``{"images": ...}`` (the samples, on the CPU) for callbacks such as
    :class:`callbacks.vbvr_eval.VBVRGridWriter`.
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
        self._log_vbvr(generated, samples, stage)
        return {"images": generated.cpu()}

    def _log_vbvr(self, generated: Tensor, samples: list[VisualSample], stage: str) -> None:
        """Per split / task / regime scores and per task failed checks of the VBVR samples of a batch, accumulated
        for the epoch's end (:class:`~app.modules.grouped_means.GroupedEvaluation`: a process's share of the set
        need not hold every split and task). A failed-check fraction counts the samples whose Last-Frame rendering the
        scorer could measure (an unmeasurable one scores 0 and has no checks)."""
        for rendering, sample in zip(generated, samples, strict=True):
            spec = sample.meta.get("vbvr")
            if not spec:
                continue
            split = sample.meta.get("split", "in_domain")
            results = score_regimes(rendering, spec)
            for regime, result in results.items():
                self.log_grouped(f"{stage}/{split}/{spec['task']}/{regime}", [result.score if result else 0.0])
            last = results["last_frame"]
            for check in last.checks if last else ():
                self.log_grouped(f"{stage}/failed/{split}/{spec['task']}/{check.name}", [float(not check.passed)])

    def on_validation_epoch_end(self) -> None:
        self.log_grouped_means()

    def on_test_epoch_end(self) -> None:
        self.log_grouped_means()

    def predict_step(self, batch: list[VisualSample], batch_idx: int) -> list[dict]:
        """Deterministic samples for ``python -m app predict``: the prompt and its image (``[3, H, W]``, CPU)."""
        images = self.generate(batch, batch_idx).cpu()
        return [
            {"task": s.task, "question": s.question, "image": image} for s, image in zip(batch, images, strict=True)
        ]

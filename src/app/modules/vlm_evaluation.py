"""Greedy-decoding evaluation of a VLM policy, shared by the SFT and GRPO modules."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from app.models.vlm import SamplingSettings
from app.rewards import AccuracyReward, FormatReward, RewardComponent
from app.types import CompletionBatch, VisualSample


class GreedyEvaluation:
    """Validation, test and predict steps of a LightningModule holding a VLM ``policy`` and ``eval_rewards``.

    Each reward is scored on greedy completions (``hparams.eval_max_new_tokens`` tokens at most) and logged as
    ``<stage>/<name>`` and ``<stage>/<name>/<task>`` (``accuracy`` as ``<stage>/acc``). Every evaluation's figures are
    kept in ``eval_results`` under ``"<stage>@step<global step>"`` (the CLI prints them at the end of a run).
    """

    eval_results: dict[str, dict[str, float]]

    def validation_step(self, batch: list[VisualSample], batch_idx: int) -> None:
        self._evaluate(batch, stage="val")

    def test_step(self, batch: list[VisualSample], batch_idx: int) -> None:
        self._evaluate(batch, stage="test")

    @torch.no_grad()
    def predict_step(self, batch: list[VisualSample], batch_idx: int) -> list[dict[str, str | None]]:
        """Greedy completions for ``python -m app predict``."""
        completions = self._greedy(batch)
        return [
            {"task": s.task, "question": s.question, "answer": s.answer, "completion": text}
            for s, text in zip(batch, completions.texts, strict=True)
        ]

    def _greedy(self, samples: list[VisualSample]) -> CompletionBatch:
        prompts = self.policy.encode_prompts(samples)
        sampling = SamplingSettings(
            num_generations=1,  # pragma: no mutate (equivalent: generate draws one completion per row whatever K)
            max_new_tokens=self.hparams.eval_max_new_tokens,
        )
        return self.policy.generate(prompts, sampling, greedy=True)

    @torch.no_grad()
    def _evaluate(self, samples: list[VisualSample], stage: str) -> None:
        completions = self._greedy(samples)
        for reward in self.eval_rewards:
            values = reward.score(completions.texts, samples).to(self.device)  # [B]
            key = "acc" if reward.name == "accuracy" else reward.name
            self.log(f"{stage}/{key}", values.mean(), batch_size=len(samples), sync_dist=True)
            by_task = defaultdict(list)
            for sample, value in zip(samples, values, strict=True):
                by_task[sample.task].append(value)
            for task, task_values in by_task.items():
                self.log(
                    f"{stage}/{key}/{task}",
                    torch.stack(task_values).mean(),
                    batch_size=len(task_values),
                    sync_dist=True,
                )

    def on_validation_epoch_end(self) -> None:
        self._remember("val")

    def on_test_epoch_end(self) -> None:
        self._remember("test")

    def _remember(self, stage: str) -> None:
        """Keep this evaluation's figures."""
        metrics = {
            k: float(v)
            for k, v in self.trainer.callback_metrics.items()
            if k.startswith(f"{stage}/") and v.numel() == 1
        }
        if metrics and not self.trainer.sanity_checking:
            self.eval_results[f"{stage}@step{self.global_step}"] = metrics


def default_eval_rewards(eval_rewards: Sequence[RewardComponent] | None) -> list[RewardComponent]:
    """The rewards scored in evaluation: the given ones, or accuracy and format."""
    return list(eval_rewards) if eval_rewards is not None else [AccuracyReward(), FormatReward()]

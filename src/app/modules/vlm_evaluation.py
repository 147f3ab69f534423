"""Greedy-decoding evaluation of a VLM policy, shared by the SFT and GRPO modules, with pass@k from sampled
completions and a breakdown per task and per evaluation set (docs/evaluation.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from app.data.eval_sets import EVAL_SET_KEY
from app.modules.grouped_means import GroupedEvaluation
from app.rewards import AccuracyReward, FormatReward, RewardComponent
from app.settings import PassAtK, SamplingSettings
from app.types import CompletionBatch, VisualSample


def pass_at_k(num_samples: int, num_correct: Tensor, k: int) -> Tensor:
    """The unbiased pass@k estimate per prompt, ``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021), from ``n`` sampled
    completions of which ``c`` are correct: the chance that at least one of k completions drawn without replacement
    from the n is correct.

    >>> [round(v, 4) for v in pass_at_k(4, torch.tensor([0, 1, 2, 4]), 2).tolist()]
    [0.0, 0.5, 0.8333, 1.0]
    """
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@k needs 1 <= k <= n (samples per prompt), got k={k}, n={num_samples}")
    total = math.comb(num_samples, k)
    return torch.tensor([1.0 - math.comb(num_samples - int(c), k) / total for c in num_correct], dtype=torch.float32)


class VLMEvaluation(GroupedEvaluation):
    """Validation, test and predict steps of a LightningModule holding a VLM ``policy`` and ``eval_rewards``.

    Each reward is scored on greedy completions (``eval_max_new_tokens`` tokens at most) and logged as
    ``<stage>/<name>`` and ``<stage>/<name>/<task>`` (``accuracy`` as ``<stage>/acc``), and per evaluation set as
    ``<stage>/<set>/<name>[/<task>]`` for samples whose ``meta["eval_set"]`` names one (their names are kept in
    ``eval_set_names``). With a ``pass_at_k`` attribute (:class:`PassAtK`), n completions are also sampled per prompt
    and ``<stage>/pass@<k>`` is logged the same ways. Every evaluation's figures are kept in ``eval_results`` under
    ``"<stage>@step<global step>"`` (the CLI prints them at the end of a run).
    """

    eval_max_new_tokens: int = 256
    pass_at_k: PassAtK | None = None
    eval_set_names: list[str] = []

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
        sampling = SamplingSettings(group_size=1, max_new_tokens=self.eval_max_new_tokens)
        return self.policy.generate(prompts, sampling, greedy=True)

    @torch.no_grad()
    def _evaluate(self, samples: list[VisualSample], stage: str) -> None:
        completions = self._greedy(samples)
        for reward in self.eval_rewards:
            values = reward.score(completions.texts, samples).to(self.device)  # [B]
            self._log_grouped(stage, "acc" if reward.name == "accuracy" else reward.name, values, samples)
        settings: PassAtK | None = getattr(self, "pass_at_k", None)
        if settings is not None:
            for k, values in self._pass_at_k(samples, settings).items():
                self._log_grouped(stage, f"pass@{k}", values.to(self.device), samples)

    def _pass_at_k(self, samples: list[VisualSample], settings: PassAtK) -> dict[int, Tensor]:
        """``k -> [B]`` pass@k estimates from ``settings.num_samples`` sampled completions per prompt."""
        n = settings.num_samples
        reward = next((r for r in self.eval_rewards if r.name == settings.reward), None)
        if reward is None:
            names = [r.name for r in self.eval_rewards]
            raise ValueError(f"pass_at_k.reward {settings.reward!r} is not one of the evaluation rewards {names}")
        sampling = SamplingSettings(
            group_size=n, temperature=settings.temperature, max_new_tokens=self.eval_max_new_tokens
        )
        sampled = self.policy.generate(
            self.policy.encode_prompts(samples, rows_per_prompt=n), sampling, rows_per_prompt=n
        )
        scores = reward.score(sampled.texts, [s for s in samples for _ in range(n)])  # [B * n], group-major
        correct = (scores.float() >= settings.threshold).view(len(samples), n).sum(dim=1)  # [B]
        return {k: pass_at_k(n, correct, k) for k in settings.k}

    def _log_grouped(self, stage: str, key: str, values: Tensor, samples: list[VisualSample]) -> None:
        """Log the mean of ``values`` ``[B]`` as ``<stage>/<key>``, per task (``<stage>/<key>/<task>``) and per
        evaluation set (``<stage>/<set>/<key>`` and ``<stage>/<set>/<key>/<task>``)."""
        self.log(f"{stage}/{key}", values.mean(), batch_size=len(samples), sync_dist=True)
        for sample, value in zip(samples, values.tolist(), strict=True):  # groups: means at the epoch's end
            self.log_grouped(f"{stage}/{key}/{sample.task}", [value])
            eval_set = sample.meta.get(EVAL_SET_KEY)
            if eval_set is not None:
                self.eval_set_names = sorted({*getattr(self, "eval_set_names", ()), str(eval_set)})
                self.log_grouped(f"{stage}/{eval_set}/{key}", [value])
                self.log_grouped(f"{stage}/{eval_set}/{key}/{sample.task}", [value])

    def on_validation_epoch_end(self) -> None:
        self._remember("val", self.log_grouped_means())

    def on_test_epoch_end(self) -> None:
        self._remember("test", self.log_grouped_means())

    def _remember(self, stage: str, grouped: dict[str, float]) -> None:
        """Keep this evaluation's figures: the per-step ones (already in ``callback_metrics``) and ``grouped``, the
        means just logged at the epoch's end (which reach ``callback_metrics`` only after this hook)."""
        metrics = {
            k: float(v)
            for k, v in self.trainer.callback_metrics.items()
            if k.startswith(f"{stage}/") and v.numel() == 1
        }
        metrics.update(grouped)
        if metrics and not self.trainer.sanity_checking:
            self.eval_results[f"{stage}@step{self.global_step}"] = metrics


def default_eval_rewards(eval_rewards: Sequence[RewardComponent] | None) -> list[RewardComponent]:
    """The rewards scored in evaluation: the given ones, or accuracy and format."""
    return list(eval_rewards) if eval_rewards is not None else [AccuracyReward(), FormatReward()]

"""Where the reward comes from, step by step: per component mean / std / histogram, how the advantages split, how many
groups carry no signal, and which VBVR checks fail on which task.

Reads ``outputs["rewards"]`` (:class:`~app.types.RewardOutput` of all N = B * K rows) and ``outputs["advantages"]``
(``[N]``) that the GRPO modules return from ``training_step``; without them, the ``records`` (the first
``records_per_step`` rows) stand in. VBVR failed checks come from the reward components that count them
(:class:`~app.tasks.vbvr.VBVRScorerReward` ``failed_checks``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from torch import Tensor

from app.algorithms import zero_std_groups
from callbacks.step_outputs import rows_per_prompt


def breakdown(components: dict[str, Tensor], advantages: Tensor | None, rows_per_prompt: int) -> dict[str, float]:
    """Scalars of one step: ``<name>/mean|std|min|max|frac_zero_std`` per reward component (``frac_zero_std``: the
    share of prompts whose rows of that component are all equal) and the share of positive / negative / zero
    advantages.

    >>> out = breakdown({"acc": torch.tensor([1.0, 0.0, 1.0, 1.0])}, torch.tensor([1.0, -1.0, 0.0, 0.0]), 2)
    >>> out["acc/mean"], out["acc/frac_zero_std"], out["advantage/frac_zero"]
    (0.75, 0.5, 0.5)
    """
    values: dict[str, float] = {}
    for name, component in components.items():
        v = component.detach().float().cpu()  # [N]
        values[f"{name}/mean"] = float(v.mean())
        values[f"{name}/std"] = float(v.std(correction=0))
        values[f"{name}/min"], values[f"{name}/max"] = float(v.min()), float(v.max())
        whole = len(v) - len(v) % rows_per_prompt
        if whole:
            values[f"{name}/frac_zero_std"] = float(zero_std_groups(v[:whole], rows_per_prompt).float().mean())
    if advantages is not None and len(advantages):
        a = advantages.detach().float().cpu()  # [N]
        values["advantage/frac_positive"] = float((a > 1e-6).float().mean())
        values["advantage/frac_negative"] = float((a < -1e-6).float().mean())
        values["advantage/frac_zero"] = float((a.abs() <= 1e-6).float().mean())
        values["advantage/abs_mean"] = float(a.abs().mean())
    return values


def failed_check_counts(pl_module: L.LightningModule) -> Counter:
    """``(task, check) -> count`` summed over the module's reward components that count failed checks."""
    rewards = getattr(pl_module, "rewards", None)
    counts: Counter = Counter()
    for component in getattr(rewards, "components", None) or []:
        counts.update(getattr(component, "failed_checks", None) or {})
    return counts


class RewardBreakdownLogger(L.Callback):
    """Log ``train/breakdown/<component>/{mean,std,min,max,frac_zero_std}``, ``train/breakdown/advantage/...`` and
    ``train/vbvr_failed/<task>/<check>`` (failed checks since the start of training) every ``every_n_steps`` steps, and
    a histogram per component (TensorBoard, W&B) every ``histogram_every_n_steps`` steps.

    The scalars go to the loggers directly (not through ``self.log``), so they do not crowd the progress bar;
    ``history`` keeps every logged step's (``step -> {key: value}``) for reports and notebooks.

    Args:
        every_n_steps: log the scalars on every optimizer step (``trainer.global_step``) that is a multiple of this,
            >= 1 (1: every step).
        histogram_every_n_steps: log the histograms on every optimizer step that is a multiple of this, >= 1; only
            steps that also log the scalars (a multiple of ``every_n_steps`` as well) draw them.
    """

    def __init__(self, every_n_steps: int = 1, histogram_every_n_steps: int = 10) -> None:
        if every_n_steps < 1 or histogram_every_n_steps < 1:
            raise ValueError(
                "every_n_steps and histogram_every_n_steps must be >= 1, got "
                f"{every_n_steps} and {histogram_every_n_steps}"
            )
        self.every_n_steps = every_n_steps
        self.histogram_every_n_steps = histogram_every_n_steps
        self.history: dict[int, dict[str, float]] = {}

    @staticmethod
    def _rows(outputs: dict[str, Any]) -> tuple[dict[str, Tensor], Tensor | None]:
        rewards = outputs.get("rewards")
        if rewards is not None:
            components = {"total": rewards.total, **rewards.components}
            return components, outputs.get("advantages")
        records = outputs.get("records") or []
        if not records:
            return {}, None
        components = {"total": torch.tensor([r.reward for r in records])}
        for name in records[0].components:
            components[name] = torch.tensor([r.components.get(name, float("nan")) for r in records])
        return components, torch.tensor([r.advantage for r in records])

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(outputs, dict):
            return
        step = trainer.global_step
        if step % self.every_n_steps or step in self.history:
            return
        components, advantages = self._rows(outputs)
        if not components:
            return
        values = {
            f"train/breakdown/{k}": v for k, v in breakdown(components, advantages, rows_per_prompt(outputs)).items()
        }
        for (task, check), count in sorted(failed_check_counts(pl_module).items()):
            values[f"train/vbvr_failed/{task}/{check}"] = float(count)
        self.history[step] = values
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=step)
            if step % self.histogram_every_n_steps == 0:
                self._histograms(trainer, components, step)

    @staticmethod
    def _histograms(trainer: L.Trainer, components: dict[str, Tensor], step: int) -> None:
        values = {f"train/reward_hist/{name}": v.detach().float().cpu() for name, v in components.items()}
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                for key, v in values.items():
                    logger.experiment.add_histogram(key, v, step)
            elif isinstance(logger, WandbLogger):
                import wandb

                # through log_metrics, which logs the step as ``trainer/global_step``: W&B drops a row passed
                # ``step=`` below its own counter, which every other log call of Lightning's logger advances
                logger.log_metrics({key: wandb.Histogram(v.numpy()) for key, v in values.items()}, step=step)

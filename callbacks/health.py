"""Training-health alarms: a clear warning, naming the step and the value, when GRPO training goes wrong.

Watched (from the step's logged metrics, ``trainer.callback_metrics``):

- a non-finite value in any ``train/`` metric (NaN or inf);
- reward collapse: ``train/frac_zero_std`` (groups whose K rewards are all equal, so no gradient) at or above
  ``max_frac_zero_std`` for ``patience`` steps in a row;
- KL blow-up: ``train/kl`` above ``max_kl``; clip blow-up: ``train/clip_fraction`` above ``max_clip_fraction``;
- completion-length collapse: ``train/completion_length`` below ``min_length_ratio`` times its largest value so far.

An alarm warns when a condition starts, not again while it lasts; every alarm is kept in ``alarms``.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


class TrainingHealthWarning(UserWarning):
    """Training went wrong in a way that the run survives but the user should look at."""


@dataclass(frozen=True)
class Alarm:
    """One alarm: what tripped, at which optimizer step, with which value."""

    step: int
    kind: str
    metric: str
    value: float
    message: str


class TrainingHealthMonitor(L.Callback):
    """Warn (``TrainingHealthWarning`` and a log line) when training health fails; see the module docstring.

    Args:
        max_kl: KL above this is a blow-up.
        max_clip_fraction: a clipped share of tokens above this is a blow-up.
        max_frac_zero_std: share of zero-spread groups that counts as collapsed.
        patience: consecutive collapsed steps before the reward-collapse alarm.
        min_length_ratio: completion length below this fraction of its maximum so far is a collapse.
        raise_on_nonfinite: raise instead of warning on a non-finite metric.
    """

    def __init__(
        self,
        max_kl: float = 1.0,
        max_clip_fraction: float = 0.5,
        max_frac_zero_std: float = 0.95,
        patience: int = 5,
        min_length_ratio: float = 0.25,
        raise_on_nonfinite: bool = False,
    ) -> None:
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        if not 0 < min_length_ratio < 1 or not 0 < max_frac_zero_std <= 1:
            raise ValueError(
                f"min_length_ratio must be in (0, 1) and max_frac_zero_std in (0, 1], got {min_length_ratio} and "
                f"{max_frac_zero_std}"
            )
        self.max_kl, self.max_clip_fraction = max_kl, max_clip_fraction
        self.max_frac_zero_std, self.patience = max_frac_zero_std, patience
        self.min_length_ratio, self.raise_on_nonfinite = min_length_ratio, raise_on_nonfinite
        self.alarms: list[Alarm] = []
        self._active: set[tuple[str, str]] = set()
        self._collapsed_steps = 0
        self._max_length = 0.0

    def check(self, step: int, metrics: dict[str, float]) -> list[Alarm]:
        """The alarms that start at ``step`` given the step's metrics (also recorded and warned)."""
        tripped: dict[tuple[str, str], tuple[float, str]] = {}
        for key, value in metrics.items():
            if key.startswith("train/") and not math.isfinite(value):
                tripped[("nonfinite", key)] = (value, f"{key} is {value}")
        zero = metrics.get("train/frac_zero_std")
        self._collapsed_steps = self._collapsed_steps + 1 if zero is not None and zero >= self.max_frac_zero_std else 0
        if self._collapsed_steps >= self.patience:
            tripped[("reward_collapse", "train/frac_zero_std")] = (
                zero,
                f"reward collapse: {zero:.0%} of groups have identical rewards (no learning signal) for "
                f"{self._collapsed_steps} steps; check the reward, the sampling temperature or the task difficulty",
            )
        for kind, key, limit in (
            ("kl_blowup", "train/kl", self.max_kl),
            ("clip_blowup", "train/clip_fraction", self.max_clip_fraction),
        ):
            value = metrics.get(key)
            if value is not None and math.isfinite(value) and value > limit:
                tripped[(kind, key)] = (value, f"{key} = {value:.4g} is above {limit:g}; lower the learning rate")
        length = metrics.get("train/completion_length")
        if length is not None and math.isfinite(length):
            if self._max_length > 0 and length < self.min_length_ratio * self._max_length:
                tripped[("length_collapse", "train/completion_length")] = (
                    length,
                    f"completion length collapsed to {length:.1f} tokens (max so far {self._max_length:.1f})",
                )
            self._max_length = max(self._max_length, length)
        new = [
            Alarm(step, kind, key, value, f"step {step}: {message}")
            for (kind, key), (value, message) in tripped.items()
            if (kind, key) not in self._active
        ]
        self._active = set(tripped)
        for alarm in new:
            self.alarms.append(alarm)
            if alarm.kind == "nonfinite" and self.raise_on_nonfinite:
                raise FloatingPointError(f"training health: {alarm.message}")
            log.warning("training health: %s", alarm.message)
            warnings.warn(f"training health: {alarm.message}", TrainingHealthWarning, stacklevel=2)
        return new

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        metrics = {
            k: float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith("train/") and isinstance(v, torch.Tensor) and v.numel() == 1
        }
        if isinstance(outputs, dict) and isinstance(outputs.get("loss"), torch.Tensor):
            metrics["train/loss"] = float(outputs["loss"])
        self.check(trainer.global_step, metrics)

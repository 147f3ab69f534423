"""Write the run's report (:mod:`app.run_report`) at the end of fit, validate and test: ``<log_dir>/report/report.md``
with held-out tables per data set and per task, and PNG plots of the training rewards and held-out metrics.

The callback records the ``train/`` scalars every ``every_n_steps`` steps and every evaluation's ``val/`` or ``test/``
metrics, for the life of the trainer: with ``validate_before_and_after: true`` the CLI's evaluation before fit, the
evaluations during fit and the one after it all land in the same report (rewritten after each), so it shows the
before/after comparison.
"""

from __future__ import annotations

import os

import lightning as L
import torch

from app.run_report import RunHistory, write_report


def _scalars(trainer: L.Trainer, prefix: str) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in trainer.callback_metrics.items()
        if k.startswith(prefix) and isinstance(v, torch.Tensor) and v.numel() == 1
    }


class ReportWriter(L.Callback):
    """Collect metrics during the run and write ``report.md`` + plots when fit, validate or test ends.

    Args:
        every_n_steps: record the training scalars every this many optimizer steps.
        dirname: folder under the trainer's log directory.
        title: heading of the report (default: the module's class name).
    """

    def __init__(self, every_n_steps: int = 1, dirname: str = "report", title: str | None = None) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps, self.dirname, self.title = every_n_steps, dirname, title
        self.history = RunHistory()
        self._dirpath: str | None = None

    artefact_name = "report"
    """How the end-of-run summary of ``python -m app`` names :attr:`path`."""

    @property
    def path(self) -> str | None:
        """``report.md``, once the trainer has set the callback up."""
        return None if self._dirpath is None else os.path.join(self._dirpath, "report.md")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._dirpath = os.path.join(trainer.log_dir or trainer.default_root_dir, self.dirname)  # every rank
        self.history.title = self.title or f"{type(pl_module).__name__} report"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every_n_steps == 0:
            self.history.add_train(step, _scalars(trainer, "train/"))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.history.add_evaluation("val", trainer.global_step, _scalars(trainer, "val/"))
        if trainer.state.fn != "fit":  # a `validate` run; during fit, the report is written at its end
            self._write(trainer, pl_module)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.history.add_evaluation("test", trainer.global_step, _scalars(trainer, "test/"))
        self._write(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, pl_module)

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the evaluation mixins name the evaluation sets they have seen (app.data.eval_sets)
        self.history.eval_sets = list(getattr(pl_module, "eval_set_names", None) or self.history.eval_sets)
        if trainer.is_global_zero and self._dirpath is not None:
            write_report(self.history, self._dirpath)

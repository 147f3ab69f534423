"""Log a table of sampled completions with their rewards, to a CSV file and to TensorBoard.

The training module returns ``{"loss": ..., "records": list[CompletionRecord]}`` from ``training_step``; every
``every_n_steps`` optimizer steps this callback keeps the first ``max_rows`` records. Completions are untrusted text:
the CSV is written by the ``csv`` module (quoted, never interpreted) and the Markdown table escapes ``|``, HTML and line
breaks.
"""

from __future__ import annotations

import csv
import html
import os
import warnings
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from app.types import CompletionRecord

BASE_COLUMNS = ("step", "task", "question", "completion", "answer", "reward", "advantage")
COMPONENT_PREFIX = "reward/"


def record_to_row(record: CompletionRecord) -> dict[str, Any]:
    """One CSV row: the base columns, then ``reward/<name>`` per component; a missing answer is an empty cell."""
    row = {
        "step": record.step,
        "task": record.task,
        "question": record.question,
        "completion": record.completion,
        "answer": "" if record.answer is None else record.answer,
        "reward": float(record.reward),
        "advantage": float(record.advantage),
    }
    row.update({f"{COMPONENT_PREFIX}{name}": float(value) for name, value in record.components.items()})
    return row


def markdown_cell(value: Any) -> str:
    """Text that stays inside one Markdown table cell and renders literally (no HTML, no row breaks)."""
    if isinstance(value, float):
        return f"{value:.3f}"
    text = html.escape(str(value), quote=False).replace("\\", "\\\\").replace("|", "\\|")
    return text.replace("\r\n", "<br>").replace("\n", "<br>").replace("\r", "<br>")


def records_to_markdown(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A Markdown table of ``rows`` restricted to ``columns``."""
    lines = ["| " + " | ".join(markdown_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(markdown_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


class CompletionTableLogger(L.Callback):
    """Append sampled completions to ``<log_dir>/<filename>`` and to TensorBoard's text tab.

    The CSV columns are fixed by the first write (or by the header of an existing file, when a run resumes into the same
    directory): ``step, task, question, completion, answer, reward, advantage`` and one ``reward/<name>`` column per
    reward component. Components that appear later are dropped with one warning; missing ones are left empty.

    Args:
        every_n_steps: log when ``trainer.global_step`` is a multiple of this (at most once per global step).
        max_rows: the first ``max_rows`` records of a batch are logged.
        filename: name of the CSV file inside the trainer's log directory.
    """

    def __init__(self, every_n_steps: int = 10, max_rows: int = 16, filename: str = "completions.csv") -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.every_n_steps = every_n_steps
        self.max_rows = max_rows
        self.filename = filename
        self._dirpath: str | None = None
        self._columns: list[str] | None = None
        self._last_logged_step: int | None = None
        self._warned_extra = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # ``trainer.log_dir`` broadcasts from rank 0, so every rank must read it; here, not in a rank-0-only branch.
        self._dirpath = trainer.log_dir or trainer.default_root_dir

    @property
    def path(self) -> str | None:
        """The CSV file, once the trainer has set the callback up."""
        return None if self._dirpath is None else os.path.join(self._dirpath, self.filename)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero or not isinstance(outputs, dict) or not outputs.get("records"):
            return
        step = trainer.global_step
        if step % self.every_n_steps != 0 or step == self._last_logged_step:
            return
        self._last_logged_step = step
        rows = [record_to_row(r) for r in outputs["records"][: self.max_rows]]
        columns = self._write_csv(rows, self._dirpath or trainer.default_root_dir)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("completions", records_to_markdown(rows, columns), step)

    def _write_csv(self, rows: list[dict[str, Any]], dirpath: str) -> list[str]:
        path = os.path.join(dirpath, self.filename)
        os.makedirs(dirpath, exist_ok=True)
        is_new = not os.path.exists(path) or os.path.getsize(path) == 0
        if self._columns is None:
            self._columns = self._initial_columns(rows) if is_new else self._read_header(path)
        extra = sorted({key for row in rows for key in row} - set(self._columns))
        if extra and not self._warned_extra:
            warnings.warn(
                f"{type(self).__name__}: columns {extra} are not in the header of {path} and are dropped",
                stacklevel=2,
            )
            self._warned_extra = True
        with open(path, "a", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=self._columns, extrasaction="ignore", restval="")
            if is_new:
                writer.writeheader()
            writer.writerows(rows)
        return self._columns

    @staticmethod
    def _initial_columns(rows: list[dict[str, Any]]) -> list[str]:
        components = {key: None for row in rows for key in row if key.startswith(COMPONENT_PREFIX)}
        return [*BASE_COLUMNS, *components]

    @staticmethod
    def _read_header(path: str) -> list[str]:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f))

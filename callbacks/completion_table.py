"""Log a table of sampled completions with their rewards, to a CSV file and to the loggers, with the prompt's image.

The training module returns ``{"loss": ..., "records": list[CompletionRecord]}`` from ``training_step``; every
``every_n_steps`` optimizer steps this callback keeps the first ``max_rows`` records. Completions are untrusted text:
the CSV is written by the ``csv`` module (quoted, never interpreted) and the Markdown table escapes ``|``, HTML and line
breaks.

Beside each completion the loggers get the prompt's first image as a thumbnail: TensorBoard as a rendered table image
(``completions/table``, next to the Markdown text), Weights & Biases and MLflow as a table with an image column, when
their loggers are configured (:mod:`callbacks.media`).
"""

from __future__ import annotations

import csv
import html
import os
import warnings
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image

from app.types import CompletionRecord
from callbacks.media import log_table, text_cell, tile
from callbacks.step_outputs import rows_per_prompt

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


def render_table(rows: list[dict[str, Any]], thumbnails: list[Image.Image | None], size: int) -> Image.Image:
    """A picture of the table for loggers without a table type: per row the thumbnail, the question and completion,
    and the reward / advantage."""
    lines = []
    for row, thumb in zip(rows, thumbnails, strict=True):
        cell = Image.new("RGB", (size, size), (255, 255, 255))
        if thumb is not None:
            cell.paste(thumb, (0, 0))
        text = f"Q: {row['question']}  ->  {row['completion']}  (answer: {row['answer']})"
        score = f"step {row['step']}  reward {row['reward']:.3f}  adv {row['advantage']:+.3f}"
        lines.append([cell, text_cell(text, 6 * size, size), text_cell(score, 2 * size, size)])
    return tile(lines)


class CompletionTableLogger(L.Callback):
    """Append sampled completions to ``<log_dir>/<filename>`` and to TensorBoard's text tab.

    The CSV columns are fixed by the first write (or by the header of an existing file, when a run resumes into the same
    directory): ``step, task, question, completion, answer, reward, advantage`` and one ``reward/<name>`` column per
    reward component. Components that appear later are dropped with one warning; missing ones are left empty.

    Args:
        every_n_steps: log when ``trainer.global_step`` is a multiple of this (at most once per global step).
        max_rows: the first ``max_rows`` records of a batch are logged.
        filename: name of the CSV file inside the trainer's log directory.
        thumbnail_size: side in pixels of the prompt image beside each completion in the loggers' tables; None: text
            only.
    """

    def __init__(
        self,
        every_n_steps: int = 10,
        max_rows: int = 16,
        filename: str = "completions.csv",
        thumbnail_size: int | None = 64,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.every_n_steps = every_n_steps
        self.max_rows = max_rows
        self.filename = filename
        if thumbnail_size is not None and thumbnail_size < 8:
            raise ValueError(f"thumbnail_size must be >= 8 or null, got {thumbnail_size}")
        self.thumbnail_size = thumbnail_size
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
        thumbnails = self._thumbnails(outputs["records"][: self.max_rows], batch, rows_per_prompt(outputs))
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("completions", records_to_markdown(rows, columns), step)
                if any(t is not None for t in thumbnails):
                    image = render_table(rows, thumbnails, self.thumbnail_size)
                    logger.experiment.add_image("completions/table", np.asarray(image), step, dataformats="HWC")
        table_columns = ["image", *columns] if self.thumbnail_size else columns
        table_rows = [
            [t, *(row.get(c, "") for c in columns)] if self.thumbnail_size else [row.get(c, "") for c in columns]
            for row, t in zip(rows, thumbnails, strict=True)
        ]
        log_table(trainer, "completions", table_columns, table_rows, step, image_column="image")

    def _thumbnails(
        self, records: list[CompletionRecord], batch: Any, rows_per_prompt: int
    ) -> list[Image.Image | None]:
        """The first image of each record's prompt (row ``i`` is prompt ``i // rows_per_prompt`` of the batch)."""
        samples = list(batch) if isinstance(batch, (list, tuple)) else []
        out: list[Image.Image | None] = []
        for i in range(len(records)):
            b = i // max(1, int(rows_per_prompt))
            images = getattr(samples[b], "images", None) if b < len(samples) else None
            if not self.thumbnail_size or not images:
                out.append(None)
                continue
            thumb = images[0].convert("RGB")
            thumb.thumbnail((self.thumbnail_size, self.thumbnail_size))
            out.append(thumb)
        return out

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

"""Your own data: the good rows of a JSON, JSONL, parquet, CSV or text file (or a saved ``datasets`` table) as a data
set (:class:`FileDataset`), and samples written back as such a file (:func:`write_folder`).

The file is read with the ``datasets`` library (local files only; the rows land in its memory-mapped Arrow cache, so a
file larger than memory is never held in it); each row becomes a sample through :class:`~app.data.rows.RowReader`
(which fields, image and video rules, bad rows).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from torch.utils.data import Dataset

from app.data.rows import BadRow, Item, RowCheck, RowReader
from app.data.tables import TableRows, load_table
from app.types import VisualSample

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------ data set
def _held_out(index: int, seed: int, fraction: float) -> bool:
    """Whether row ``index`` is in the held-out part: a fixed pseudo-random draw per (seed, row)."""
    return random.Random(f"holdout:{seed}:{index}").random() < fraction


class FileDataset(Dataset):
    """The good rows of a data file as ``VisualSample`` (or as ``(x, x')`` pairs, under a ``twin`` layout); a data
    set factory of :class:`~app.data.VisualTaskDataModule` (``dataset`` for training, ``eval_dataset`` for validation
    and test).

    Every row is checked when the data set is built (fields, image headers, size limits, duplicate keys), so a bad
    row stops the run before training starts; images are decoded when a sample is read. In a config::

        data:
          class_path: app.data.VisualTaskDataModule
          init_args:
            dataset:
              class_path: app.data.files.FileDataset
              init_args: {path: data/train.jsonl, rows: {preset: easyr1}}
            eval_dataset:
              class_path: app.data.files.FileDataset
              init_args: {path: data/val.jsonl, rows: {preset: easyr1}}

    Args:
        num_samples: serve at most this many rows (the first good ones in file order); a file with fewer serves all
            of them (logged).
        seed: unused (the rows are the file's; the data module shuffles the training order with its own seed).
        image_size: unused (images keep their size; the policy's processor resizes them).
        path: the data file (``.json``, ``.jsonl``, ``.parquet``, ``.csv``, ``.txt``) or a saved ``datasets`` folder.
        rows: how rows become samples (fields, image folder, limits, ``on_bad_row``); None: ``RowReader()``.
        holdout_fraction: the fraction of rows held out (a fixed draw per row from ``holdout_seed``); 0: none.
        part: ``train``: the rows not held out; ``holdout``: the held-out rows (use the same ``path``, fraction and
            seed for both parts, so they are disjoint).
        holdout_seed: seed of the held-out draw.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int,
        path: str,
        rows: RowReader | None = None,
        holdout_fraction: float = 0.0,
        part: Literal["train", "holdout"] = "train",
        holdout_seed: int = 0,
    ) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if not 0.0 <= holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
        if part not in ("train", "holdout"):
            raise ValueError(f"part must be 'train' or 'holdout', got {part!r}")
        self.path, self.reader = str(path), rows or RowReader()
        self.rows = TableRows(load_table(path))
        wanted = [
            i
            for i in range(len(self.rows))
            if not holdout_fraction or _held_out(i, holdout_seed, holdout_fraction) == (part == "holdout")
        ]
        self.check = RowCheck(self.reader, self.path)
        self.indices: list[int] = []
        for index, row in self.rows.iter(wanted):
            if len(self.indices) == num_samples:
                break
            if self.check(row, index, decode=False) is not None:
                self.indices.append(index)
        self.check.finish()
        if len(self.indices) < num_samples:
            log.info(
                "%s (%s): %d rows, fewer than the %d asked for; serving all", self.path, part, len(self), num_samples
            )

    @property
    def bad_rows(self) -> list[BadRow]:
        """The rows skipped under ``on_bad_row="skip"``."""
        return self.check.bad_rows

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Item:
        row_index = self.indices[index]
        return self.reader.sample(self.rows[row_index], row_index, self.path)


def write_folder(samples: Iterable[VisualSample], out_dir: str | Path, name: str) -> Path:
    """Write ``samples`` as ``{out_dir}/{name}.jsonl`` with their images as PNGs under ``{out_dir}/images/``: the
    layout :class:`FileDataset` reads with the default fields (``question``, ``answer``, ``reasoning``, ``task``,
    ``images`` as paths relative to ``out_dir``; ``meta`` is not written). Returns the JSONL's path."""
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.jsonl"
    with open(path, "w") as file:
        for i, sample in enumerate(samples):
            images = [f"images/{name}-{i:06d}-{k}.png" for k in range(len(sample.images))]
            for image, image_path in zip(sample.images, images, strict=True):
                image.save(out_dir / image_path)
            row = {"question": sample.question, "answer": sample.answer, "reasoning": sample.reasoning}
            row = {k: v for k, v in row.items() if v is not None} | {"task": sample.task, "images": images}
            file.write(json.dumps(row) + "\n")
    return path

"""VBVR evaluation: held-out scores per split, task and regime, tables of them, and problem | before | after grids.

:class:`VBVRScores` scores a flow policy's evaluation samples in VBVR-Pro's regimes (:mod:`app.tasks.vbvr.regimes`)
and logs ``<stage>/<split>/<task>/<regime>`` and ``<stage>/failed/<split>/<task>/<check>``.

:class:`VBVRTablePrinter` prints, after every validation, one table per split: a row per task, a column per regime
(Last-Frame, Key-Frame, Multi-Frame), from the ``val/<split>/<task>/<regime>`` metrics of :class:`VBVRScores`, and the
checks each task fails most.

:class:`VBVRGridWriter` draws a conditioned flow policy's evaluation samples, one PNG per task and split.

The first validation (``validate_before_and_after`` runs one before fit) gives the "before" column, the latest one the
"after" column; rows are the first ``rows_per_task`` evaluation samples of each task (in-domain first). A video
sample shows its last frame. The evaluation steps of :class:`app.modules.flow_evaluation.FlowEvaluation` return the
samples as ``outputs["images"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lightning as L
from PIL import Image
from torch import Tensor

from app.modules.grouped_means import GroupedMeans
from app.tasks.vbvr.regimes import score_regimes
from app.types import VisualSample
from callbacks.media import captioned, tile, to_pil

REGIMES = ("last_frame", "key_frame", "multi_frame")


def vbvr_scores(renderings: Sequence[Tensor], samples: Sequence[VisualSample], stage: str) -> list[tuple[str, float]]:
    """``(key, value)`` per VBVR sample (``meta["vbvr"]``; others are skipped) and regime, ``<stage>/<split>/<task>/
    <regime>`` (the scorer's score, 0 where it cannot measure), and per Last-Frame check,
    ``<stage>/failed/<split>/<task>/<check>`` (1 when failed). The split is ``meta["split"]``, ``in_domain`` when
    absent. An unmeasurable Last-Frame rendering scores 0 and has no checks."""
    values = []
    for rendering, sample in zip(renderings, samples, strict=True):
        spec = sample.meta.get("vbvr")
        if not spec:
            continue
        group = f"{sample.meta.get('split', 'in_domain')}/{spec['task']}"
        results = score_regimes(rendering, spec)
        values += [(f"{stage}/{group}/{regime}", result.score if result else 0.0) for regime, result in results.items()]
        checks = results["last_frame"].checks if results["last_frame"] else ()
        values += [(f"{stage}/failed/{group}/{check.name}", float(not check.passed)) for check in checks]
    return values


class VBVRScores(L.Callback):
    """Log the VBVR scores (:func:`vbvr_scores`) of every validation and test epoch's samples, means over every
    process's samples, at the epoch's end.

    The evaluation steps of :class:`app.modules.flow_evaluation.FlowEvaluation` return the samples as
    ``outputs["images"]``. The means are kept per key over the epoch and merged across processes once
    (:class:`~app.modules.grouped_means.GroupedMeans`): a process's share of the set need not hold every split and
    task, so the keys cannot be reduced one by one as they are logged.
    """

    def __init__(self) -> None:
        self._means = GroupedMeans()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._score(outputs, batch, "val")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._score(outputs, batch, "test")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_means(pl_module)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_means(pl_module)

    def _score(self, outputs, batch: list[VisualSample], stage: str) -> None:
        if isinstance(outputs, dict) and "images" in outputs:
            for key, value in vbvr_scores(outputs["images"], batch, stage):
                self._means.update(key, [value])

    def _log_means(self, pl_module: L.LightningModule) -> None:
        # every process calls compute (a collective), whatever keys it holds, and then logs the same keys
        means = self._means.compute()
        self._means.reset()
        for key, mean in means.items():
            pl_module.log(key, mean, sync_dist=True)


def vbvr_tables(metrics: dict[str, float], stage: str = "val") -> str:
    """The ``<stage>/<split>/<task>/<regime>`` scores as one text table per split (``-`` where a regime was not
    scored), each task followed by its most failed checks (``<stage>/failed/<split>/<task>/<check>`` fractions)."""
    scores: dict[str, dict[str, dict[str, float]]] = {}
    failed: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == stage and parts[3] in REGIMES:
            scores.setdefault(parts[1], {}).setdefault(parts[2], {})[parts[3]] = float(value)
        elif len(parts) == 5 and parts[:2] == [stage, "failed"]:
            failed.setdefault((parts[2], parts[3]), []).append((float(value), parts[4]))
    lines = []
    for split in sorted(scores):
        lines += ["", f"{split:<24}" + "".join(f"{r:>13}" for r in REGIMES)]
        for task, row in sorted(scores[split].items()):
            cells = "".join(f"{row[r]:>13.3f}" if r in row else f"{'-':>13}" for r in REGIMES)
            worst = sorted(failed.get((split, task), []), reverse=True)[:3]
            note = ", ".join(f"{name} {fraction:.0%}" for fraction, name in worst if fraction > 0)
            lines.append(f"{task:<24}{cells}" + (f"   failed: {note}" if note else ""))
    return "\n".join(lines)


class VBVRTablePrinter(L.Callback):
    """Print :func:`vbvr_tables` of the logged metrics after every validation (global rank 0)."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # (on_validation_end: the epoch's aggregated metrics reach callback_metrics after the epoch-end hooks)
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        text = vbvr_tables(metrics)
        if text:
            print(f"\nVBVR held-out scores (step {trainer.global_step}):{text}\n", flush=True)


class VBVRGridWriter(L.Callback):
    """Write ``<output_dir>/<task>-<split>.png`` after every validation: problem | first validation | latest validation
    (the split is the sample's ``meta["split"]``, ``in_domain`` when it has none).

    Args:
        output_dir: folder of the grids.
        rows_per_task: evaluation samples per task drawn (one row each).
        cell_size: side of each image in pixels.
    """

    def __init__(self, output_dir: str, rows_per_task: int = 4, cell_size: int = 96) -> None:
        if rows_per_task < 1 or cell_size < 16:
            raise ValueError(
                f"VBVRGridWriter needs rows_per_task >= 1 and cell_size >= 16, got {rows_per_task}, {cell_size}"
            )
        self.output_dir, self.rows_per_task, self.cell_size = Path(output_dir), rows_per_task, cell_size
        self._problems: dict[str, list[Image.Image]] = {}
        self._before: dict[str, list[Image.Image]] | None = None
        self._current: dict[str, list[Image.Image]] = {}
        self.written: list[Path] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._current = {}

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not isinstance(outputs, dict) or "images" not in outputs:
            return
        for sample, image in zip(batch, outputs["images"], strict=True):
            if not sample.images:
                continue
            key = f"{sample.task}-{sample.meta.get('split', 'in_domain')}"
            rows = self._current.setdefault(key, [])
            if len(rows) < self.rows_per_task:
                rows.append(to_pil(image[-1] if image.ndim == 4 else image))
                if len(self._problems.setdefault(key, [])) < len(rows):
                    self._problems[key].append(sample.images[0].convert("RGB"))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._current or not trainer.is_global_zero:
            return
        if self._before is None:
            self._before = self._current
        self.output_dir.mkdir(parents=True, exist_ok=True)
        size = self.cell_size
        for key, after in self._current.items():
            before = self._before.get(key, after)
            rows = [
                [captioned(problem, "problem", size), captioned(b, "before", size), captioned(a, "after", size)]
                for problem, b, a in zip(self._problems[key], before, after, strict=False)
            ]
            path = self.output_dir / f"{key}.png"
            tile(rows).save(path)
            if path not in self.written:
                self.written.append(path)

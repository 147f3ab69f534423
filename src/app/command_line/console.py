"""What ``python -m app`` prints: known third-party noise filtered out (by message, never wholesale), a progress bar
that counts optimizer steps, and the closing list of where a run's artefacts are."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # lightning's _pytree still subclasses torch's deprecated LeafSpec (torch >= 2.10); nothing for us to change
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    # peft reads the deprecated `is_gradient_checkpointing` alias of transformers 5 models when it wraps them
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
    # counts the frozen VAE / encoders / reference kept in eval mode on purpose; PolicyModule.on_train_start warns
    # about the modules that matter (trainable parameters in eval mode)
    (UserWarning, r"Found \d+ module\(s\) in eval mode at the start of training"),
)
"""(category, message regex) of warnings the libraries raise on every run and that no user action can fix."""

TIP_PREFIX = "💡 Tip:"
"""Lightning's advertisements for its cloud services (litlogger, litmodels), logged at INFO on every fit."""

_RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TIP_PREFIX)


_DROP_TIPS = _DropTips()


def quiet_known_noise() -> None:
    """Filter the warnings of :data:`KNOWN_WARNINGS` and Lightning's cloud tips, and turn off transformers' per-shard
    progress bars; every other warning and log line is still shown."""
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # per-shard bars when a model is written or read (one shard here)
    for name in _RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if _DROP_TIPS not in logger.filters:
            logger.addFilter(_DROP_TIPS)


def step_progress_bar() -> L.Callback | None:
    """Lightning's rich progress bar, counting optimizer steps of ``max_steps`` when training is bounded by steps;
    None when rich is not installed (Lightning's default bar is used then)."""
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

    if not _RICH_AVAILABLE:
        return None
    from lightning.pytorch.callbacks import RichProgressBar

    class StepProgressBar(RichProgressBar):
        """``Training 250/300`` over the whole run instead of ``Epoch 2/-2`` and a bar per pass over the data, when
        ``max_steps`` ends training (``max_epochs`` unset or -1); Lightning's bar otherwise."""

        def _by_steps(self) -> bool:
            trainer = self.trainer
            return trainer.max_steps > 0 and (trainer.max_epochs is None or trainer.max_epochs < 0)

        @property
        def total_train_batches(self) -> int | float:
            return self.trainer.max_steps if self._by_steps() else super().total_train_batches

        def _get_train_description(self, current_epoch: int) -> str:
            if not self._by_steps():
                return super()._get_train_description(current_epoch)
            return f"{'Training':{len(self.validation_description)}}"

        def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if self._by_steps() and self.train_progress_bar_id is not None:
                return  # one bar for the whole run: no reset at a new pass over the data
            super().on_train_epoch_start(trainer, pl_module)
            if self._by_steps():
                self._update(self.train_progress_bar_id, trainer.global_step)  # a resumed run starts at its step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
            if not self._by_steps():
                return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            if not self.is_disabled and self.train_progress_bar_id is None:
                self._initialize_train_progress_bar_id()
            self._update(self.train_progress_bar_id, trainer.global_step)
            self._update_metrics(trainer, pl_module)
            self.refresh()

    return StepProgressBar()


def _shown(path: str | os.PathLike) -> str:
    """A path relative to the working directory when it lies under it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _newest(folder: Path, pattern: str = "*.ckpt") -> Path | None:
    files = sorted(folder.rglob(pattern), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return files[-1] if files else None


def artefacts(trainer: L.Trainer, extra: Iterable[tuple[str, str | os.PathLike | None]] = ()) -> list[tuple[str, str]]:
    """``(what, path)`` of every artefact of a run that exists on disk: checkpoints, an exported policy, files of
    callbacks that name theirs in a ``path`` attribute (the report, sample grids, the completions CSV; shown as their
    ``artefact_name`` or the file's stem), the loggers' folders, the saved config, and ``extra``."""
    from app.export import ExportPolicy

    found: list[tuple[str, Path]] = []
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            newest = _newest(Path(callback.dirpath))
            if newest is not None:
                found.append(("newest checkpoint", newest))
        elif isinstance(callback, ExportPolicy):
            found.append(("exported policy", Path(callback.output_dir)))
        elif isinstance(getattr(callback, "path", None), (str, os.PathLike)):
            found.append((getattr(callback, "artefact_name", None) or Path(callback.path).stem, Path(callback.path)))
    found += [(what, Path(path)) for what, path in extra if path]
    for logger in trainer.loggers:
        if logger.log_dir:
            kind = "TensorBoard logs" if isinstance(logger, TensorBoardLogger) else f"{type(logger).__name__} logs"
            found.append((kind, Path(logger.log_dir)))
    if trainer.log_dir:
        found.append(("config", Path(trainer.log_dir) / "config.yaml"))
    return [(what, _shown(path)) for what, path in dict.fromkeys(found) if path.exists()]


def artefact_summary(trainer: L.Trainer, extra: Iterable[tuple[str, str | os.PathLike | None]] = ()) -> str:
    """The closing lines of a run: where its artefacts are."""
    rows = artefacts(trainer, extra)
    if not rows:
        return "Artefacts: none written (no logger, checkpoint or export configured)."
    width = max(len(what) for what, _ in rows)
    lines = ["Artefacts:"] + [f"  {what:<{width}}  {path}" for what, path in rows]
    for what, path in rows:
        if what == "TensorBoard logs":
            lines.append(f"  (view: tensorboard --logdir {path})")
            break
    return "\n".join(lines)

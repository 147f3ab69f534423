"""Losing nothing when a run is stopped: atomic checkpoint files and a checkpoint on preemption signals.

- :class:`AtomicCheckpointIO` writes every checkpoint to a temporary file beside its destination, flushes it to disk and
  renames it into place, so a run killed mid-save leaves the previous file (or none), never a truncated one.
- :func:`check_writable` fails a run at start-up when an output folder cannot be written (not after training).
- :class:`PreemptionCheckpoint` saves a resumable checkpoint when the run receives SIGTERM (what schedulers send before
  preemption) or SIGUSR1, then exits with ``128 + signal`` so the scheduler can tell the run from a finished one.
  Lightning notices SIGTERM itself and stops after the current batch; SIGUSR1 is handled here the same way. Resume with
  ``python -m app fit --config X.yaml --ckpt_path <dir>/preempted.ckpt``.

:class:`app.cli.AppCLI` installs both by default.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.errors import ConfigError

log = logging.getLogger(__name__)

PREEMPTED_FILENAME = "preempted.ckpt"


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file in ``path``'s folder, fsync, then rename over ``path`` (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself reaches the disk
    finally:
        os.close(directory)


def check_writable(folder: str | Path, what: str) -> None:
    """Create ``folder`` if needed and write a probe file in it; a :class:`~app.errors.ConfigError` naming ``what``
    otherwise (``python -m app`` prints it in one line), so a run fails before training, not after it."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError as error:
        raise ConfigError(
            f"{what} {str(folder)!r} is not writable ({error.strerror or error}); choose another folder"
        ) from None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``torch.save`` checkpoint IO, written atomically on the destination's own filesystem."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if not _is_local_file_protocol(path):  # object stores write whole objects: Lightning's own writer
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        atomic_torch_save(checkpoint, path)


class PreemptionRequested(SIGTERMException):
    """Raised after a training batch when SIGUSR1 arrived (Lightning raises its base class for SIGTERM)."""


class PreemptionCheckpoint(Callback):
    """Save ``<dirpath>/preempted.ckpt`` when SIGTERM or SIGUSR1 stops a fit, and exit with ``128 + signal``.

    Args:
        dirpath: folder of the checkpoint; default: ``<trainer.default_root_dir>/checkpoints``.
    """

    def __init__(self, dirpath: str | Path | None = None) -> None:
        self.dirpath = str(dirpath) if dirpath is not None else None  # a local folder or an fsspec URL
        self._requested: int | None = None
        self._previous_handler: Any = None

    def checkpoint_path(self, trainer: L.Trainer) -> str:
        folder = self.dirpath if self.dirpath is not None else f"{trainer.default_root_dir}/checkpoints"
        return f"{folder}/{PREEMPTED_FILENAME}"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        path = self.checkpoint_path(trainer)
        if stage == "fit" and trainer.is_global_zero and _is_local_file_protocol(path):
            check_writable(Path(path).parent, "the checkpoint folder")
        if stage != "fit" or not hasattr(signal, "SIGUSR1"):
            return
        try:
            self._previous_handler = signal.signal(signal.SIGUSR1, self._on_sigusr1)
        except ValueError:  # not the main thread: leave the signal to whoever owns it
            self._previous_handler = None

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGUSR1, self._previous_handler)
            self._previous_handler = None

    def _on_sigusr1(self, signum: int, frame: Any) -> None:
        self._requested = signum

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self._requested is not None:
            raise PreemptionRequested(128 + self._requested)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        if exception.code is None:  # Lightning's SIGTERMException carries no code: it would exit 0
            exception.code = 128 + signal.SIGTERM
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        if trainer.is_global_zero:
            log.warning(
                "stopped by a signal at step %d; saved %s (resume with --ckpt_path %s); exiting with code %s",
                trainer.global_step,
                path,
                path,
                exception.code,
            )

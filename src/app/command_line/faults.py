"""Losing nothing when a run is stopped: atomic checkpoint files and a checkpoint on preemption signals.

- :class:`AtomicCheckpointIO` writes every checkpoint to a temporary file beside its destination, flushes it to disk and
  renames it into place, so a run killed mid-save leaves the previous file (or none), never a truncated one.
  A save killed anyway leaves its hidden temporary file (``.<name>.ckpt.XXXXXXXX.tmp``): the next run that starts in,
  or saves into, that folder removes it (:func:`remove_stale_temp_files`, with a warning listing them). Checkpoint
  files get the permissions the umask gives any new file (0644 under umask 022), so a group can share them.
- :func:`check_writable` fails a run at start-up when an output folder cannot be written (not after training).
- :class:`CheckpointConnector` (the trainer's, in :class:`~app.command_line.commands.AppCLI`) turns a checkpoint that
  cannot be read (truncated, not a checkpoint) or that does not fit the model (another model's) into a
  :class:`~app.errors.ConfigError` naming the file; :func:`load_checkpoint_file` does the same for a plain read.
- :class:`PreemptionCheckpoint` saves a resumable checkpoint when the run receives SIGTERM (what schedulers send before
  preemption) or SIGUSR1, then exits with ``128 + signal`` so the scheduler can tell the run from a finished one.
  Lightning notices SIGTERM itself and stops after the current batch; SIGUSR1 is handled here the same way. Resume with
  ``python -m app fit --config X.yaml --ckpt_path <dir>/preempted.ckpt``.

:class:`app.command_line.commands.AppCLI` installs the checkpoint IO, the connector and the callback by default, and
probes the output folders (:func:`check_writable`) before the first step.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector
from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.errors import ConfigError

log = logging.getLogger(__name__)

PREEMPTED_FILENAME = "preempted.ckpt"
TEMP_FILE = re.compile(r"^\..+\.ckpt\.[A-Za-z0-9_]{8}\.tmp$")
"""The name of the temporary file :func:`atomic_torch_save` writes a checkpoint to (``.last.ckpt.k3j9x_2a.tmp``)."""


def _process_start_time() -> float:
    """When this process started (``/proc/self/stat``), else now: the time this module was first imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rpartition(")")[2].split()[19])  # field 22, starttime, in clock ticks after boot
        with open("/proc/uptime", encoding="ascii") as uptime:
            booted = time.time() - float(uptime.read().split()[0])
        return booted + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


PROCESS_STARTED = _process_start_time()


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file in ``path``'s folder, fsync, then rename over ``path`` (atomic on POSIX).

    The file gets the mode the umask gives a new file (``mkstemp`` alone would leave it 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(handle, 0o666 & ~_umask())
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


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Remove the temporary files of interrupted saves (:data:`TEMP_FILE`) in ``folder`` that were last written before
    this process started (a save running now, in another process, keeps its own), with a warning that lists them;
    those that cannot be removed are listed in a warning too. Returns the removed files."""
    folder = Path(folder)
    try:
        candidates = [p for p in folder.iterdir() if TEMP_FILE.match(p.name)]
    except OSError:  # no such folder yet, or not readable: nothing to clean
        return []
    removed, kept = [], []
    for path in sorted(candidates):
        try:
            if path.stat().st_mtime >= PROCESS_STARTED:
                continue
            path.unlink()
            removed.append(path)
        except FileNotFoundError:  # another rank or process removed it meanwhile
            continue
        except OSError:
            kept.append(path)
    if removed:
        log.warning(
            "removed %d temporary file(s) left in %s by an interrupted checkpoint save: %s",
            len(removed),
            folder,
            ", ".join(p.name for p in removed),
        )
    if kept:
        log.warning(
            "%d temporary file(s) of an interrupted checkpoint save in %s cannot be removed; delete them: %s",
            len(kept),
            folder,
            ", ".join(p.name for p in kept),
        )
    return removed


def _unwritable_reason(folder: Path, error: OSError) -> str:
    if error.errno in (errno.ENOTDIR, errno.EEXIST):  # the folder, or a folder above it, is a file
        for parent in (folder, *folder.parents):
            if parent.exists() and not parent.is_dir():
                return f"{str(parent)!r} is a file"
    return error.strerror or str(error)


def check_writable(folder: str | Path, what: str, create: bool = True) -> None:
    """Create ``folder`` if needed and write a probe file in it; a :class:`~app.errors.ConfigError` naming ``what``
    otherwise (``python -m app`` prints it in one line), so a run fails before training, not after it. With
    ``create=False`` a folder that does not exist yet is left uncreated: the probe goes into the nearest folder above
    it that exists (where it will be created)."""
    folder = Path(folder)
    try:
        if folder.exists() and not folder.is_dir():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(folder))
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        target = next((p for p in (folder, *folder.parents) if p.exists()), Path.cwd())
        if not target.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target))
        with tempfile.NamedTemporaryFile(dir=target, prefix=".write-probe-"):
            pass
    except OSError as error:
        raise ConfigError(
            f"{what} {str(folder)!r} is not writable ({_unwritable_reason(folder, error)}); choose another folder"
        ) from None


def prepare_checkpoint_folder(folder: str | Path, what: str) -> None:
    """:func:`check_writable`, then :func:`remove_stale_temp_files`: what a run does at start in a checkpoint folder."""
    check_writable(folder, what)
    remove_stale_temp_files(folder)


# ------------------------------------------------------------------------------------------ reading checkpoints
def unreadable_checkpoint(path: str | Path, error: BaseException) -> ConfigError:
    """The :class:`~app.errors.ConfigError` for a checkpoint file that ``torch.load`` could not read."""
    local = Path(path) if _is_local_file_protocol(path) else None
    if isinstance(error, FileNotFoundError) or (local is not None and not local.exists()):
        reason = "no such file"
    elif isinstance(error, IsADirectoryError):
        reason = "a folder, not a checkpoint file"
    elif local is not None and local.is_file() and local.stat().st_size == 0:
        reason = "the file is empty"
    elif local is not None and local.is_file() and not zipfile.is_zipfile(local):  # torch.save writes a zip archive
        reason = "truncated, or not a checkpoint (not the zip archive torch.save writes)"
    else:
        text = " ".join(str(error).split())
        reason = f"{type(error).__name__}: {text if len(text) <= 200 else text[:197] + '...'}"
    return ConfigError(
        f"checkpoint {str(path)!r} cannot be read: {reason}\n  pass --ckpt_path a checkpoint that fit wrote "
        "(under <trainer.default_root_dir>/checkpoints unless the config says otherwise)"
    )


def load_checkpoint_file(path: str | Path, **kwargs: Any) -> dict[str, Any]:
    """``torch.load(path, map_location="cpu", weights_only=True, **kwargs)``; a file it cannot read is a
    :class:`~app.errors.ConfigError` naming it (:func:`unreadable_checkpoint`)."""
    kwargs = {"map_location": "cpu", "weights_only": True, **kwargs}
    try:
        return torch.load(path, **kwargs)
    except Exception as error:
        raise unreadable_checkpoint(path, error) from error


def _example(keys: list[str]) -> str:
    return f" (e.g. {keys[0]!r})" if keys else ""


def checkpoint_mismatch(path: str | Path, expected: Mapping[str, Any], given: Mapping[str, Any]) -> str | None:
    """How the state dict ``given`` (a checkpoint's) differs from ``expected`` (the model's): missing, unexpected and
    differently shaped keys, in a sentence; None when it has the same keys and shapes."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    shapes = sorted(
        k
        for k in set(expected) & set(given)
        if getattr(expected[k], "shape", None) is not None
        and getattr(given[k], "shape", None) is not None
        and tuple(expected[k].shape) != tuple(given[k].shape)
    )
    if not (missing or unexpected or shapes):
        return None
    parts = []
    if missing:
        parts.append(f"{len(missing)} of the model's weights are not in it{_example(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} of its weights are not the model's{_example(unexpected)}")
    if shapes:
        parts.append(f"{len(shapes)} differ in shape{_example(shapes)}")
    return f"checkpoint {str(path)!r} does not fit the config's model: {'; '.join(parts)}"


_ADVICE = "is it a checkpoint of this config? pass a checkpoint of this run, or run with the config it was trained with"


class CheckpointConnector(_CheckpointConnector):
    """Lightning's checkpoint connector, whose errors name the checkpoint: a file that cannot be read (truncated, not
    a checkpoint) and one that does not fit the model or the training state (another model's, another optimizer's)
    are each a :class:`~app.errors.ConfigError` naming the file and what did not fit.
    :class:`app.command_line.commands.AppCLI` gives its trainer one."""

    def resume_start(self, checkpoint_path: Any = None, weights_only: bool | None = None) -> None:
        try:
            super().resume_start(checkpoint_path, weights_only)
        except ConfigError:
            raise
        except Exception as error:
            raise unreadable_checkpoint(checkpoint_path, error) from error

    def restore_model(self) -> None:
        self._restore("the model's weights", super().restore_model)

    def restore_datamodule(self) -> None:
        self._restore("the data module's state", super().restore_datamodule)

    def restore_callbacks(self) -> None:
        self._restore("the callbacks' state", super().restore_callbacks)

    def restore_training_state(self) -> None:
        self._restore("the training state (loops, optimizers, schedulers)", super().restore_training_state)

    def _restore(self, what: str, restore: Callable[[], None]) -> None:
        try:
            restore()
        except ConfigError:
            raise
        except Exception as error:
            path = self._ckpt_path
            message = None
            if what == "the model's weights" and "loading state_dict" in str(error):  # torch's strict load
                state = self._loaded_checkpoint.get("state_dict")
                if isinstance(state, Mapping):
                    message = checkpoint_mismatch(path, self.trainer.lightning_module.state_dict(), state)
            if message is None:
                text = " ".join(str(error).split()) or type(error).__name__
                text = text if len(text) <= 300 else text[:297] + "..."
                message = f"checkpoint {str(path)!r}: cannot restore {what}: {text}"
            raise ConfigError(f"{message}\n  {_ADVICE}") from error


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``torch.save`` checkpoint IO, written atomically on the destination's own filesystem. Its first
    save into a folder removes the temporary files interrupted saves left there (:func:`remove_stale_temp_files`)."""

    def __init__(self) -> None:
        super().__init__()
        self._cleaned: set[str] = set()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if not _is_local_file_protocol(path):  # object stores write whole objects: Lightning's own writer
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        folder = os.path.abspath(os.path.dirname(os.fspath(path)))
        if folder not in self._cleaned:
            remove_stale_temp_files(folder)
            self._cleaned.add(folder)
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
            prepare_checkpoint_folder(Path(path).parent, "the checkpoint folder")
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

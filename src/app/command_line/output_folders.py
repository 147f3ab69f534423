"""Every folder a command will write, probed before the first step: the run folder, the loggers', the checkpoint
callbacks', the export folder and any callback's ``output_dir`` / ``dirpath``, each named by the config field that
gives it, so an unwritable one fails the run at once in one line (not at its first save, after training)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from lightning import Trainer
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import Checkpoint

from app.command_line.faults import PreemptionCheckpoint, check_writable, remove_stale_temp_files


class OutputFolder(NamedTuple):
    path: str
    field: str  # the config field that names it, and what it is: "trainer.default_root_dir (the run folder)"
    holds_checkpoints: bool


def output_folders(
    trainer: Trainer, trainer_config: dict, subcommand: str, export_dir: str | None
) -> list[OutputFolder]:
    """Every folder ``subcommand`` writes: the export folder for ``export``; otherwise the run folder, the loggers'
    folders and the callbacks' (the checkpoint folders and ExportPolicy's only for fit)."""
    if subcommand == "export":
        return [OutputFolder(str(export_dir), "--output_dir (the export folder)", False)]
    run = OutputFolder(str(trainer.default_root_dir), "trainer.default_root_dir (the run folder)", False)
    return [run, *_logger_folders(trainer, trainer_config), *_callback_folders(trainer, trainer_config, subcommand)]


def _logger_folders(trainer: Trainer, trainer_config: dict) -> list[OutputFolder]:
    logger_config = trainer_config.get("logger")
    folders = []
    for index, logger in enumerate(trainer.loggers):
        try:
            folder = getattr(logger, "root_dir", None) or getattr(logger, "save_dir", None)
        except Exception:  # a logger that resolves its folder only once it runs
            folder = None
        if not isinstance(folder, (str, os.PathLike)):
            continue
        if isinstance(logger_config, (list, tuple)):
            field = f"trainer.logger[{index}].init_args.save_dir"
        elif logger_config is None or isinstance(logger_config, bool):  # Lightning's default logger
            field = "trainer.default_root_dir"
        else:
            field = "trainer.logger.init_args.save_dir"
        folders.append(OutputFolder(str(folder), f"{field} (the {type(logger).__name__} folder)", False))
    return folders


def _callback_folders(trainer: Trainer, trainer_config: dict, subcommand: str) -> list[OutputFolder]:
    from app.export import ExportPolicy

    configured = trainer_config.get("callbacks") or []
    configured = list(configured) if isinstance(configured, (list, tuple)) else [configured]
    fit = subcommand == "fit"
    folders = []
    for callback in trainer.callbacks:
        index = next((i for i, c in enumerate(configured) if c is callback), None)
        where = f"trainer.callbacks[{index}].init_args" if index is not None else None
        name = type(callback).__name__
        if isinstance(callback, PreemptionCheckpoint):
            if fit:
                folder = str(Path(callback.checkpoint_path(trainer)).parent)
                field = f"{where}.dirpath" if where and callback.dirpath else "trainer.default_root_dir"
                folders.append(OutputFolder(folder, f"{field} (the {name} folder)", True))
        elif isinstance(callback, Checkpoint):
            if fit and getattr(callback, "dirpath", None):
                field = f"{where}.dirpath" if where else f"the {name} dirpath"
                folders.append(OutputFolder(str(callback.dirpath), f"{field} (the {name} folder)", True))
        elif isinstance(callback, ExportPolicy):
            if fit:
                field = f"{where}.output_dir" if where else "the ExportPolicy output_dir"
                folders.append(OutputFolder(str(callback.output_dir), f"{field} (the export folder)", False))
        else:
            for attribute in ("output_dir", "dirpath"):
                value = getattr(callback, attribute, None)
                if isinstance(value, (str, os.PathLike)):
                    field = f"{where}.{attribute}" if where else f"the {name} {attribute}"
                    folders.append(OutputFolder(str(value), f"{field} (the {name} folder)", False))
    return folders


def probe_output_folders(trainer: Trainer, trainer_config: dict, subcommand: str, export_dir: str | None) -> None:
    """Fail before the first step, naming the field, when a folder the command writes cannot be written (rank 0:
    the one that writes), and clear the temporary files interrupted saves left in the checkpoint folders."""
    if not trainer.is_global_zero:
        return
    probed: set[str] = set()
    for folder in output_folders(trainer, trainer_config, subcommand, export_dir):
        if not _is_local_file_protocol(folder.path):
            continue
        key = os.path.abspath(folder.path)
        if key not in probed:
            check_writable(folder.path, folder.field, create=subcommand != "export")  # a failed export leaves none
            probed.add(key)
        if folder.holds_checkpoints:
            remove_stale_temp_files(folder.path)

"""Writing a trained policy as a Hugging Face folder: at the end of fit (callback) or from a checkpoint (CLI)."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L

from app.errors import ConfigError
from app.faults import check_writable
from app.parallel.fsdp import FSDP2Strategy, is_sharded_checkpoint, read_sharded_checkpoint

log = logging.getLogger(__name__)


class ExportPolicy(L.Callback):
    """Export ``pl_module.policy`` to ``output_dir`` when fit ends (rank 0 only).

    The folder loads with ``AutoModelForImageTextToText.from_pretrained`` / ``AutoProcessor.from_pretrained``; with
    LoRA it holds the merged weights plus the adapter in PEFT format under ``adapter/``. A GRPO config points its
    ``policy.model`` at the SFT stage's folder to start from it.
    """

    def __init__(self, output_dir: str):
        self.output_dir = output_dir

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and isinstance(trainer.strategy, FSDP2Strategy):
            raise ConfigError(
                "ExportPolicy cannot export a sharded (FSDP2) policy at the end of fit; remove the callback and run "
                "`python -m app export --config <the run's config> --ckpt_path <its checkpoint> --output_dir DIR`"
            )
        if stage == "fit" and trainer.is_global_zero:
            check_writable(self.output_dir, "the export folder (ExportPolicy output_dir)")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            path = pl_module.policy.export(self.output_dir)
            log.info("exported the policy to %s", path)
        trainer.strategy.barrier("export_policy")


def export_from_checkpoint(model: L.LightningModule, ckpt_path: str | Path, output_dir: str | Path) -> Path:
    """Load a Lightning checkpoint's weights into ``model`` (built from the same config) and export its policy."""
    import torch

    from app.modules.checkpoints import restore_frozen_parameters

    if is_sharded_checkpoint(ckpt_path):  # FSDP2's folder of shards: read in this one process
        checkpoint = read_sharded_checkpoint(ckpt_path, model)
    else:
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    try:
        restore_frozen_parameters(model, checkpoint)  # lean checkpoints leave the frozen base out
    except ValueError as error:  # a checkpoint of another model
        raise ConfigError(f"{ckpt_path}: {error}") from error
    state = checkpoint["state_dict"]
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(k for k in set(state) & set(expected) if state[k].shape != expected[k].shape)
    if missing or unexpected or mismatched:
        raise ConfigError(
            f"checkpoint {ckpt_path} does not match the config's model: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}, shape mismatch {mismatched[:3]} (is it a checkpoint of this config?)"
        )
    model.load_state_dict(state)
    return model.policy.export(output_dir)


def find_checkpoint(ckpt_path: str | Path | None, root: str | Path) -> Path:
    """The checkpoint to export: ``ckpt_path`` if it is a file, else the newest ``*.ckpt`` under the folder
    ``ckpt_path`` (default ``root``, the run folder, where fit writes ``checkpoints/``)."""
    folder = Path(root if ckpt_path is None else ckpt_path)
    if folder.is_file() or is_sharded_checkpoint(folder):
        return folder
    found = sorted(folder.rglob("*.ckpt"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    if found:
        return found[-1]
    what = "no such file or folder" if not folder.exists() else "no *.ckpt file under it"
    raise ConfigError(
        f"ckpt_path = {str(folder)!r}: {what}; pass --ckpt_path a checkpoint file or a run folder "
        "(fit writes checkpoints under <trainer.default_root_dir>/checkpoints unless enable_checkpointing is false)"
    )

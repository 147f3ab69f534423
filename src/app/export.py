"""Writing a trained policy as a Hugging Face folder: at the end of fit (callback) or from a checkpoint (CLI)."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L

from app.command_line.faults import check_writable, checkpoint_mismatch, load_checkpoint_file, unreadable_checkpoint
from app.errors import ConfigError
from app.parallel.fsdp import FSDP2Strategy, is_sharded_checkpoint, read_sharded_checkpoint

log = logging.getLogger(__name__)


class ExportPolicy(L.Callback):
    """Export ``pl_module.policy`` to ``output_dir`` when fit ends (rank 0 only), with the moving average of its
    weights when the module keeps one (``ema``).

    The folder loads with ``AutoModelForImageTextToText.from_pretrained`` / ``AutoProcessor.from_pretrained``; with
    LoRA it holds the merged weights plus the adapter in PEFT format under ``adapter/``. A GRPO config points its
    ``policy.model`` at the SFT stage's folder to start from it.

    Args:
        output_dir: the folder the policy is written to, relative to the working directory; created when fit starts
            (which checks it is writable), and files of the same names already in it are replaced.
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
            with _evaluation_weights(pl_module):  # the moving average, when the module keeps one
                path = pl_module.policy.export(self.output_dir)
            log.info("exported the policy to %s", path)
        trainer.strategy.barrier("export_policy")


def export_from_checkpoint(model: L.LightningModule, ckpt_path: str | Path, output_dir: str | Path) -> Path:
    """Load a Lightning checkpoint's weights into ``model`` (built from the same config) and export its policy."""
    from app.modules.checkpoints import restore_frozen_parameters

    if hasattr(model, "configure_model"):  # what fit builds beside the policy (its moving average) is in the state
        model.configure_model()
    if is_sharded_checkpoint(ckpt_path):  # FSDP2's folder of shards: read in this one process
        try:
            checkpoint = read_sharded_checkpoint(ckpt_path, model)
        except ConfigError:
            raise
        except Exception as error:  # a shard cut short, or the shards of another model
            raise unreadable_checkpoint(ckpt_path, error) from error
    else:
        checkpoint = load_checkpoint_file(ckpt_path)  # a file it cannot read is an error naming it
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ConfigError(f"checkpoint {str(ckpt_path)!r} holds no state_dict: it is not a Lightning checkpoint")
    try:
        restore_frozen_parameters(model, checkpoint)  # lean checkpoints leave the frozen base out
    except ValueError as error:  # a checkpoint of another model
        raise ConfigError(f"{ckpt_path}: {error}") from error
    state = checkpoint["state_dict"]
    mismatch = checkpoint_mismatch(ckpt_path, model.state_dict(), state)
    if mismatch:
        raise ConfigError(
            f"{mismatch}\n  is it a checkpoint of this config? export it with the config it was trained with"
        )
    model.load_state_dict(state)
    with _evaluation_weights(model):
        return model.policy.export(output_dir)


def _evaluation_weights(module: L.LightningModule):
    """The weights a module evaluates and exports with (:meth:`~app.modules.policy_module.PolicyModule.
    evaluation_weights`), or its trained ones for a module without that method."""
    from contextlib import nullcontext

    return module.evaluation_weights() if hasattr(module, "evaluation_weights") else nullcontext()


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

"""Runs under ``torchrun``: a sharded (FSDP2) checkpoint written by one number of processes and resumed on another, for
``test_world_size_resume.py``.

    torchrun --standalone --nproc_per_node 2 tests/parallel/world_size_probe.py OUT save
    torchrun --standalone --nproc_per_node W tests/parallel/world_size_probe.py OUT resume

``save`` fits the tiny VLM with LoRA for ``SAVED_AT`` step(s) and writes the sharded checkpoint
``OUT/epoch=0-step=<SAVED_AT>.ckpt``; rank 0 writes ``OUT/saved.pt``: the full trainable weights and the full optimizer
state after that step, and the training set's prompts in index order; every rank writes ``OUT/save.rank<r>.pt``: the
prompts of each step it trained.

``resume`` fits one more step from that checkpoint on this launch's number of processes; every rank writes
``OUT/resume<W>.rank<r>.pt``: the state of its global generators as training starts (after the checkpoint is loaded)
and the prompts of the step it trained; rank 0 also writes ``OUT/resume<W>.pt``: the full trainable weights and
optimizer state as training starts, as loaded from the checkpoint.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning as L
import torch
from fsdp_probe import build, full_trainable_state, strategy_for, trainer_for
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from app.modules.checkpoints import rng_states

SAVED_AT = 1  # the step whose checkpoint the resumed runs start from


def full_optimizer_state(module: L.LightningModule, trainer: L.Trainer) -> dict:
    """The optimizer's state of every trainable parameter, gathered, keyed by the parameter's name (none before the
    first step)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_optimizer_state_dict(module, trainer.optimizers[0], options=options).get("state", {})
    return {name: {key: value.clone() for key, value in entry.items()} for name, entry in state.items()}


def prompt(sample) -> str:
    """A training prompt by its question and dot position (distinct for the tiny training set)."""
    return f"{sample.question}|{sample.meta['red_xy']}"


class Recorder(L.Callback):
    """As training starts: the global generators' states and (rank 0) the full weights and optimizer state; as each
    training step starts, its prompts."""

    def __init__(self) -> None:
        self.started: dict = {}
        self.prompts: list[list[str]] = []

    def on_train_start(self, trainer, pl_module):
        self.started = {"rng": rng_states()}  # first: gathering the weights below draws nothing, but keep it clear
        self.started["weights"] = full_trainable_state(pl_module)
        self.started["optimizer"] = full_optimizer_state(pl_module, trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.prompts.append([prompt(s) for s in batch])


def fit(out: Path, steps: int, ckpt_path: Path | None) -> tuple[L.Trainer, L.LightningModule, Recorder, list[str]]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    L.seed_everything(0, verbose=False)  # the same initial weights on every rank
    module, data = build("vlm_lora")
    L.seed_everything(7 + int(os.environ.get("RANK", "0")), verbose=False)  # only the checkpoint can restore these
    recorder = Recorder()
    callbacks: list = [recorder]
    if ckpt_path is None:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(dirpath=out, every_n_train_steps=1, save_top_k=-1))
    trainer = trainer_for(strategy_for("fsdp", world), out, steps, callbacks, same_draws=False)
    trainer.fit(module, data, ckpt_path=str(ckpt_path) if ckpt_path else None)
    return trainer, module, recorder, [prompt(sample) for sample in data.train_dataset]


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if mode == "save":
        trainer, module, recorder, train_set = fit(out, SAVED_AT, None)
        weights, optimizer = full_trainable_state(module), full_optimizer_state(module, trainer)
        saved = {"weights": weights, "optimizer": optimizer, "train_set": train_set}
        torch.save({"prompts": recorder.prompts}, out / f"save.rank{rank}.pt")
        if rank == 0:
            torch.save(saved, out / "saved.pt")
    else:
        checkpoint = out / f"epoch=0-step={SAVED_AT}.ckpt"
        trainer, module, recorder, _ = fit(out / f"resume{world}", SAVED_AT + 1, checkpoint)
        record = {"rng": recorder.started["rng"], "prompts": recorder.prompts, "global_step": trainer.global_step}
        torch.save(record, out / f"resume{world}.rank{rank}.pt")
        if rank == 0:
            loaded = {key: recorder.started[key] for key in ("weights", "optimizer")}
            torch.save(loaded, out / f"resume{world}.pt")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

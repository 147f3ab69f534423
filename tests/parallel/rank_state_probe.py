"""Runs under ``torchrun``: a run checkpointed after every step and the same run killed after step ``KILLED_AT`` and
resumed from that checkpoint, for ``test_rank_state.py``.

    torchrun --standalone --nproc_per_node 2 tests/parallel/rank_state_probe.py OUT CASE [CASE ...]

A case is ``<policy>-<strategy>``: policy ``flow_sde`` or ``flow_cps`` (LoRA on the tiny SD3, Flow-GRPO's SDE sampler or
the coefficients-preserving one) or ``vlm_lora``; strategy ``fsdp`` (FSDP2, sharded checkpoints) or ``ddp`` (one file).
Before each fit every rank seeds its global generators with its own seed, as ranks whose draws have diverged stand (a
flow module seeds its rollout generator with ``seed + rank`` by itself), and the resumed fit seeds them with other
values again: only the checkpoint can give a rank its states back.

Every rank writes ``OUT/<case>.rank<r>.pt``: per training step of each fit, as the step starts, the state of the
generator its rollout draws from (the rollout generator of a flow module, the global torch generator of a VLM module)
, the states of the global torch, numpy and python generators, and the step's prompts.
Rank 0 writes ``OUT/<case>.straight.pt`` and ``OUT/<case>.resumed.pt``: the full trainable weights after each fit.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
from fsdp_probe import BrightnessReward, build, full_trainable_state, run_cases, strategy_for, trainer_for

from app.data import VisualTaskDataModule
from app.models import FlowPolicy
from app.modules import FlowGRPOModule
from app.modules.checkpoints import rng_states
from app.settings import FlowGRPOSamplingSettings, LoRASettings, OptimizerSettings
from app.tasks.dots import ShapePromptDataset

STEPS = 2  # the straight run's length
KILLED_AT = 1  # the step whose checkpoint the resumed run starts from


class DrawRecorder(L.Callback):
    """As each training step starts: the state of the generator the rollout draws from (``"rollout"``), those of the
    global generators (``"rng"``, :func:`~app.modules.checkpoints.rng_states`) and the step's prompts (``"prompts"``,
    where this rank's data sampler stands)."""

    def __init__(self):
        self.states: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        flow = isinstance(pl_module, FlowGRPOModule)
        rollout = pl_module.generator.get_state().clone() if flow else torch.get_rng_state()
        prompts = [f"{s.question}|{s.meta.get('red_xy', s.meta.get('position', ''))}" for s in batch]
        self.states.append({"rollout": rollout, "rng": rng_states(), "prompts": prompts})


def build_case(policy_kind: str) -> tuple[L.LightningModule, L.LightningDataModule]:
    if policy_kind == "vlm_lora":
        return build("vlm_lora")
    sampler = policy_kind.removeprefix("flow_")
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    # two steps, the first of them stochastic and trained: the cheapest rollout that still draws noise
    sampling = FlowGRPOSamplingSettings(group_size=2, num_steps=2, sampler=sampler, eta=0.7)
    module = FlowGRPOModule(policy, [BrightnessReward()], sampling, optimizer=OptimizerSettings(learning_rate=1e-3))
    data = VisualTaskDataModule(ShapePromptDataset, train_size=8, val_size=0, test_size=0, batch_size=1, image_size=64)
    return module, data


def seed_this_rank(seed: int) -> None:
    """Global generators that differ between ranks (numpy and python too: the checkpoint must bring all back)."""
    rank = int(os.environ.get("RANK", "0"))
    L.seed_everything(seed + 100 * rank, verbose=False)


def fit(case: str, root: Path, seed: int, ckpt_path: Path | None = None) -> tuple[list[torch.Tensor], dict]:
    policy_kind, strategy_kind = case.split("-")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    L.seed_everything(0, verbose=False)  # the same initial weights on every rank
    module, data = build_case(policy_kind)
    seed_this_rank(seed)
    recorder = DrawRecorder()
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1)
    callbacks = [recorder] if ckpt_path else [recorder, checkpoints]
    trainer = trainer_for(strategy_for(strategy_kind, world), root, STEPS, callbacks, same_draws=False)
    trainer.fit(module, data, ckpt_path=str(ckpt_path) if ckpt_path else None)
    return recorder.states, full_trainable_state(module)


def run(out: Path, case: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    root = out / case
    straight_draws, straight = fit(case, root, seed=1)
    resumed_draws, resumed = fit(case, root, seed=7, ckpt_path=root / f"epoch=0-step={KILLED_AT}.ckpt")
    torch.save({"straight": straight_draws, "resumed": resumed_draws}, out / f"{case}.rank{rank}.pt")
    if rank == 0:
        torch.save(straight, out / f"{case}.straight.pt")
        torch.save(resumed, out / f"{case}.resumed.pt")


def main() -> None:
    run_cases(run)


if __name__ == "__main__":
    main()

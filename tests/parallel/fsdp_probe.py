"""Runs under ``torchrun`` (or plain ``python`` for one process): a few GRPO steps of a tiny policy under DDP, FSDP2 or
HSDP, and writes what the multi-process tests compare.

    torchrun --nproc_per_node 2 tests/parallel/fsdp_probe.py OUT CASE [CASE ...]

A case is ``<policy>-<strategy>[-same]``: policy ``vlm_lora``, ``vlm_full`` (full fine-tuning with a KL reference copy),
``flow_lora`` (tiny SD3) or ``flowi2v_lora`` (tiny Wan image-to-video, conditioned on VBVR problem frames); strategy
``single``, ``ddp``, ``fsdp`` (all ranks shard), ``fsdpbf16`` (FSDP2's bf16 mixed precision) or ``hsdp`` (2 x world/2);
``-gc`` turns on activation checkpointing; ``-delay1`` the one-step-delayed reward pipeline (rewards in a thread);
``-ema`` keeps a moving average of the weights (decay 0.5; rank 0 also writes ``OUT/<case>.ema.pt``, the full average);
``-same`` gives every rank the same prompts and random draws, so the run equals one process on that batch.
Rank 0 writes ``OUT/<case>.pt``: the full trainable weights after fit; every rank writes ``OUT/<case>.rank<r>.pt``:
its local parameter and optimizer-state sizes and the groups it trained on. Case ``vlm_lora-fsdp-resume`` also
checkpoints after every step (sharded; ``last.ckpt`` is the last one) and resumes from step 2 in a second fit.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import lightning as L
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from app.data import VisualTaskDataModule
from app.models import FlowPolicy, VLMPolicy
from app.modules import FlowGRPOModule, VLMGRPOModule
from app.parallel import FSDP2Strategy
from app.parallel.fsdp import local_numel
from app.rewards import RewardComponent
from app.settings import (
    EMASettings,
    FlowGRPOSamplingSettings,
    GRPOSettings,
    LoRASettings,
    OptimizerSettings,
    PipelineSettings,
    SamplingSettings,
)
from app.tasks.dots import DotsDataset, ShapePromptDataset
from app.tasks.vbvr import VBVRPromptDataset

STEPS = 2


class LengthReward(RewardComponent):
    """Completion length / 32: varies within a group, so a tiny random model gets gradients."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor([len(c) / 32 for c in completions])


class BrightnessReward(RewardComponent):
    """Mean pixel value of a generated image."""

    value_range = (0.0, 1.0)

    def score(self, completions, samples):
        return torch.stack([torch.as_tensor(image).float().mean() for image in completions])


class Report(L.Callback):
    """Per rank: local sizes of the trainable parameters and of the optimizer state, and the prompts trained on."""

    def __init__(self, same_draws: bool):
        self.same_draws = same_draws
        self.batches: list[list[str]] = []

    def on_train_start(self, trainer, pl_module):
        if self.same_draws:  # every process draws what one process would, from here on
            torch.manual_seed(1)
            if isinstance(pl_module, FlowGRPOModule):  # its rollout generator is seeded with seed + rank
                pl_module._generator = torch.Generator().manual_seed(0)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append([f"{s.question}|{s.meta.get('red_xy', s.meta.get('shape', ''))}" for s in batch])

    def report(self, trainer, pl_module) -> dict:
        trainable = [p for p in pl_module.parameters() if p.requires_grad]
        optimizer = trainer.optimizers[0]
        state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
        return {
            "reward_mean": reward_mean_across_ranks(trainer.global_rank),
            "params": local_numel(trainable),
            "average": local_numel(pl_module.policy_ema.averages) if pl_module.policy_ema is not None else (0, 0),
            "optimizer_state": local_numel(state),
            "batches": self.batches,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "policy_lag": float(trainer.callback_metrics.get("train/policy_lag", -1.0)),
            "dropped_rollouts": pl_module.dropped_rollouts,
        }


def reward_mean_across_ranks(rank: int) -> float:
    """A reward metric updated with ``rank + 1`` completions of length ``32 * (rank + 1)`` on each rank: ``compute``
    must return the mean over every rank's completions (TorchMetrics syncs the sums), not this rank's own mean."""
    reward = LengthReward()
    count = rank + 1
    reward.update(["x" * 32 * count] * count, [None] * count)
    return float(reward.compute())


def build(
    policy_kind: str, checkpointing: bool = False, delay: int = 0, ema: bool = False
) -> tuple[L.LightningModule, L.LightningDataModule]:
    pipeline = PipelineSettings(delay=delay)
    average = EMASettings(decay=0.5) if ema else None
    if policy_kind.startswith("vlm"):
        lora = LoRASettings(r=4, alpha=8, dropout=0.0) if policy_kind == "vlm_lora" else None
        policy = VLMPolicy("tiny-qwen2-vl", lora=lora, instruction="", gradient_checkpointing=checkpointing)
        module = VLMGRPOModule(
            policy,
            [LengthReward()],
            SamplingSettings(group_size=4, max_new_tokens=8),
            pipeline=pipeline,
            grpo=GRPOSettings(beta=0.0 if lora else 0.04, micro_batch_size=4),
            optimizer=OptimizerSettings(learning_rate=1e-3),
            ema=average,
        )
        dataset, image_size = DotsDataset, 64
    else:
        name, text_length = ("tiny-wan-i2v", 512) if policy_kind == "flowi2v_lora" else ("tiny-sd3", None)
        policy = FlowPolicy(name, lora=LoRASettings(r=4, alpha=8), max_sequence_length=text_length)
        sampling = FlowGRPOSamplingSettings(group_size=2, num_steps=3, sampler="cps", eta=0.7)
        module = FlowGRPOModule(
            policy,
            [BrightnessReward()],
            sampling,
            pipeline=pipeline,
            optimizer=OptimizerSettings(learning_rate=1e-3),
            ema=average,
        )
        dataset = (
            functools.partial(VBVRPromptDataset, tasks=["color_mixing"])
            if policy.is_conditioned
            else ShapePromptDataset
        )
        image_size = policy.frame_size[0] if policy.is_conditioned else 64  # a conditioned model sees the problem
    data = VisualTaskDataModule(dataset, train_size=24, val_size=0, test_size=0, batch_size=2, image_size=image_size)
    return module, data


def strategy_for(kind: str, world: int):
    if kind == "single":
        return "auto"
    if kind == "ddp":
        return "ddp"
    if kind == "fsdp":
        return FSDP2Strategy()
    if kind == "fsdpbf16":  # bf16 gathered weights and compute, float32 master weights and gradient reduction
        return FSDP2Strategy(param_dtype="bfloat16", reduce_dtype="float32")
    if kind == "hsdp":
        return FSDP2Strategy(replicate_size=2, shard_size=world // 2)
    raise ValueError(f"unknown strategy {kind!r}")


def trainer_for(strategy, root: Path, steps: int, callbacks: list, same_draws: bool) -> L.Trainer:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, L.pytorch.callbacks.ModelCheckpoint) for c in callbacks),
        num_sanity_val_steps=0,
        limit_val_batches=0,
        use_distributed_sampler=not same_draws,
        default_root_dir=str(root),
        callbacks=callbacks,
    )


def full_trainable_state(module: L.LightningModule) -> dict[str, torch.Tensor]:
    names = {n for n, p in module.named_parameters() if p.requires_grad}
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.clone() for k, v in state.items() if k in names}


def full_average(module: L.LightningModule) -> dict[str, torch.Tensor]:
    """The moving average of the weights, gathered (keyed by the parameter names, as the trainable state is)."""
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    names = [n for n, p in module.policy.named_parameters() if p.requires_grad]
    if not state:  # gathered on rank 0 only (cpu_offload)
        return {}
    return {f"policy.{name}": state[f"policy_ema.average_{i}"].clone() for i, name in enumerate(names)}


def run(out: Path, case: str) -> None:
    policy_kind, strategy_kind, *flags = case.split("-")
    same = "same" in flags
    world = int(os.environ.get("WORLD_SIZE", "1"))
    L.seed_everything(0, verbose=False)
    module, data = build(policy_kind, checkpointing="gc" in flags, delay=int("delay1" in flags), ema="ema" in flags)
    report = Report(same)
    callbacks: list = [report]
    if "resume" in flags:
        callbacks.append(
            L.pytorch.callbacks.ModelCheckpoint(
                dirpath=out / case, every_n_train_steps=1, save_top_k=-1, save_last=True
            )
        )
    trainer = trainer_for(strategy_for(strategy_kind, world), out / case, STEPS + 1, callbacks, same)
    trainer.fit(module, data)
    rank = trainer.global_rank
    torch.save(report.report(trainer, module), out / f"{case}.rank{rank}.pt")
    weights = full_trainable_state(module)
    average = full_average(module) if "ema" in flags else None
    if rank == 0:
        torch.save(weights, out / f"{case}.pt")
        if average is not None:
            torch.save(average, out / f"{case}.ema.pt")
    if "resume" in flags:  # a second fit from the step-2 checkpoint must end where the first one did
        L.seed_everything(123, verbose=False)  # the checkpoint's generator states must override this
        module, data = build(policy_kind, delay=int("delay1" in flags), ema="ema" in flags)
        trainer = trainer_for(strategy_for(strategy_kind, world), out / case, STEPS + 1, [Report(same)], same)
        checkpoint = out / case / f"epoch=0-step={STEPS}.ckpt"
        trainer.fit(module, data, ckpt_path=str(checkpoint))
        resumed = full_trainable_state(module)
        average = full_average(module) if "ema" in flags else None
        if rank == 0:
            torch.save(resumed, out / f"{case}.resumed.pt")
            if average is not None:
                torch.save(average, out / f"{case}.resumed.ema.pt")


def run_cases(run_case) -> None:
    """``run_case(OUT, case)`` for each case on the command line (``OUT CASE [CASE ...]``), then the group torn down."""
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for case in sys.argv[2:]:
        run_case(out, case)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def main() -> None:
    run_cases(run)


if __name__ == "__main__":
    main()

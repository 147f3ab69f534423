"""Runs under ``torchrun`` (or plain ``python`` for one process): groups spread over ranks (``grpo.group_ranks``).

    torchrun --nproc_per_node 4 tests/parallel/group_ranks_probe.py OUT CASE [CASE ...]

Cases:

- ``scores-R``: the GRPO skeleton scores fixed rewards (:data:`WHOLE_REWARDS`: B = 3 prompts x K = 4, one group of
  equal rewards, one row a reward could not score) with ``group_ranks`` R, each rank holding its K / R rows of every
  group; rank ``r`` writes ``OUT/scores-R.rank<r>.pt`` (its rows' advantages and kept rows).
- ``fit-R``: flow-GRPO on the tiny SD3 policy, K = 16 per prompt, 2 prompts per step, 3 steps, with ``group_ranks`` R
  (the world size when R is ``world``; 1 process with K = 16 is ``fit-1``); rank 0 writes ``OUT/fit-R.pt`` (the
  trainable weights after fit), every rank ``OUT/fit-R.rank<r>.pt`` (the prompts it trained on and the rows of each
  its steps said they drew).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "modules"))  # the toy skeleton of the module tests
from doubles import LinearPolicy, ValueReward  # noqa: E402
from fsdp_probe import BrightnessReward, full_trainable_state, run_cases, trainer_for  # noqa: E402

from app.data import VisualTaskDataModule  # noqa: E402
from app.models import FlowPolicy  # noqa: E402
from app.modules import FlowGRPOModule, GRPOModule  # noqa: E402
from app.settings import FlowGRPOSamplingSettings, GRPOSettings, LoRASettings, OptimizerSettings  # noqa: E402
from app.tasks.dots import ShapePromptDataset  # noqa: E402
from app.types import RewardOutput, VisualSample  # noqa: E402

K = 4
WHOLE_REWARDS = torch.tensor(
    [0.0, 1.0, 3.0, 2.0, 5.0, 5.0, 5.0, 5.0, 0.5, -1.0, 2.0, 0.25]
)  # [B * K], group-major: group 1 is flat
WHOLE_UNSCORED = torch.zeros(12, dtype=torch.bool)
WHOLE_UNSCORED[9] = True  # group 2 holds a row no reward scored: the whole group is left out
STEPS = 3
FIT_GROUP_SIZE = 16


@dataclass
class FourSampling:
    group_size: int = K


class SpreadToy(GRPOModule):
    """Only the skeleton's scoring: a family that says it can spread groups, outside a trainer (the rank is the
    process group's)."""

    sampling_settings = FourSampling
    spreads_groups = True

    @property
    def global_rank(self) -> int:
        return dist.get_rank()


def scores(out: Path, ranks: int) -> None:
    grpo = GRPOSettings(group_ranks=ranks, drop_zero_std_groups=True, advantage_scale="global")
    module = SpreadToy(LinearPolicy(), [ValueReward()], FourSampling(), grpo, None, 0.1, None, 4)
    share = module.group_share
    rows = share.rows(3)
    total, unscored = WHOLE_REWARDS[rows], WHOLE_UNSCORED[rows]
    samples = [VisualSample([], f"prompt {i}", "toy", answer=str(i)) for i in range(3)]
    scored = module._scored(RewardOutput(total, {"value": total}, unscored=unscored), samples)
    report = {"rows": rows, "advantages": scored.advantages, "keep": scored.keep}
    torch.save(report, out / f"scores-{ranks}.rank{dist.get_rank()}.pt")


class Prompts(L.Callback):
    """The prompts of every batch, and the rows of each prompt every step said it drew (``rows_per_prompt``)."""

    def __init__(self):
        self.batches: list[list[str]] = []
        self.rows_per_prompt: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append([f"{s.question}|{s.meta.get('shape', '')}" for s in batch])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows_per_prompt.append(outputs["rows_per_prompt"])


def fit(out: Path, case: str, ranks: int) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    L.seed_everything(0, verbose=False)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))
    module = FlowGRPOModule(
        policy,
        [BrightnessReward()],
        FlowGRPOSamplingSettings(group_size=FIT_GROUP_SIZE, num_steps=3, sampler="cps", eta=0.7),
        grpo=GRPOSettings(group_ranks=ranks, micro_batch_size=4),
        optimizer=OptimizerSettings(learning_rate=1e-3),
    )
    data = VisualTaskDataModule(ShapePromptDataset, train_size=24, val_size=0, test_size=0, batch_size=2)
    prompts = Prompts()
    strategy = "ddp" if world > 1 else "auto"
    trainer = trainer_for(strategy, out / case, STEPS, [prompts], same_draws=False)
    trainer.fit(module, data)
    drawn = {"batches": prompts.batches, "rows_per_prompt": prompts.rows_per_prompt}
    torch.save(drawn, out / f"{case}.rank{trainer.global_rank}.pt")
    weights = full_trainable_state(module)
    if trainer.global_rank == 0:
        torch.save(weights, out / f"{case}.pt")


def run(out: Path, case: str) -> None:
    kind, ranks = case.split("-")
    ranks = int(os.environ.get("WORLD_SIZE", "1")) if ranks == "world" else int(ranks)
    if kind == "scores":
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        scores(out, ranks)
    else:
        fit(out, case, ranks)


if __name__ == "__main__":
    run_cases(run)

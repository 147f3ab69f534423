"""Runs under ``torchrun`` (two processes, gloo): the GRPO skeleton scores each rank's own rewards with
``advantage_scale: global``; rank ``r`` writes ``OUT/global.rank<r>.pt`` (its rewards and advantages).

    torchrun --standalone --nproc_per_node 2 tests/parallel/advantages_probe.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "modules"))  # the toy skeleton of the module tests
from doubles import LinearPolicy, ToyGRPO, samples  # noqa: E402

from app.settings import GRPOSettings  # noqa: E402
from app.types import RewardOutput  # noqa: E402

REWARDS = {  # two groups of K = 3 per rank, on very different scales, so the global std differs from each rank's
    0: [1.0, 2.0, 6.0, 5.0, 5.0, 4.0],
    1: [30.0, -10.0, 12.0, 0.5, 0.25, 0.0],
}


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    module = ToyGRPO(LinearPolicy(), grpo=GRPOSettings(advantage_scale="global"))
    total = torch.tensor(REWARDS[rank])
    advantages = module._scored(RewardOutput(total, {"value": total}), samples()).advantages
    torch.save({"rewards": total, "advantages": advantages}, out / f"global.rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

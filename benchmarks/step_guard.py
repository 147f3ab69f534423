"""What the non-finite step guard costs (:mod:`app.modules.finite_step`, ``restore_nonfinite_steps: true``): the time
of an AdamW step with the guard's copy and check against a plain step, and the bytes the copy holds.

    python benchmarks/step_guard.py                      # about 30 s on 2 shared cores
    python benchmarks/step_guard.py --hidden 2048 --steps 10

The model is ``--blocks`` x [Linear(h, 4h), Linear(4h, h)] in float32 (``--hidden 1024``: 8.4 M parameters per block
pair, 4 pairs by default), every parameter trainable (full fine-tuning: the guard's worst case; under LoRA it copies
only the adapters). Each step gets fresh random gradients; guarded and plain steps alternate, so load from other
processes falls on both alike. The table shows the median step time of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from app.modules.finite_step import FiniteStepGuard  # noqa: E402


def model(hidden: int, blocks: int) -> nn.Module:
    layers = []
    for _ in range(blocks):
        layers += [nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)]
    return nn.Sequential(*layers)


def timed_step(network: nn.Module, optimizer: torch.optim.Optimizer, guard: FiniteStepGuard | None) -> float:
    for parameter in network.parameters():
        parameter.grad = torch.randn_like(parameter) * 1e-3
    start = time.perf_counter()
    if guard is not None:  # as PolicyModule.guarded_step does: one guard kept across the steps
        guard.next_step(optimizer)
        guard.snapshot()
        optimizer.step()
        if guard.nonfinite():
            guard.restore()
    else:
        optimizer.step()
    elapsed = time.perf_counter() - start
    optimizer.zero_grad(set_to_none=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each kind")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    network = model(args.hidden, args.blocks)
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-4)
    guard = FiniteStepGuard(optimizer)
    times: dict[bool, list[float]] = {True: [], False: []}
    for step in range(args.warmup + args.steps):
        for guarded in (False, True):
            elapsed = timed_step(network, optimizer, guard if guarded else None)
            if step >= args.warmup:
                times[guarded].append(elapsed)
    numel = sum(p.numel() for p in network.parameters())
    copy_bytes = 3 * numel * 4  # parameters, exp_avg, exp_avg_sq (float32); the step counters are scalars
    plain, guarded = statistics.median(times[False]), statistics.median(times[True])
    print(f"{numel / 1e6:.1f} M trainable float32 parameters, AdamW, {args.threads} threads, {args.steps} steps each")
    print(f"{'step':<10}{'median ms':>12}{'min ms':>10}{'max ms':>10}")
    for name, values in (("plain", times[False]), ("guarded", times[True])):
        print(f"{name:<10}{statistics.median(values) * 1e3:>12.1f}{min(values) * 1e3:>10.1f}{max(values) * 1e3:>10.1f}")
    print(f"guarded / plain: {guarded / plain:.2f}x; the copy holds {copy_bytes / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()

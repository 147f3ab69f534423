"""This package's GRPO step against TRL's, in alternating runs of ``grpo_step.py`` and ``trl_grpo_step.py``.

    pip install trl==1.16.0 datasets            # not a dependency of this package
    python benchmarks/against_trl.py --pairs 5 --steps 10

Each pair runs this package's benchmark and then TRL's (the next pair in the other order), each in its own process at
the same geometry and thread count, so load from other processes on a shared machine falls on both alike. A pair's
ratio is this package's median step (shared-prefix rollouts, its default) over TRL's median step, per mode; the
summary gives the medians' ranges and the ratios' minimum, median and maximum over the pairs, of the wall time (the
target) and of the process CPU time (with ``--threads 1``, the work itself, which load from other processes changes
least), and the load average (``os.getloadavg``, 1 minute) before each run, which says how far to trust the wall
times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OURS = ("| {mode} | shared prefix |", 2, 6)  # each mode's row in grpo_step.py's table, its step and CPU columns
TRLS = ("| {mode} |", 1, 3)  # the same in trl_grpo_step.py's


def median_steps(command: list[str], table: tuple[str, int, int], modes: list[str]) -> dict[str, tuple[float, float]]:
    """Run one benchmark and read each mode's median step and step CPU time (seconds) from its Markdown table."""
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    prefix, wall, cpu = table
    medians = {}
    for mode in modes:
        row = next(line for line in out.splitlines() if line.startswith(prefix.format(mode=mode)))
        cells = row.strip("|").split("|")
        medians[mode] = (float(cells[wall]), float(cells[cpu]))
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each benchmark run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=["full", "lora"], default=["full", "lora"])
    args = parser.parse_args()
    common = ["--steps", str(args.steps), "--threads", str(args.threads), "--modes", *args.modes]
    ours = [sys.executable, str(HERE / "grpo_step.py"), *common]
    trl = [sys.executable, str(HERE / "trl_grpo_step.py"), *common]
    results: list[tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]] = []
    loads: list[float] = []
    for pair in range(args.pairs):
        order = [("ours", ours, OURS), ("trl", trl, TRLS)]
        measured = {}
        for name, command, table in order if pair % 2 == 0 else order[::-1]:
            loads.append(os.getloadavg()[0])
            measured[name] = median_steps(command, table, args.modes)
        results.append((measured["ours"], measured["trl"]))
        line = ", ".join(
            f"{mode} {measured['ours'][mode][0]:.3f} s / {measured['trl'][mode][0]:.3f} s = "
            f"{measured['ours'][mode][0] / measured['trl'][mode][0]:.2f}x (CPU "
            f"{measured['ours'][mode][1] / measured['trl'][mode][1]:.2f}x)"
            for mode in args.modes
        )
        print(f"pair {pair + 1}: {line}", flush=True)
    print(
        f"\n{args.threads} threads, {args.steps} steps per run; load average before the runs: {min(loads):.1f}-"
        f"{max(loads):.1f}"
    )
    print("| mode | time | pairs of runs | this package, step (s) | TRL, step (s) | ratio, median | ratio, min-max |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for mode in args.modes:
        for index, kind in enumerate(("wall", "CPU")):
            mine, theirs = [r[0][mode][index] for r in results], [r[1][mode][index] for r in results]
            ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
            print(
                f"| {mode} | {kind} | {len(results)} | {min(mine):.3f}-{max(mine):.3f} | "
                f"{min(theirs):.3f}-{max(theirs):.3f} | {statistics.median(ratios):.2f}x | "
                f"{min(ratios):.2f}x-{max(ratios):.2f}x |"
            )


if __name__ == "__main__":
    main()

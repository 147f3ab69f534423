"""OT-GRPO (The Art of Interrogation): does label-free consistency training recover most of what accuracy training gives?

    python benchmarks/repro/ot_grpo.py 0 1 2 [--out runs/repro/ot_grpo] [--steps 300] [--reuse]

Per seed S, in ``<out>/seed<S>``: the quickstart CoT-SFT (``configs/quickstart_sft.yaml``) once, then from that one
policy, with the same paired data (``configs/consistency_dots.yaml``: the same pairs, steps, batch of 4 pairs, K = 8,
learning rate, no KL), three GRPO runs that differ only in the reward:

- (a) ``accuracy``: accuracy + format reward (reads the labels);
- (b) ``minimal``: label-free consistency with minimal (optimal-transport) pairing + format reward (OT-GRPO);
- (c) ``random``: the same consistency reward with random pairing;
- (d) no RL: the SFT policy itself, i.e. the runs' held-out accuracy before training.

Held-out accuracy is greedy ``val/acc`` on the same paired validation prompts (originals and twins) for all four.
Every twin is the image mirrored (``--transforms hflip --transform-prob 1.0``), so every pair is a negation pair: the
quickstart SFT never sees the swapped question, and with the recipe's default mix (``--transforms hflip swap_objects
--transform-prob 0.5``) it answers a swapped question as if it were the original one, so consistency training settles
on answers by wording (the section written to ``docs/results.md`` gives the numbers). Writes the table, the checks of
the claim and the command to the ``ot-grpo`` section.
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from common import (
    StageResult,
    command_line,
    default_jobs,
    fmt,
    for_seeds,
    in_parallel,
    mean_std,
    run_stage,
    wall_time,
    write_section,
)

KEY = "val/acc"
GRPO = "consistency_dots.yaml"
SFT = "quickstart_sft.yaml"
FORMAT = {"class_path": "app.rewards.FormatReward", "init_args": {"weight": 0.5}}


def consistency(pairing: str) -> dict:
    return {
        "class_path": "app.rewards.consistency.ConsistencyReward",
        "init_args": {"answer_type": "bool", "pairing": pairing, "weight": 1.0},
    }


# Condition -> its reward list; everything else is shared.
REWARDS = {
    "accuracy": [{"class_path": "app.rewards.AccuracyReward", "init_args": {"weight": 1.0}}, FORMAT],
    "minimal": [consistency("minimal"), FORMAT],
    "random": [consistency("random"), FORMAT],
}
LABELS = {
    "none": "(d) no RL (SFT)",
    "accuracy": "(a) accuracy GRPO",
    "minimal": "(b) consistency, minimal (OT)",
    "random": "(c) consistency, random",
}


@dataclass(frozen=True)
class SeedResult:
    seed: int
    acc: dict[str, float]  # condition (including "none") -> held-out accuracy
    reused: int  # stages read from an earlier run (--reuse)
    seconds: float  # wall time of this seed's stages, from the runs that produced them (NaN if unknown)


def grpo_overrides(policy: Path, args: argparse.Namespace, condition: str) -> list[str]:
    return [
        f"model.init_args.policy.init_args.model={policy}",
        f"model.init_args.rewards={json.dumps(REWARDS[condition])}",
        f"trainer.max_steps={args.steps}",
        f"trainer.val_check_interval={args.steps}",  # validate once at the end (plus before: validate_before_and_after)
        f"data.init_args.dataset.init_args.transforms={json.dumps(args.transforms)}",
        f"data.init_args.dataset.init_args.transform_prob={args.transform_prob}",
        f"data.init_args.val_size={args.val_pairs}",
        *args.set,
    ]


def run_seed(seed: int, args: argparse.Namespace) -> SeedResult:
    folder = Path(args.out).resolve() / f"seed{seed}"
    # The seed also draws the embedded model's random weights, so every seed is its own SFT start.
    sft_args = [f"model.init_args.policy.init_args.seed={seed}"]
    sft = run_stage(SFT, seed, folder, sft_args, reuse=args.reuse, seed_module=False)
    seconds, reused = sft.seconds, int(sft.reused)
    policy = folder / "runs" / SFT.removesuffix(".yaml") / "policy"

    def condition_run(condition: str) -> StageResult:
        overrides = grpo_overrides(policy, args, condition)
        result = run_stage(
            GRPO, seed, folder / condition, overrides, log_name=condition, reuse=args.reuse, seed_module=False
        )
        print(f"seed {seed} {condition}: {KEY} {result.before[KEY]:.3f} -> {result.after[KEY]:.3f}", flush=True)
        return result

    acc, before = {}, {}
    for condition, result in in_parallel(condition_run, list(REWARDS)).items():
        seconds, reused = seconds + result.seconds, reused + int(result.reused)
        acc[condition], before[condition] = result.after[KEY], result.before[KEY]
    if max(before.values()) - min(before.values()) > 1e-6:  # the same policy on the same prompts, greedy
        raise SystemExit(f"seed {seed}: the runs disagree on the SFT policy's accuracy {before}")
    acc["none"] = before["accuracy"]
    return SeedResult(seed, acc, reused, seconds)


def recovered(acc: dict[str, float]) -> float:
    """(b - d) / (a - d): the share of accuracy training's gain that consistency training recovers."""
    gain = acc["accuracy"] - acc["none"]
    return (acc["minimal"] - acc["none"]) / gain if gain else float("nan")


def verdict(differences: list[float]) -> str:
    """Reproduced in direction when the mean difference is positive; "mixed" when some seeds disagree."""
    mean, wins = mean_std(differences)[0], sum(d > 0 for d in differences)
    if mean <= 0:
        return "**not reproduced**"
    if wins == len(differences):
        return "**reproduced** in direction (every seed)"
    return f"**mixed**: positive on the mean, but in only {wins} of {len(differences)} seeds"


def report(results: list[SeedResult], args: argparse.Namespace) -> str:
    conditions = ["none", "accuracy", "minimal", "random"]
    seeds = [r.seed for r in results]
    values = {c: [r.acc[c] for r in results] for c in conditions}
    means = {c: mean_std(values[c])[0] for c in conditions}
    rows = [
        "| condition | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± std |",
        "|---|" + "---|" * (len(seeds) + 1),
    ]
    for c in conditions:
        rows.append(f"| {LABELS[c]} | " + " | ".join(f"{v:.3f}" for v in values[c]) + f" | {fmt(values[c])} |")
    b_minus_d = [r.acc["minimal"] - r.acc["none"] for r in results]
    b_minus_c = [r.acc["minimal"] - r.acc["random"] for r in results]
    per_seed_fraction = [recovered(r.acc) for r in results]
    fraction = recovered(means)
    n_reused = sum(r.reused for r in results)
    reused = f"; {n_reused} of {4 * len(seeds)} stages read back from an earlier run" if n_reused else ""
    overridden = f" Overrides of every GRPO run: `{' '.join(args.set)}`." if args.set else ""
    wall = sum(r.seconds for r in results)
    checks = [
        f"- (b) > (d), consistency training beats no RL: {verdict(b_minus_d)}; b - d = {fmt(b_minus_d)}.",
        f"- (b) > (c), minimal pairing beats random pairing: {verdict(b_minus_c)}; b - c = {fmt(b_minus_c)}.",
        f"- (b) recovers at least half of (a)'s gain over (d): "
        f"{'**reproduced**' if fraction >= 0.5 else '**not reproduced**'}; (b - d) / (a - d) = "
        f"{fraction:.2f} from the means (per seed: {', '.join(f'{v:.2f}' for v in per_seed_fraction)}).",
    ]
    return "\n".join(
        [
            "## OT-GRPO: label-free consistency vs accuracy rewards",
            "",
            f"`{command_line()}` ({len(seeds)} seeds; {wall_time(args.jobs)}; the stages themselves took "
            f"{wall / 60:.1f} min{reused}).",
            "",
            f"From one quickstart CoT-SFT policy per seed, {args.steps} GRPO steps each on the same paired dots data "
            f"(`configs/consistency_dots.yaml`: 4 pairs per step, K = 8, lr 2e-4, no KL; twin transforms "
            f"{', '.join(args.transforms)}, each with probability {args.transform_prob}), differing only in the reward. "
            f"Greedy held-out accuracy (`{KEY}`) on the same {2 * args.val_pairs} validation prompts (originals and "
            f"twins); mean ± sample std over the seeds.{overridden}",
            "",
            *rows,
            "",
            *checks,
            "",
            FINDINGS,
        ]
    )


FINDINGS = """**What we found.** Single runs are marked as such; the per-kind and per-pair figures were measured with a
throw-away greedy-decoding script (not in the repository) on the same validation prompts. These findings come from the runs of
2026-12-02, before rollouts moved to inverse-transform sampling; their seed figures and "the table" refer to that
table: (d) 0.762 / 0.803 / 0.790, (a) 0.875 / 0.858 / 0.853, (b) 0.868 / 0.770 / 0.825, (c) 0.738 / 0.623 / 0.835 for
seeds 0-2. In the rerun above seed 0 rises and seed 1 falls again, as then, and seed 2 falls too, so the verdicts
are now "not reproduced" where they were "mixed"; the per-pair diagnosis below was not repeated on the rerun.

- *The earlier collapse of consistency training (0.640 -> 0.480) came from the SFT start, not from the reward.* The quickstart SFT only ever
  sees "Is the red dot left of the blue dot?"; asked the swapped question it answers as if it were the original one
  (seed-0 SFT policy: originals 0.735, mirrored twins 0.80, swapped-question twins 0.24, mirrored and swapped 0.23).
  With the recipe's default twins (mirror and object swap, each with probability 1/2) half the pairs pit the image
  against the wording, and minimal-consistency GRPO settles them by wording (single run: `python -m app fit --config
  configs/consistency_dots.yaml --trainer.max_steps 200` from the seed-0 quickstart SFT policy, 100 validation pairs).
- *An SFT on both wordings did not give a usable start at this size* (single runs of `configs/quickstart_sft.yaml` on
  `PairedDotsDataset`): after 300 steps of 8 pairs it answered "yes" to every prompt (0.52); after 400 steps of 16
  pairs it reached 0.605 but answered "no" to 96 % of the swapped questions, a wording shortcut learned by SFT itself.
- *So the twins keep the wording the start knows and only mirror the image* (`PairedDotsDataset(transforms=["hflip"])`,
  a new option), *and every twin is mirrored* (`transform_prob` 1): every pair is then a negation pair, where a fixed
  answer per wording is never consistent. With the mirror at probability 1/2, half the twins are the same prompt asked
  again, which rewards mere agreement; single run, seed 0, `--transform-prob 0.5`: (d) 0.743, (a) 0.885, (b) 0.805,
  (c) 0.770, recovered fraction 0.44 (seed 0 with every twin mirrored, in the table: 0.93).
- *Why the seeds disagree.* Consistency cannot tell right from wrong: a policy that is wrong on both views of a scene is
  as consistent as one that is right on both. Training makes the greedy answers of the two views agree (pairs
  consistent 0.615 -> 0.805 on seed 0, 0.655 -> 0.830 on seed 1), and the pairs the SFT start answered inconsistently
  are resolved to whichever side the joint majority of the 2K samples favours. On seed 0 they went to the right side
  (consistent and right 0.570 -> 0.770, consistent and wrong 0.045 -> 0.035); on seed 1 a good share went to the wrong
  one (consistent and right 0.630 -> 0.685, consistent and wrong 0.025 -> 0.145), so accuracy fell. Random pairing
  rewards agreement with one random partner, a far noisier signal: it drifted furthest (0.623 on seed 1) and spread
  most over the seeds, though on seed 2 it ended above minimal pairing.
- *A smaller learning rate did not fix it.* The same three seeds at lr 1e-4 (`--set model.init_args.optimizer.learning_rate=1e-4`,
  same SFT starts): (a) 0.869 ± 0.026, (b) 0.817 ± 0.052, (c) 0.813 ± 0.034, (d) 0.785 ± 0.020; seed 1 still fell
  (0.803 -> 0.757), the recovered fraction was 0.38 and minimal beat random on 1 seed of 3."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--out", default="runs/repro/ot_grpo")
    parser.add_argument("--steps", type=int, default=300, help="GRPO steps of every condition")
    parser.add_argument("--val-pairs", type=int, default=200, help="validation pairs (twice as many prompts)")
    parser.add_argument("--transforms", nargs="+", default=["hflip"], help="the twins' transforms")
    parser.add_argument("--transform-prob", type=float, default=1.0, help="probability of each twin transform")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE override of every GRPO run")
    parser.add_argument("--reuse", action="store_true", help="reuse finished stages (their summary.json)")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing docs/results.md")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="seeds run at once (default: one per core)")
    args = parser.parse_args()
    results = for_seeds(functools.partial(run_seed, args=args), args.seeds, args.jobs)
    section = report(results, args)
    print(section) if args.no_write else write_section("ot-grpo", section)


if __name__ == "__main__":
    main()

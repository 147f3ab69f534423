"""CoRe (TriSR), claim: GRPO with the TriSR reward beats GRPO with the task-accuracy reward alone on triplets.

    python benchmarks/repro/core_trisr.py 0 1 2 [--out runs/repro/core_trisr]

Task: dot triplets (``app.tasks.dots.TripletDotsDataset``: three images of 1-6 dots, "which image has more dots?" for
each pair). The random-weight tiny model does not write the structured triplet response by itself, so per seed, in
``<out>/seed<S>/<arm>``, both arms start from one format-teaching stage:

- ``sft``: CoT-SFT on the triplet targets (``configs/trisr_dots_sft.yaml``) for ``--sft-steps``;
- ``trisr``: GRPO (``configs/trisr_dots_grpo.yaml``) with ``R_task + 0.2 R_ag + 0.2 R_ja + 0.3 R_tc`` + format;
- ``task_only``: the same GRPO with ``R_task`` (``TripletTaskReward``) + format: same steps, data and seed.

Held-out overall and partial triplet accuracy, the consistency term ``R_tc`` (in [-1, 1]), attribute grounding and
judgment alignment are printed per seed and written, with mean ± sample std, to the ``core-trisr`` section of
``docs/results.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from common import (
    StageResult,
    command_line,
    default_jobs,
    fmt,
    for_seeds,
    in_direction,
    in_parallel,
    run_stage,
    wall_time,
    write_section,
)

METRICS = {
    "triplet_overall_accuracy": "overall acc.",
    "triplet_partial_accuracy": "partial acc.",
    "triplet_consistency": "consistency R_tc",
    "attribute_grounding": "grounding R_ag",
    "judgment_alignment": "alignment R_ja",
    "format": "format",
}
CLAIM_METRICS = ("triplet_overall_accuracy", "triplet_partial_accuracy", "triplet_consistency")
ARMS = {"trisr": "GRPO, TriSR reward", "task_only": "GRPO, task-accuracy reward only", "sft": "SFT start (no GRPO)"}
FORMAT = {"class_path": "app.rewards.FormatReward", "init_args": {"weight": 0.5}}
TASK_ONLY_REWARDS = [{"class_path": "app.rewards.trisr.TripletTaskReward", "init_args": {"weight": 1.0}}, FORMAT]

DIAGNOSIS = (
    "Reading (seeds 0-2 at the default steps, 2026-12-03): neither GRPO arm improves on its SFT start on seeds 0 "
    "and 1 (partial accuracy 0.563 → 0.367 / 0.000 and 0.530 → 0.480 / 0.207 for TriSR / task only); seed 2's SFT "
    "start is weak (0.217) and both arms rise from it (0.437 / 0.530). The sampled completions (temperature 1) "
    "score below the greedy ones (task-only arm: `train/reward/triplet_task` 0.00-0.27 over the first 30 steps, "
    "against greedy partial accuracies of 0.22-0.56 at its starts), and at lr 2e-4 both arms drift towards answers "
    "that ignore the images: TriSR's arm ends perfectly consistent on seeds 1 and 2 (R_tc 1.0) with overall / "
    "partial accuracy near what one fixed transitive ordering scores (1/6 and 1/2), and with R_tc 0 on seed 0; the "
    "task-only arm ends with R_tc 0 on every seed (answers whose 1-2 and 2-3 directions disagree, which R_tc "
    "leaves undecided) and loses the count lines on seeds 0 and 2 (grounding 0.66 → 0.27 and 0.63 → 0.00), which "
    "TriSR's arm keeps (0.59-0.65 on every seed). So the structured terms keep the response structured and, on two "
    "seeds of three, consistent, which is what the TriSR-minus-task-only gaps measure here; they do not show the "
    "paper's accuracy gain from better comparisons. At lr 5e-5 (`--set model.init_args.optimizer.learning_rate=5e-5`, same "
    "SFT starts, seeds 0-2; run on 2026-12-02, before inverse-transform sampling) neither arm collapsed and the "
    "two were level: overall 0.163 ± 0.040 vs 0.187 ± 0.023, partial 0.513 ± 0.043 vs 0.510 ± 0.030, R_tc 0.667 ± "
    "0.577 vs 0.583 ± 0.528 (TriSR vs task only; not reproduced)."
)


def run_seed(seed: int, out: Path, sft_steps: int, grpo_steps: int, extra: list[str]) -> dict[str, dict[str, float]]:
    folder = out / f"seed{seed}"

    def stage(config: str, arm: str, overrides: list[str]) -> StageResult:
        # The VLM modules take no seed of their own: seed_everything covers them.
        result = run_stage(config, seed, folder / arm, [*extra, *overrides], reuse=True, seed_module=False)
        print(f"seed {seed}: {arm} done ({result.seconds / 60:.1f} min)", flush=True)
        return result

    stage("trisr_dots_sft.yaml", "sft", [f"trainer.max_steps={sft_steps}"])
    grpo = [
        f"trainer.max_steps={grpo_steps}",
        f"model.init_args.policy.init_args.model={folder / 'sft' / 'runs' / 'trisr_dots_sft' / 'policy'}",
    ]
    arms = {"trisr": grpo, "task_only": [*grpo, f"model.init_args.rewards={json.dumps(TASK_ONLY_REWARDS)}"]}
    done = in_parallel(lambda arm: stage("trisr_dots_grpo.yaml", arm, arms[arm]), list(arms))
    trisr, task_only = done["trisr"], done["task_only"]
    return {
        "trisr": _metrics(trisr.after),
        "task_only": _metrics(task_only.after),
        "sft": _metrics(trisr.before),  # the GRPO stages' start, evaluated with the GRPO recipe's metrics
    }


def _metrics(summary: dict[str, float]) -> dict[str, float]:
    return {name: summary[f"val/{name}"] for name in METRICS}


def report(results: dict[int, dict[str, dict[str, float]]], sft_steps: int, grpo_steps: int, jobs: int) -> str:
    seeds = sorted(results)

    def values(arm: str, metric: str) -> list[float]:
        return [results[s][arm][metric] for s in seeds]

    lines = [
        "## CoRe (TriSR)",
        "",
        f'TriSR reward vs task-accuracy reward on dot triplets: three images of 1-6 dots, three pairwise "which has more dots?" sub-questions. Both GRPO arms start from '
        f"the same {sft_steps}-step CoT-SFT stage on the triplet targets (`configs/trisr_dots_sft.yaml`) and take "
        f"{grpo_steps} GRPO steps (`configs/trisr_dots_grpo.yaml`) with the same data and seed; only the reward "
        f"differs (TriSR: R_task + 0.2 R_ag + 0.2 R_ja + 0.3 R_tc; task only: R_task; both + 0.5 format). Greedy "
        f"completions on 100 held-out triplets; seeds {seeds}; mean ± sample std over seeds.",
        "",
        "| arm | " + " | ".join(METRICS.values()) + " |",
        "|---|" + "---|" * len(METRICS),
    ]
    for arm, label in ARMS.items():
        lines.append(f"| {label} | " + " | ".join(fmt(values(arm, m)) for m in METRICS) + " |")
    lines += ["", "Per seed (overall / partial / consistency):", "", "| seed | " + " | ".join(ARMS) + " |"]
    lines.append("|---|" + "---|" * len(ARMS))
    for s in seeds:
        cells = ["/".join(f"{results[s][arm][k]:.3f}" for k in CLAIM_METRICS) for arm in ARMS]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["", verdict(results, seeds), "", DIAGNOSIS, "", f"Command: `{command_line()}` ({wall_time(jobs)})."]
    return "\n".join(lines)


def verdict(results: dict[int, dict[str, dict[str, float]]], seeds: list[int]) -> str:
    """The claim in direction: TriSR minus task-only, paired by seed, on each accuracy and on consistency."""
    parts = []
    for metric in CLAIM_METRICS:
        gaps = [results[s]["trisr"][metric] - results[s]["task_only"][metric] for s in seeds]
        parts.append(f"{METRICS[metric]} {fmt(gaps)} ({in_direction(gaps)})")
    rises = []
    for arm in ("trisr", "task_only"):
        gains = [
            results[s][arm]["triplet_partial_accuracy"] - results[s]["sft"]["triplet_partial_accuracy"] for s in seeds
        ]
        rises.append(f"{ARMS[arm]} {fmt(gains)}")
    return (
        "Claim (TriSR beats the task-accuracy reward alone), TriSR minus task only: "
        + "; ".join(parts)
        + ". Partial accuracy after GRPO minus its SFT start: "
        + "; ".join(rises)
        + "."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--out", default="runs/repro/core_trisr")
    parser.add_argument("--sft-steps", type=int, default=300, help="steps of the format-teaching CoT-SFT stage")
    parser.add_argument("--grpo-steps", type=int, default=300, help="GRPO steps of each arm")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE override for every stage")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/results.md alone")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="seeds run at once (default: one per core)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    run = functools.partial(run_seed, out=out, sft_steps=args.sft_steps, grpo_steps=args.grpo_steps, extra=args.set)
    results = dict(zip(args.seeds, for_seeds(run, args.seeds, args.jobs), strict=True))
    markdown = report(results, args.sft_steps, args.grpo_steps, args.jobs)
    print(markdown)
    if not args.no_write:
        write_section("core-trisr", markdown)


if __name__ == "__main__":
    main()

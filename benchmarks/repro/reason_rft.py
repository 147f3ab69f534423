"""Reason-RFT with a skill to learn: do the RL stages teach a new skill that generalises better under domain shift,
and forgets less, than SFT alone?

    python benchmarks/repro/reason_rft.py 0 1 2 3 4 5 [--out runs/repro/reason_rft] [--reuse]

Per seed S, in ``<out>/seed<S>``:

0. **Generalist** (``configs/repro/reason_rft_skill_generalist.yaml``): CoT-SFT from random weights (drawn from S) on
   "Is the red dot left of the blue dot?" over large dots, small dots and large dots with two distractors. It perceives
   every domain the evaluation uses (target ``<think>red is left of blue</think><answer>yes</answer>``).
1. **The new skill**: "Is the red dot right of the blue dot?", taught on large dots only. The perception the
   reasoning names is the one the generalist has; the answer maps it the other way. Arms from the generalist, each
   reading the same number of labelled prompts (``--labelled`` = 1,600):

   - ``sft``: CoT-SFT only (``configs/repro/reason_rft_skill_sft.yaml``, 16 prompts a step);
   - ``reason_rft``: a short activation CoT-SFT (``--activation-steps`` of 16 prompts), then GRPO (accuracy + format;
     ``configs/repro/reason_rft_skill_grpo.yaml``, 8 prompts x K = 8 a step) on the rest of the prompts;
   - ``grpo_zero``: GRPO only from the generalist (Reason-RFT-Zero);
   - ``sft_time``: CoT-SFT for as many steps as take the GRPO arm's wall time (``--sft-time-steps``, set from the
     stages' measured times): equal compute, 3-4x the labelled prompts;
   - ``generalist``: no new-skill training.

Evaluated (greedy exact match, 100 held-out prompts per set) on the new skill in-domain (large dots), under shift
(small dots; distractors: domains the new skill never saw but the generalist perceives) and on the old question
(forgetting). Verdicts follow :func:`common.verdict`.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from pathlib import Path

from common import (
    StageResult,
    command_line,
    default_jobs,
    fmt,
    for_seeds,
    in_parallel,
    run_stage,
    verdict,
    wall_time,
    write_section,
)

GENERALIST, SFT, GRPO = (
    "repro/reason_rft_skill_generalist.yaml",
    "repro/reason_rft_skill_sft.yaml",
    "repro/reason_rft_skill_grpo.yaml",
)
SFT_BATCH, GRPO_BATCH = 16, 8  # prompts per optimizer step of the two recipes
SETS = {
    "new_in_domain": "new skill, in-domain",
    "new_small_dots": "new skill, small dots",
    "new_distractors": "new skill, distractors",
    "old_skill": "old skill",
}
SHIFTS = ("new_small_dots", "new_distractors")
ARMS = {
    "generalist": "generalist (no new-skill training)",
    "sft": "CoT-SFT only",
    "reason_rft": "activation SFT → GRPO (Reason-RFT)",
    "grpo_zero": "GRPO only (Reason-RFT-Zero)",
    "sft_time": "CoT-SFT only, equal compute",
}
COUNTED_EFFECT = 0.03  # an accuracy difference under 3 points would not be the paper's generalisation gain


@dataclass(frozen=True)
class ArmScores:
    """One arm's held-out accuracy per evaluation set and its stage's wall time in minutes."""

    by_set: dict[str, float]
    minutes: float

    @property
    def shift(self) -> float:
        return sum(self.by_set[name] for name in SHIFTS) / len(SHIFTS)

    def value(self, column: str) -> float:
        return self.shift if column == "shift" else self.by_set[column]

    @classmethod
    def of(cls, metrics: dict[str, float], seconds: float) -> ArmScores:
        return cls({name: metrics[f"val/{name}/acc"] for name in SETS}, seconds / 60)


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, ArmScores]:
    folder = Path(args.out).resolve() / f"seed{seed}"

    def stage(config: str, arm: str, max_steps: int, start: Path | None, evaluate: bool = True) -> StageResult:
        """One stage; ``evaluate=False`` for a stage that only exports the next one's start (no validation)."""
        overrides = [*args.set, f"trainer.max_steps={max_steps}", f"trainer.val_check_interval={max_steps}"]
        if not evaluate:
            overrides += ["validate_before_and_after=false", "trainer.limit_val_batches=0"]
        if start is not None:
            overrides.append(f"model.init_args.policy.init_args.model={start}")
        else:  # the embedded model's random weights come from the seed too
            overrides.append(f"model.init_args.policy.init_args.seed={seed}")
        result = run_stage(config, seed, folder / arm, overrides, reuse=args.reuse, seed_module=False, summary=evaluate)
        print(f"seed {seed}: {arm} done ({result.seconds / 60:.1f} min)", flush=True)
        return result

    def policy(arm: str, config: str) -> Path:
        return folder / arm / "runs" / config.removesuffix(".yaml") / "policy"

    stage(GENERALIST, "generalist", args.generalist_steps, None, evaluate=False)
    start = policy("generalist", GENERALIST)
    sft_steps = args.labelled // SFT_BATCH
    grpo_steps = args.labelled // GRPO_BATCH
    rest_steps = (args.labelled - args.activation_steps * SFT_BATCH) // GRPO_BATCH

    def arm_run(arm: str) -> tuple[StageResult, float]:
        """The arm's last stage and the minutes of all its stages."""
        if arm == "sft":  # the one arm that also evaluates its start: the generalist's scores
            result = stage(SFT, arm, sft_steps, start)
        elif arm == "sft_time":
            result = stage(SFT, arm, args.sft_time_steps, start)
        elif arm == "grpo_zero":
            result = stage(GRPO, arm, grpo_steps, start)
        else:  # reason_rft: activation, then GRPO from it
            activation = stage(SFT, "activation", args.activation_steps, start, evaluate=False)
            result = stage(GRPO, arm, rest_steps, policy("activation", SFT))
            return result, activation.seconds + result.seconds
        return result, result.seconds

    sft = arm_run("sft")
    generalist = ArmScores.of(sft[0].before, float("nan"))
    if generalist.by_set["old_skill"] < args.min_generalist:  # the design needs a start that has the old skill
        print(f"seed {seed}: the generalist did not learn (old skill {generalist.by_set['old_skill']:.2f})", flush=True)
        return {"generalist": generalist}
    runs = {"sft": sft, **in_parallel(arm_run, ["reason_rft", "grpo_zero", "sft_time"])}
    scores = {arm: ArmScores.of(result.after, seconds) for arm, (result, seconds) in runs.items()}
    return {"generalist": generalist, **scores}


def report(runs: dict[int, dict[str, ArmScores]], args: argparse.Namespace) -> str:
    results = {seed: arms for seed, arms in runs.items() if len(arms) > 1}
    excluded = {seed: arms["generalist"].by_set["old_skill"] for seed, arms in runs.items() if len(arms) == 1}
    seeds = sorted(results)
    columns = [*SETS, "shift"]
    names = [*SETS.values(), "new skill, shift mean"]

    def values(arm: str, column: str) -> list[float]:
        return [results[s][arm].value(column) for s in seeds]

    def collapsed(arm: str) -> bool:
        """The arm scores chance (0.5, what one constant answer scores on balanced sets) on every set of every seed."""
        return all(abs(results[s][arm].by_set[name] - 0.5) < 0.02 for s in seeds for name in SETS)

    def gaps(arm: str, base: str, column: str) -> list[float]:
        return [a - b for a, b in zip(values(arm, column), values(base, column), strict=True)]

    lines = [
        "## Reason-RFT: a new skill by SFT or by RL",
        "",
        f"`{command_line()}` ({len(seeds)} seeds; {wall_time(args.jobs)}).",
        "",
        f"Seeds whose generalist did not learn the old skill (held-out accuracy under {args.min_generalist}; the "
        "design needs a start that has it, so their new-skill arms are not run): "
        + (", ".join(f"{seed} ({acc:.2f})" for seed, acc in sorted(excluded.items())) or "none")
        + ". A generalist that fails answers one constant (0.50 on every set).",
        "",
        "**Design.** The paper's claim is that RL teaches a task in a way that generalises beyond the training "
        "distribution, where SFT fits the distribution it is shown. That needs a start that already perceives the "
        "shifted domains and a skill it does not have. Per seed, a generalist is CoT-SFT'd from random weights "
        f'({args.generalist_steps} steps) on "Is the red dot left of the blue dot?" over large dots, small dots and '
        'distractor scenes. The new skill is the question "Is the red dot right of the blue dot?": the reasoning '
        'names the same perception ("red is left of blue") and the answer maps it the other way; it is taught on '
        f"large dots only. Arms from the generalist, each reading {args.labelled} labelled prompts: CoT-SFT only "
        f"({sft_steps(args)} steps x {SFT_BATCH}); Reason-RFT, an activation CoT-SFT of {args.activation_steps} "
        f"steps then GRPO (accuracy + format, K = 8, lr 2e-4) on the rest; GRPO only from the generalist "
        f"(Reason-RFT-Zero, {args.labelled // GRPO_BATCH} steps x {GRPO_BATCH}); and CoT-SFT at equal compute "
        f"({args.sft_time_steps} steps, about the GRPO arm's wall time; see the minutes column). Greedy exact-match "
        "accuracy on 100 held-out prompts per set: the new skill in-domain, under shift (small dots, distractors) "
        "and the old question (forgetting). `configs/repro/reason_rft_skill_generalist.yaml`, "
        "`configs/repro/reason_rft_skill_sft.yaml`, `configs/repro/reason_rft_skill_grpo.yaml`.",
        "",
        "| arm | " + " | ".join(names) + " | stage minutes |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for arm, label in ARMS.items():
        minutes = fmt([results[s][arm].minutes for s in seeds], 1) if arm != "generalist" else "-"
        lines.append(f"| {label} | " + " | ".join(fmt(values(arm, c)) for c in columns) + f" | {minutes} |")
    lines += ["", "Per seed (" + " / ".join(SETS.values()) + "):", ""]
    lines += ["| seed | " + " | ".join(ARMS) + " |", "|---|" + "---|" * len(ARMS)]
    for s in seeds:
        cells = ["/".join(f"{results[s][arm].by_set[n]:.2f}" for n in SETS) for arm in ARMS]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    claims = [
        ("reason_rft", "sft", "shift", "Reason-RFT generalises better under shift than SFT at equal labelled prompts"),
        ("grpo_zero", "sft", "shift", "GRPO only generalises better under shift than SFT at equal labelled prompts"),
        ("reason_rft", "sft_time", "shift", "Reason-RFT generalises better under shift than SFT at equal compute"),
        ("reason_rft", "sft", "old_skill", "Reason-RFT forgets the old skill less than SFT"),
        ("grpo_zero", "sft", "old_skill", "GRPO only forgets the old skill less than SFT"),
    ]
    lines += [""]
    for arm, base, column, what in claims:
        label = dict(zip(columns, names, strict=True))[column]
        line = f"- {what}, {arm} − {base} on {label}: {verdict(gaps(arm, base, column), COUNTED_EFFECT)}"
        if collapsed(arm):
            line += (
                f"; but {ARMS[arm]} answers one constant on every set of every seed (0.50): it has collapsed, so this "
                "difference is not the claimed effect"
            )
        lines.append(line + ".")
    lines += ["", READING, "", OLD_DESIGN]
    return "\n".join(lines)


READING = """Reading: the constant answer is an attractor for GRPO from the generalist. The generalist answers the new
question with the old mapping (new skill in-domain about 0.1), so the few rewarded samples pull its answer away from
its perception before they pull it to the new mapping, and every seed ends at one answer for every prompt (its groups
then all score alike: no advantage left). A 10-step activation SFT can leave the policy at that point too (seed 0:
0.50 on every set after it), yet GRPO from there learns the mapping. Every arm that learns the new skill forgets the
old one (old question 0.02-0.05): the tiny model never needed to read the question's relation word, and none of the
arms teaches it to."""


OLD_DESIGN = """Why this design: with a stage 1 of thousands of CoT samples that already solves the task in-domain
instead of an activation, an SFT-only arm that reads many times the labels of the GRPO arm, a GRPO-only arm that starts
from a model whose samples rarely pass the format, and one task with exact in-distribution labels, a one-line chain of
thought and a purely perceptual shift, SFT would be the best teacher by construction."""


def sft_steps(args: argparse.Namespace) -> int:
    return args.labelled // SFT_BATCH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--out", default="runs/repro/reason_rft")
    parser.add_argument("--generalist-steps", type=int, default=900, help="CoT-SFT steps of the generalist")
    parser.add_argument("--labelled", type=int, default=1600, help="labelled prompts every new-skill arm reads")
    parser.add_argument("--activation-steps", type=int, default=10, help="Reason-RFT's activation SFT steps")
    parser.add_argument("--sft-time-steps", type=int, default=900, help="SFT steps at the GRPO arm's wall time")
    parser.add_argument("--min-generalist", type=float, default=0.8, help="old-skill accuracy a generalist needs")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE override for every stage")
    parser.add_argument("--reuse", action="store_true", help="reuse finished stages (their summary.json)")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave docs/results.md alone")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="stages run at once (default: one per core)")
    args = parser.parse_args()
    results = dict(
        zip(args.seeds, for_seeds(functools.partial(run_seed, args=args), args.seeds, args.jobs), strict=True)
    )
    markdown = report(results, args)
    print(markdown)
    if not args.no_write:
        write_section("reason-rft", markdown)


if __name__ == "__main__":
    main()

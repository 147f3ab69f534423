"""Flow-GRPO over seeds (VBVR-Pro): the two flow quickstarts' held-out reward before and after GRPO, per arm.

    python benchmarks/repro/flow_grpo.py 0 1 2 --task vbvr --arms cps sde    # 29.6 min on 2 cores
    python benchmarks/repro/flow_grpo.py 0 1 2 --task flow --arms cps sde    # 25.5 min on 2 cores
    python benchmarks/repro/flow_grpo.py 0 1 2 --task vbvr --arms cps sde cps_delay1 --reuse   # adds the delay arm
    python benchmarks/repro/flow_grpo.py 0 1 2 --task flow --arms window2 mixgrpo mixgrpo_flash \\
        --section flow-grpo-flow-flash
    python benchmarks/repro/flow_grpo.py 0 1 2 --task flow --arms cps nft nft_time --section flow-grpo-flow-nft
    python benchmarks/repro/flow_grpo.py 0 1 2 --task vbvr --arms cps window2 mixgrpo nft \\
        --section flow-grpo-vbvr-objectives

(times measured 2026-12-02 from empty output folders; ``--reuse`` keeps the stages already run.)

Per seed, stage 1 (the task's pretraining recipe) runs once in ``<out>/seed<S>``; every arm's GRPO stage then starts
from that same model, at equal steps and data. Arms:

- ``cps``: the quickstart recipe as it is (coefficients-preserving sampler, eta 0.7).
- ``sde``: the same with Flow-GRPO's SDE sampler at the same eta (VBVR-Pro prefers CPS).
- ``cps_delay1``: the one-step-delayed reward pipeline, scorers in a process pool
  (``configs/quickstart/vbvr_pipeline_cpu.yaml``; VBVR only).
- ``window2``: a fixed SDE window of the first 2 steps (Euler elsewhere), the baseline of MixGRPO's comparison.
- ``mixgrpo``: MixGRPO: the same 2-step window moved one step later every ``WINDOW_EVERY[task]`` optimizer steps, UniPC
  after it (``window_stride``, ``ode_tail: unipc``).
- ``mixgrpo_flash``: the same with the UniPC tail compressed to 2 steps (``ode_tail_steps: 2``).
- ``nft``: DiffusionNFT (``configs/quickstart/quickstart_flow_nft.yaml``,
  ``configs/quickstart/quickstart_vbvr_nft.yaml``) on the same model, rewards, data and steps: equal rollouts.
- ``nft_time``: the same with the step count that takes the ``cps`` arm's wall time (``EQUAL_TIME_STEPS``, from the
  two recipes' measured step times on 2 cores): equal wall time.

Prints per seed and arm the held-out reward before -> after, then mean ± sample std of the rise, and writes the table
to the ``flow-grpo-<task>`` section of ``docs/results.md``. ``--reuse`` skips stages whose ``summary.json`` exists.
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
    in_direction,
    in_parallel,
    mean_std,
    run_stage,
    wall_time,
    write_section,
)


@dataclass(frozen=True)
class Task:
    pretrain: str
    grpo: str
    key: str
    title: str
    what: str


@dataclass(frozen=True)
class Arm:
    config: str | dict[str, str] | None  # None: the task's GRPO recipe; a dict: the recipe per task
    overrides: tuple[str, ...] | dict[str, tuple[str, ...]] = ()  # a dict: per task
    what: str = ""

    def config_for(self, task: str) -> str | None:
        return self.config.get(task) if isinstance(self.config, dict) else self.config

    def overrides_for(self, task: str) -> tuple[str, ...]:
        return self.overrides.get(task, ()) if isinstance(self.overrides, dict) else self.overrides


TASKS = {
    "vbvr": Task(
        "quickstart/quickstart_vbvr_pretrain.yaml",
        "quickstart/quickstart_vbvr.yaml",
        "val/reward/vbvr_scorer",
        "Flow-GRPO on the conditioned VBVR quickstart",
        "The tiny FLUX-Kontext-style image-edit model sees each problem frame (colour mixing, object counting; "
        "in-domain and out-of-domain splits) and is rewarded by the VBVR classical-CV scorers; 200 GRPO steps "
        "of 8 prompts x 8 samples, one stochastic step after a start shared by the group. The paper's claims "
        "tested: flow-GRPO raises the verifiable reward; CPS is preferred to SDE at eta 0.7; the one-step "
        "delay of the reward pipeline costs nothing in learning.",
    ),
    "flow": Task(
        "quickstart/quickstart_flow_pretrain.yaml",
        "quickstart/quickstart_flow.yaml",
        "val/reward/color_region",
        "Flow-GRPO on the flow quickstart",
        "The tiny SD3-style text-to-image model draws a coloured shape in a named half of the image; the "
        "reward checks colour, region and shape; 100 GRPO steps of 32 prompts x 8 samples.",
    ),
}
T_975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}  # two-sided 95%, by dof
# optimizer steps between moves of the MixGRPO window: over each quickstart's steps (100 flow, 200 VBVR) the window
# takes five positions, from steps 0-1 to steps 4-5 of 8
WINDOW_EVERY = {"flow": 20, "vbvr": 40}
NFT_CONFIGS = {"flow": "quickstart/quickstart_flow_nft.yaml", "vbvr": "quickstart/quickstart_vbvr_nft.yaml"}
# DiffusionNFT steps in the cps recipe's wall time: on 2 cores, alone, a whole fit of 100 steps took 3 min 19 s with
# configs/quickstart/quickstart_flow.yaml and 3 min 32 s with configs/quickstart/quickstart_flow_nft.yaml (2026-12-04):
# 100 x 199 / 212
# VBVR: in the 3-seed run of 2026-12-05 (two stages at a time on 2 cores) the cps arm's 200-step GRPO stages took
# 5.3, 5.4, 5.4 min and the nft arm's 6.7, 6.3, 5.9 min: 200 x 5.37 / 6.30
EQUAL_TIME_STEPS = {"flow": 94, "vbvr": 170}


def moving_window(every: int, tail_steps: int | None = None) -> tuple[str, ...]:
    """MixGRPO's overrides: a 2-step SDE window from steps 0-1, moved one step later every ``every`` optimizer steps,
    UniPC after it (on ``tail_steps`` steps when given: MixGRPO-Flash)."""
    sampling = "model.init_args.sampling"
    overrides = (
        f"{sampling}.sde_window=[0, 2]",
        f"{sampling}.window_stride=1",
        f"{sampling}.window_every_n_steps={every}",
        f"{sampling}.ode_tail=unipc",
    )
    return overrides + ((f"{sampling}.ode_tail_steps={tail_steps}",) if tail_steps is not None else ())


ARMS = {
    "cps": Arm(None, what="CPS, eta 0.7 (the recipe)"),
    "window2": Arm(None, ("model.init_args.sampling.sde_window=[0, 2]",), "CPS, fixed window of steps 0-1"),
    "mixgrpo": Arm(
        None,
        {task: moving_window(every) for task, every in WINDOW_EVERY.items()},
        "CPS, MixGRPO window of 2 moving 1 step every "
        + " / ".join(f"{every} ({task})" for task, every in WINDOW_EVERY.items())
        + " steps, UniPC tail",
    ),
    "mixgrpo_flash": Arm(
        None,
        {task: moving_window(every, tail_steps=2) for task, every in WINDOW_EVERY.items()},
        "CPS, MixGRPO window as mixgrpo, UniPC tail of 2 steps (MixGRPO-Flash)",
    ),
    "sde": Arm(None, ("model.init_args.sampling.sampler=sde",), "SDE, eta 0.7"),
    "cps_delay1": Arm("quickstart/vbvr_pipeline_cpu.yaml", what="CPS, one-step-delayed rewards (process pool)"),
    "nft": Arm(NFT_CONFIGS, what="DiffusionNFT, equal rollouts"),
    "nft_time": Arm(
        NFT_CONFIGS,
        {task: (f"trainer.max_steps={steps}",) for task, steps in EQUAL_TIME_STEPS.items()},
        "DiffusionNFT, equal wall time",
    ),
}


def run_arm(task_name: str, arm_name: str, seed: int, folder: Path, reuse: bool) -> StageResult:
    """Run one arm in ``<folder>/<arm>``, where ``runs/<pretrain stem>`` links to the seed's stage-1 output (the GRPO
    recipes load it by that relative path, and each arm keeps its own grids, policy and logs)."""
    task, arm = TASKS[task_name], ARMS[arm_name]
    arm_folder = folder / arm_name
    pretrained = f"runs/{task.pretrain.removesuffix('.yaml')}"
    link = arm_folder / pretrained
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder / pretrained, target_is_directory=True)
    config, overrides = arm.config_for(task_name) or task.grpo, arm.overrides_for(task_name)
    return run_stage(config, seed, arm_folder, overrides, log_name=arm_name, reuse=reuse)


def run_seed(
    seed: int, task_name: str, arms: list[str], out: Path, reuse: bool
) -> tuple[StageResult, dict[str, StageResult]]:
    """Stage 1 once in ``<out>/seed<S>``, then every arm from it: the stage-1 result and each arm's."""
    task = TASKS[task_name]
    folder = out / f"seed{seed}"
    pre = run_stage(task.pretrain, seed, folder, reuse=reuse)
    print(
        f"seed {seed}: pretraining {pre.before.get(task.key, float('nan')):.3f} -> {pre.after[task.key]:.3f} "
        f"({pre.seconds / 60:.1f} min)",
        flush=True,
    )

    def arm_run(arm: str) -> StageResult:
        result = run_arm(task_name, arm, seed, folder, reuse)
        print(
            f"seed {seed} {arm}: {result.before[task.key]:.3f} -> {result.after[task.key]:.3f} "
            f"({result.seconds / 60:.1f} min)",
            flush=True,
        )
        return result

    return pre, in_parallel(arm_run, arms)


def paired_verdict(gaps: list[float], first: str, second: str) -> str:
    """Three verdicts from the 95% paired t interval of the per-seed gaps: ``first`` ahead (the interval above 0),
    ``second`` ahead (below 0), or inconclusive, with the smallest gap the seeds could detect at this spread."""
    if len(gaps) - 1 not in T_975:
        return f"inconclusive: {len(gaps)} seeds"
    mean, spread = mean_std(gaps)
    half = T_975[len(gaps) - 1] * spread / len(gaps) ** 0.5
    interval = f"95% interval {mean - half:+.3f} .. {mean + half:+.3f}"
    if mean - half > 0:
        return f"{first} ahead, {interval}"
    if mean + half < 0:
        return f"{second} ahead, {interval}"
    return f"inconclusive, {interval}: {len(gaps)} seeds at this spread detect only gaps above {half:.3f}"


def comparisons(results: dict[str, list[tuple[int, StageResult]]], key: str) -> list[str]:
    """The claims the arms test, from per-seed differences of the held-out reward after GRPO (same start per seed)."""
    after = {arm: [r.after[key] for _, r in rows] for arm, rows in results.items()}
    claims = []
    if "cps" in after and "sde" in after:
        gaps = [c - d for c, d in zip(after["cps"], after["sde"], strict=True)]
        claims.append(
            f"- CPS ends above SDE at eta 0.7 (VBVR-Pro's preference): CPS minus SDE {fmt(gaps)} "
            f"({in_direction(gaps)})."
        )
    for arm, what in (("mixgrpo", "moving window"), ("mixgrpo_flash", "moving window with a 2-step UniPC tail")):
        if "window2" in after and arm in after:
            gaps = [m - w for m, w in zip(after[arm], after["window2"], strict=True)]
            claims.append(
                f"- MixGRPO's {what} ends at least as high as the fixed window: {arm} minus fixed {fmt(gaps)} "
                f"(per seed {', '.join(f'{g:+.3f}' for g in gaps)}; {paired_verdict(gaps, arm, 'fixed')})."
            )
    for arm, budget in (("nft", "equal rollouts"), ("nft_time", "equal wall time")):
        if "cps" in after and arm in after:
            gaps = [n - c for n, c in zip(after[arm], after["cps"], strict=True)]
            claims.append(
                f"- DiffusionNFT ends above Flow-GRPO (CPS) at {budget} (its paper's sample-efficiency claim): "
                f"DiffusionNFT minus CPS {fmt(gaps)} (per seed {', '.join(f'{g:+.3f}' for g in gaps)}; "
                f"{paired_verdict(gaps, 'DiffusionNFT', 'CPS')})."
            )
    if "cps" in after and "cps_delay1" in after:
        gaps = [c - d for c, d in zip(after["cps_delay1"], after["cps"], strict=True)]
        claims.append(
            f"- The one-step-delayed pipeline learns as the plain step does: delay 1 minus delay 0 "
            f"{fmt(gaps)} (per seed {', '.join(f'{g:+.3f}' for g in gaps)})."
        )
    for arm, rows in results.items():
        rise = [r.after[key] - r.before[key] for _, r in rows]
        claims.append(f"- {ARMS[arm].what} raises the held-out reward: rise {fmt(rise)} ({in_direction(rise)}).")
    return claims


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--task", choices=sorted(TASKS), default="vbvr")
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["cps"])
    parser.add_argument("--out", default=None, help="default: runs/repro/flow_grpo_<task>")
    parser.add_argument("--reuse", action="store_true", help="skip stages whose summary.json exists")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="seeds run at once (default: one per core)")
    parser.add_argument("--section", default=None, help="the docs/results.md section (default: flow-grpo-<task>)")
    args = parser.parse_args()
    task = TASKS[args.task]
    if args.task != "vbvr" and "cps_delay1" in args.arms:
        parser.error("the cps_delay1 arm is the VBVR pipeline recipe: use it with --task vbvr")
    if args.task not in NFT_CONFIGS and {"nft", "nft_time"} & set(args.arms):
        parser.error(f"the DiffusionNFT arms have a recipe for --task {', '.join(NFT_CONFIGS)} only")
    out = Path(args.out or f"runs/repro/flow_grpo_{args.task}").resolve()
    run = functools.partial(run_seed, task_name=args.task, arms=args.arms, out=out, reuse=args.reuse)
    per_seed = for_seeds(run, args.seeds, args.jobs)
    stage1 = [pre for pre, _ in per_seed]
    results = {
        arm: [(seed, arms[arm]) for seed, (_, arms) in zip(args.seeds, per_seed, strict=True)] for arm in args.arms
    }

    lines = [
        f"## {task.title}" + (f": {', '.join(ARMS[arm].what for arm in args.arms)}" if args.section else ""),
        "",
        f"Command: `{command_line()}` ({wall_time(args.jobs)}).",
        "",
        task.what,
        "",
        f"Held-out `{task.key}` (deterministic Euler samples), before -> after GRPO from the same stage-1 model "
        f"per seed (`configs/{task.pretrain}`: {fmt([p.after[task.key] for p in stage1])} after it, in "
        f"{', '.join(f'{p.seconds / 60:.1f}' for p in stage1)} min); mean ± sample std over seeds. Minutes are each "
        "stage's own wall time.",
        "",
        "| arm | seeds | before | after | rise | per seed (before -> after) | GRPO minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, rows in results.items():
        before = [r.before[task.key] for _, r in rows]
        after = [r.after[task.key] for _, r in rows]
        rise = [a - b for a, b in zip(after, before, strict=True)]
        per_seed = ", ".join(f"{s}: {r.before[task.key]:.3f} -> {r.after[task.key]:.3f}" for s, r in rows)
        minutes = ", ".join(f"{r.seconds / 60:.1f}" for _, r in rows)
        lines.append(
            f"| {ARMS[arm].what} | {len(rows)} | {fmt(before)} | {fmt(after)} | {fmt(rise)} | {per_seed} | {minutes} |"
        )
    lines += ["", *comparisons(results, task.key)]
    table = "\n".join(lines)
    print("\n" + table, flush=True)
    write_section(args.section or f"flow-grpo-{args.task}", table)


if __name__ == "__main__":
    main()

"""Flow-GRPO's samplers as VBVR-Pro ablates them, on the flow quickstart (``--task flow`` of ``flow_grpo.py``).

    python benchmarks/repro/samplers.py separation 0 1 2 3 4   # stage 1 per seed, then sampling only
    python benchmarks/repro/samplers.py eta 0 1 2 3 4          # CPS at eta 0.1 / 0.3 / 0.7 / 0.9, Euler and UniPC
    python benchmarks/repro/samplers.py late 0 1 2 3 4         # CPS against SDE with a late stochastic window

Wall time: each section of docs/results.md states its summed stage minutes and the machine's load while it ran.

The three parts share ``--out`` (default ``runs/repro/samplers``): stage 1
(``configs/quickstart/quickstart_flow_pretrain.yaml``) runs once per seed in ``<out>/seed<S>`` and the later parts reuse
it; every GRPO arm starts from it (the arms are registered in ``flow_grpo.ARMS`` and run by ``flow_grpo.run_arm``), at
``GRPO_STEPS`` optimizer steps of the recipe ``configs/quickstart/quickstart_flow.yaml`` (32 prompts x 8 samples). The
recipe's 100 steps have their rise by step 50: the ``window2`` and ``mixgrpo`` arms of the ``flow-grpo-flow-flash`` run
logged at step 50 a held-out reward within 0.031 of their step-100 figure on each of their 3 seeds, equal on the mean.

- ``separation`` (no training): from each seed's stage-1 model, rollouts on the first 64 held-out prompts (K = 8, one
  starting noise per group, as the recipe) drawn with CPS and with Flow-GRPO's SDE at the same eta and with the same
  noises, for an early window (step 0, the recipe's) and later ones: the SDE / CPS noise-std ratio per step, the RMS
  distance between the CPS and SDE final latents (and each one's from the Euler sample of the same start), the
  rollouts' reward and its spread within a group (what GRPO learns from). Also CPS's spread at each eta of the sweep.
- ``eta``: GRPO arms with CPS at each eta of VBVR-Pro's ablation, the recipe's window (step 0); the trained policies
  and the no-RL start evaluated with both deterministic samplers, Euler and UniPC.
- ``late``: GRPO arms with CPS and with SDE at eta 0.7, stochastic on ``LATE_WINDOW`` only.

Evaluation: each exported policy is loaded here and samples the GRPO recipe's 128 held-out prompts from the seed's
evaluation noise with the Euler and the UniPC solver (``FlowSampler.generate``, as the module's validation does), so
one fit gives both numbers; the Euler figure repeats the fit's own ``val/reward/color_region`` (the section prints the
largest difference). Verdicts: ``common.verdict`` on paired per-seed differences. ``--reuse`` keeps finished arms
(stage 1 is always reused).
"""

from __future__ import annotations

import argparse
import functools
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import common
import torch
import yaml
from common import (
    ROOT,
    command_line,
    default_jobs,
    fmt,
    for_seeds,
    in_parallel,
    mean_std,
    run_stage,
    verdict,
    wall_time,
    write_section,
)
from flow_grpo import ARMS, TASKS, Arm, run_arm

TASK = TASKS["flow"]
GRPO_STEPS = 50
ETAS = (0.1, 0.3, 0.7, 0.9)
RECIPE_ETA = 0.7
EARLY_WINDOW = (0, 1)  # the recipe's: step 0 of 8
WINDOWS = (EARLY_WINDOW, (4, 6), (5, 6), (6, 7), (5, 7))  # measured by the separation part
SEPARATION_PROMPTS = 64  # held-out prompts of the sampling-only measures (x K = 8 trajectories each)
LATE_WINDOW = (5, 7)  # steps 5 and 6, the last two stochastic steps (chosen from the separation part, see its section)
SOLVERS = ("euler", "unipc")
EFFECT = 0.02  # the smallest gap in held-out reward counted as a paper's effect (about half VBVR-Pro's 0.039)
SAMPLING = "model.init_args.sampling"


def _steps() -> tuple[str, ...]:
    return (f"trainer.max_steps={GRPO_STEPS}",)


def _key(window: tuple[int, int]) -> str:
    """A window as a JSON key."""
    return f"{window[0]},{window[1]}"


def _window(window: tuple[int, int]) -> str:
    return f"steps {window[0]}-{window[1] - 1}" if window[1] - window[0] > 1 else f"step {window[0]}"


SAMPLER_ARMS = {
    **{
        f"eta{eta}": Arm(None, (f"{SAMPLING}.eta={eta}", *_steps()), f"CPS, eta {eta}, {_window(EARLY_WINDOW)}")
        for eta in ETAS
    },
    "cps_late": Arm(
        None,
        (f"{SAMPLING}.sde_window=[{LATE_WINDOW[0]}, {LATE_WINDOW[1]}]", *_steps()),
        f"CPS, eta {RECIPE_ETA}, {_window(LATE_WINDOW)}",
    ),
    "sde_late": Arm(
        None,
        (f"{SAMPLING}.sampler=sde", f"{SAMPLING}.sde_window=[{LATE_WINDOW[0]}, {LATE_WINDOW[1]}]", *_steps()),
        f"SDE, eta {RECIPE_ETA}, {_window(LATE_WINDOW)}",
    ),
}
ARMS.update(SAMPLER_ARMS)  # flow_grpo.run_arm finds the arms by name there
PART_ARMS = {"separation": [], "eta": [f"eta{eta}" for eta in ETAS], "late": ["cps_late", "sde_late"]}


# ---------------------------------------------------------------------------------------------------- sampling here
def _recipe_data() -> dict:
    return yaml.safe_load((ROOT / "configs" / TASK.grpo).read_text())["data"]["init_args"]


def held_out(seed: int) -> list:
    """The GRPO recipe's held-out prompts for ``seed`` (its ``val`` split), as its data module builds them."""
    from app.data import VisualTaskDataModule
    from app.tasks.dots import ShapePromptDataset

    data = _recipe_data()
    module = VisualTaskDataModule(
        functools.partial(ShapePromptDataset, labeled=False),
        val_size=data["val_size"],
        seed=seed,
        image_size=data["image_size"],
    )
    module.setup("validate")
    return [module.val_dataset[i] for i in range(len(module.val_dataset))]


_loading = threading.Lock()  # from_pretrained builds on the meta device through process-wide patches: one at a time


def load_policy(folder: Path):
    """An exported policy (merged weights), in evaluation mode; safe to call from the seeds' threads."""
    from app.models import FlowPolicy

    with _loading:
        policy = FlowPolicy(model=str(folder), lora=None)
    policy.eval()
    return policy


def score(images, samples) -> list[float]:
    """The recipe's reward (``ColorRegionReward``) of each image."""
    from app.rewards import WeightedReward
    from app.rewards.color_region import ColorRegionReward

    return WeightedReward([ColorRegionReward()])(list(images), samples).total.tolist()


def evaluate(folder: Path, seed: int, samples: list, reuse: bool = False) -> dict[str, float]:
    """Held-out reward of the policy in ``folder`` with each deterministic solver: what the fit's validation logs as
    ``val/reward/color_region`` (one batch, noise seeded by the module seed, which the repro sets to ``seed``). Kept
    beside the folder (``samplers_eval.json``), read back with ``reuse`` when newer than the policy's files."""
    from app.sampling import FlowSampler
    from app.settings import FlowGRPOSamplingSettings

    cache = folder.parent / "samplers_eval.json"
    newest = max(p.stat().st_mtime for p in folder.rglob("*"))
    if reuse and cache.is_file() and cache.stat().st_mtime > newest:
        return json.loads(cache.read_text())
    policy = load_policy(folder)
    steps = yaml.safe_load((ROOT / "configs" / TASK.grpo).read_text())["model"]["init_args"]["sampling"]["num_steps"]
    result = {}
    for solver in SOLVERS:
        sampler = FlowSampler(policy, FlowGRPOSamplingSettings(num_steps=steps, eval_sampler=solver))
        images = sampler.generate([s.question for s in samples], seed=seed)
        values = score(images, samples)
        result[solver] = sum(values) / len(values)
    cache.write_text(json.dumps(result))
    return result


@dataclass(frozen=True)
class Rollouts:
    final: object  # [N, ...] final latents
    rewards: list[float]  # [N], group-major (K per prompt)


def rollouts(policy, samples: list, seed: int, sampler: str, eta: float, window: tuple[int, int] | None) -> Rollouts:
    """K trajectories per prompt as the recipe draws them (one starting noise per group), stochastic on ``window``
    (None: Euler throughout), from starting noise and step noise seeded by ``seed`` alone: two calls with the same
    seed and window see the same noises whatever the sampler."""
    from app.sampling import FlowSampler, stochastic_steps
    from app.settings import FlowGRPOSamplingSettings

    recipe = yaml.safe_load((ROOT / "configs" / TASK.grpo).read_text())["model"]["init_args"]["sampling"]
    settings = FlowGRPOSamplingSettings(
        group_size=recipe["group_size"],
        num_steps=recipe["num_steps"],
        sampler=sampler,
        eta=eta,
        sde_window=window,
        shared_initial_noise=recipe["shared_initial_noise"],
    )
    flow = FlowSampler(policy, settings)
    k = settings.group_size
    conditioning = flow.conditioning([s.question for s in samples], k)
    sigmas = policy.sigmas(settings.num_steps).float().cpu()
    noise = flow.initial_noise(len(samples), torch.Generator().manual_seed(seed))
    stochastic = stochastic_steps(sigmas, window) if window is not None else ()
    final = flow.denoise(conditioning, noise, sigmas, stochastic, generator=torch.Generator().manual_seed(seed + 1))
    images = flow.decode(final.final)
    return Rollouts(final.final, score(images, [s for s in samples for _ in range(k)]))


def std_ratios(window: tuple[int, int], eta: float) -> list[float]:
    """SDE / CPS noise std of each stochastic step of ``window`` at ``eta`` (a property of the schedule alone)."""
    from app.models import FlowPolicy
    from app.sampling import cps_step, sde_step, stochastic_steps

    steps = yaml.safe_load((ROOT / "configs" / TASK.grpo).read_text())["model"]["init_args"]["sampling"]["num_steps"]
    sigmas = FlowPolicy("tiny-sd3", lora=None).sigmas(steps).float()
    probe = torch.zeros(1, 1)
    ratios = []
    for i in stochastic_steps(sigmas, window):
        s, s_next = float(sigmas[i]), float(sigmas[i + 1])
        cps = float(cps_step(probe, probe, s, s_next, eta, noise=probe).std[0])
        sde = float(sde_step(probe, probe, s, s_next, eta, noise=probe).std[0])
        ratios.append(sde / cps)
    return ratios


def rms(a, b) -> float:
    """Mean over trajectories of the RMS (over latent elements) of ``a - b``."""
    return float((a - b).flatten(1).pow(2).mean(1).sqrt().mean())


def group_spread(rewards: list[float], k: int) -> tuple[float, float]:
    """Mean within-group std of the rewards and the fraction of groups whose rewards differ at all (a group of equal
    rewards gives GRPO no advantage)."""
    groups = torch.tensor(rewards).view(-1, k)
    spread = groups.std(dim=1, unbiased=False)
    return float(spread.mean()), float((spread > 1e-6).float().mean())


def separation(seed: int, folder: Path) -> dict:
    """The sampling-only measures of one seed's stage-1 model (see the module docstring)."""
    samples = held_out(seed)[:SEPARATION_PROMPTS]
    policy = load_policy(folder / "runs" / TASK.pretrain.removesuffix(".yaml") / "policy")
    k = yaml.safe_load((ROOT / "configs" / TASK.grpo).read_text())["model"]["init_args"]["sampling"]["group_size"]
    euler = rollouts(policy, samples, seed, "cps", RECIPE_ETA, None)
    windows = {}
    for window in WINDOWS:
        cps = rollouts(policy, samples, seed, "cps", RECIPE_ETA, window)
        sde = rollouts(policy, samples, seed, "sde", RECIPE_ETA, window)
        if window == EARLY_WINDOW:
            cps_early = cps
        windows[_key(window)] = {
            "cps_sde": rms(cps.final, sde.final),
            "cps_euler": rms(cps.final, euler.final),
            "sde_euler": rms(sde.final, euler.final),
            "reward_cps": sum(cps.rewards) / len(cps.rewards),
            "reward_sde": sum(sde.rewards) / len(sde.rewards),
            "spread_cps": group_spread(cps.rewards, k),
            "spread_sde": group_spread(sde.rewards, k),
        }
    etas = {}
    for eta in ETAS:
        cps = cps_early if eta == RECIPE_ETA else rollouts(policy, samples, seed, "cps", eta, EARLY_WINDOW)
        etas[str(eta)] = {
            "cps_euler": rms(cps.final, euler.final),
            "reward": sum(cps.rewards) / len(cps.rewards),
            "spread": group_spread(cps.rewards, k),
        }
    return {"euler_reward": sum(euler.rewards) / len(euler.rewards), "windows": windows, "etas": etas}


# ------------------------------------------------------------------------------------------------------------ runs
def run_seed(seed: int, arms: list[str], out: Path, reuse: bool, measure: bool = False):
    """Stage 1 (always reused when there), then the arms from it (or with ``measure`` the sampling-only measures, in a
    stage slot): the stage-1 result and each arm's (or the measures)."""
    folder = out / f"seed{seed}"
    pre = run_stage(TASK.pretrain, seed, folder, reuse=True)
    print(f"seed {seed}: stage 1 {pre.after[TASK.key]:.3f} ({pre.seconds / 60:.1f} min)", flush=True)
    if measure:
        cache = folder / "separation.json"
        if reuse and cache.is_file():
            return pre, json.loads(cache.read_text())
        with common._stage_slots:  # one core's work, counted as a stage
            start = time.time()
            measures = separation(seed, folder)
            measures["seconds"] = time.time() - start
        cache.write_text(json.dumps(measures, indent=1))
        print(f"seed {seed}: {measures}", flush=True)
        return pre, measures

    def arm_run(arm: str):
        result = run_arm("flow", arm, seed, folder, reuse)
        print(
            f"seed {seed} {arm}: {result.before[TASK.key]:.3f} -> {result.after[TASK.key]:.3f} "
            f"({result.seconds / 60:.1f} min)",
            flush=True,
        )
        return result

    results = in_parallel(arm_run, arms)
    samples = held_out(seed)
    with common._stage_slots:  # one core's work, counted as a stage
        start = evaluate(folder / "runs" / TASK.pretrain.removesuffix(".yaml") / "policy", seed, samples, reuse)
        evals = {
            arm: evaluate(folder / arm / "runs" / TASK.grpo.removesuffix(".yaml") / "policy", seed, samples, reuse)
            for arm in arms
        }
    print(f"seed {seed}: start {start}, " + ", ".join(f"{a} {e}" for a, e in evals.items()), flush=True)
    return pre, (results, start, evals)


def per_seed(values: Sequence[float], seeds: Sequence[int], digits: int = 3) -> str:
    return ", ".join(f"{s}: {v:.{digits}f}" for s, v in zip(seeds, values, strict=True))


def claim(text: str, gaps: Sequence[float], seeds: Sequence[int], effect: float = EFFECT) -> str:
    gap_list = ", ".join(f"{s}: {g:+.3f}" for s, g in zip(seeds, gaps, strict=True))
    return f"- {text}: per seed {gap_list}; mean {verdict(gaps, effect)}"


def header(title: str, jobs: int, stage1: list, seeds: Sequence[int], work: float, what: str) -> list[str]:
    """The section's title, command, budget and stage-1 line; ``work`` is the part's summed stage seconds, ``what``
    says what they count."""
    return [
        f"## {title}",
        "",
        f"Command: `{command_line()}` ({wall_time(jobs)}). This part's work: {work / 60:.1f} min of {what}, one core "
        f"each, so {work / 120:.1f} min of wall time on 2 cores at the load it ran under (the machine was shared "
        "with other jobs, which slowed every stage against running alone).",
        "",
        f"Stage 1 per seed (`configs/{TASK.pretrain}`): held-out reward {fmt([p.after[TASK.key] for p in stage1])} "
        f"after it (seeds {', '.join(map(str, seeds))}; {', '.join(f'{p.seconds / 60:.1f}' for p in stage1)} min"
        f"{', reused' if all(p.reused for p in stage1) else ''}).",
        "",
    ]


def relative(row: dict) -> float:
    """How much of a window's exploration differs between the samplers: the CPS - SDE distance over the mean of
    their distances from the Euler sample (0: the same perturbation; above 1: more apart than either moves)."""
    return row["cps_sde"] / ((row["cps_euler"] + row["sde_euler"]) / 2)


def separation_section(seeds: Sequence[int], stage1: list, measures: list[dict], jobs: int) -> str:
    work = sum(p.seconds for p in stage1) + sum(m["seconds"] for m in measures)
    lines = header(
        "Flow-GRPO samplers: where CPS and SDE differ (sampling only)",
        jobs,
        stage1,
        seeds,
        work,
        f"stage 1 and sampling (sampling {per_seed([m['seconds'] / 60 for m in measures], seeds, 1)} min)",
    )
    lines += [
        "Design: each seed's stage-1 model draws the GRPO recipe's rollouts (K = 8 per prompt from one starting noise, "
        f"8 steps) on the first {SEPARATION_PROMPTS} of its held-out prompts, with CPS and with Flow-GRPO's SDE at eta "
        f"{RECIPE_ETA}, the same starting and step noises, stochastic on one window and Euler elsewhere. The samplers "
        "differ in their noise std (the SDE / CPS ratio, a function of sigma alone, is given per step of the window) "
        "and in their mean; the distances measure where that leaves the samples. Distances are RMS over latent "
        "elements (4 x 16 x 16), averaged over trajectories; relative is the CPS - SDE distance over the mean of the "
        "two samplers' distances from the Euler sample (how much of the exploration differs); rollout reward is the "
        "recipe's reward of those samples; spread is the within-group std of that reward, the signal GRPO's "
        "advantages are made of, and in brackets the fraction of groups whose rewards differ at all. Mean ± sample "
        "std over seeds.",
        "",
        "| window | SDE / CPS noise std per step | CPS - SDE distance | CPS - Euler | SDE - Euler | relative | rollout "
        "reward CPS | rollout reward SDE | spread CPS | spread SDE |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for window in WINDOWS:
        rows = [m["windows"][_key(window)] for m in measures]
        ratios = ", ".join(f"{r:.2f}" for r in std_ratios(window, RECIPE_ETA))

        def col(key: str, rows=rows) -> str:
            return fmt([r[key] for r in rows])

        def spread(key: str, rows=rows) -> str:
            return f"{fmt([r[key][0] for r in rows])} ({fmt([r[key][1] for r in rows], 2)})"

        lines.append(
            f"| {_window(window)} | {ratios} | {col('cps_sde')} | {col('cps_euler')} | {col('sde_euler')} | "
            f"{fmt([relative(r) for r in rows], 2)} | {col('reward_cps')} | {col('reward_sde')} | "
            f"{spread('spread_cps')} | {spread('spread_sde')} |"
        )
    lines += [
        "",
        f"Euler samples of the same starts: reward {fmt([m['euler_reward'] for m in measures])}. Per seed, relative "
        "separation: "
        + "; ".join(
            f"{_window(w)} {per_seed([relative(m['windows'][_key(w)]) for m in measures], seeds, 2)}" for w in WINDOWS
        )
        + ".",
        "",
        f"CPS at each eta of the sweep, {_window(EARLY_WINDOW)} (the recipe's window):",
        "",
        "| eta | CPS - Euler distance | rollout reward | spread |",
        "|---|---|---|---|",
    ]
    for eta in ETAS:
        rows = [m["etas"][str(eta)] for m in measures]
        lines.append(
            f"| {eta} | {fmt([r['cps_euler'] for r in rows])} | {fmt([r['reward'] for r in rows])} | "
            f"{fmt([r['spread'][0] for r in rows])} ({fmt([r['spread'][1] for r in rows], 2)}) |"
        )
    early = [m["windows"][_key(EARLY_WINDOW)] for m in measures]
    late = [m["windows"][_key(LATE_WINDOW)] for m in measures]
    lines += [
        "",
        claim(
            f"The late window ({_window(LATE_WINDOW)}) separates CPS from SDE more than the recipe's "
            f"({_window(EARLY_WINDOW)}): late minus early relative separation (counted from 0.2)",
            [relative(b) - relative(a) for a, b in zip(early, late, strict=True)],
            seeds,
            effect=0.2,
        ),
        claim(
            f"CPS's rollouts score above SDE's in the late window (SDE's excess noise at low sigma stays in the "
            f"sample): CPS minus SDE rollout reward, {_window(LATE_WINDOW)}",
            [r["reward_cps"] - r["reward_sde"] for r in late],
            seeds,
        ),
        claim(
            f"... and in the recipe's window, {_window(EARLY_WINDOW)}",
            [r["reward_cps"] - r["reward_sde"] for r in early],
            seeds,
        ),
    ]
    last = (LATE_WINDOW[1] - 1, LATE_WINDOW[1])  # the last stochastic step of the late window
    alone = [m["windows"][_key(last)] for m in measures]

    def mean(rows: list[dict], key: str, index: int | None = None) -> str:
        return f"{mean_std([r[key] if index is None else r[key][index] for r in rows])[0]:.3f}"

    def rel(rows: list[dict]) -> str:
        return f"{mean_std([relative(r) for r in rows])[0]:.2f}"

    lines += [
        "",
        f"Reading: on {_window(EARLY_WINDOW)} (the recipe's window) SDE's noise std is "
        f"{std_ratios(EARLY_WINDOW, RECIPE_ETA)[0]:.2f}x CPS's, yet the final samples end {mean(early, 'cps_sde')} "
        f"apart, {rel(early)} of the samplers' own move from the Euler sample: a perturbation of the first step is "
        "carried through all the steps after it. What GRPO learns from is alike there: rollout reward "
        f"{mean(early, 'reward_cps')} (CPS) against {mean(early, 'reward_sde')} (SDE), within-group spread "
        f"{mean(early, 'spread_cps', 0)} against {mean(early, 'spread_sde', 0)}. On {_window(last)} CPS barely moves "
        f"the sample ({mean(alone, 'cps_euler')} from Euler: its std is s' sin(eta pi / 2) and s' is near 0) while "
        f"SDE's std is {std_ratios(last, RECIPE_ETA)[0]:.0f}x CPS's: relative separation {rel(alone)}, and CPS's "
        f"groups barely carry a signal (spread {mean(alone, 'spread_cps', 0)} against SDE's "
        f"{mean(alone, 'spread_sde', 0)}; {mean(alone, 'spread_cps', 1)} against {mean(alone, 'spread_sde', 1)} of "
        f"the groups). The GRPO comparison takes {_window(LATE_WINDOW)}: the samplers part more there, relative to "
        f"what they explore ({rel(late)}), than on {_window(EARLY_WINDOW)} ({rel(early)}), while both still explore "
        f"(spread {mean(late, 'spread_cps', 0)} against {mean(late, 'spread_sde', 0)}); {_window(last)} alone would "
        "pit a sampler that explores against one that hardly does. SDE's extra noise at low sigma does not lower "
        f"this reward (rollout reward {mean(late, 'reward_cps')} against {mean(late, 'reward_sde')}): the colour, "
        "region and shape checks do not see the noise left in the sample, so the CPS paper's reason to prefer CPS "
        "(samples left noisy and scored lower) has no hold on this task's reward.",
        "",
        f"What step 0 alone cannot show: with {_window(EARLY_WINDOW)} the only stochastic step the two samplers' "
        "rollouts score and spread alike, so the `flow-grpo-flow` section's CPS = SDE says nothing of the low-sigma "
        "steps where their noise parts.",
    ]
    return "\n".join(lines)


def arm_table(arms: list[str], results: dict, evals: dict, seeds: Sequence[int]) -> list[str]:
    lines = [
        "| arm | seeds | Euler before -> after | Euler rise | UniPC after | per seed Euler after | per seed UniPC "
        "after | GRPO minutes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        rows = results[arm]
        before = [r.before[TASK.key] for r in rows]
        euler = [e["euler"] for e in evals[arm]]
        unipc = [e["unipc"] for e in evals[arm]]
        rise = [a - b for a, b in zip(euler, before, strict=True)]
        lines.append(
            f"| {ARMS[arm].what} | {len(rows)} | {fmt(before)} -> {fmt(euler)} | {fmt(rise)} | {fmt(unipc)} | "
            f"{per_seed(euler, seeds)} | {per_seed(unipc, seeds)} | "
            f"{', '.join(f'{r.seconds / 60:.1f}' for r in rows)} |"
        )
    return lines


def exploration(seeds: Sequence[int], out: Path) -> str:
    """The within-group spread of CPS's rollout reward at each eta, from the separation part's cached measures of
    the same seeds (empty when they are not all there)."""
    caches = [out / f"seed{seed}" / "separation.json" for seed in seeds]
    if not all(cache.is_file() for cache in caches):
        return ""
    measures = [json.loads(cache.read_text()) for cache in caches]
    spreads = ", ".join(f"{fmt([m['etas'][str(eta)]['spread'][0] for m in measures])} at {eta}" for eta in ETAS)
    return (
        f" The within-group spread of the rollouts' reward that each eta gives the stage-1 models on "
        f"{_window(EARLY_WINDOW)} (sampling-only section, same seeds): {spreads}."
    )


def eta_section(seeds, stage1, results, evals, start_evals, jobs, mismatch, out: Path) -> str:
    work = sum(r.seconds for arm in PART_ARMS["eta"] for r in results[arm])
    lines = header(
        "Flow-GRPO samplers: CPS eta sweep, evaluated with Euler and UniPC (VBVR-Pro's ablation)",
        jobs,
        stage1,
        seeds,
        work,
        "GRPO stages (stage 1 is the separation part's; the evaluations, under a minute per seed, not counted)",
    )
    lines += [
        f"Design: per seed, four GRPO arms from the same stage-1 model, {GRPO_STEPS} steps of the flow recipe "
        f"(`configs/{TASK.grpo}`: 32 prompts x 8 samples, one starting noise per group, {_window(EARLY_WINDOW)} "
        "stochastic), differing only in CPS's eta; each trained policy and the no-RL start sample the 128 held-out "
        "prompts with the deterministic Euler and UniPC solvers. Eta sets how far a rollout's one stochastic step "
        "moves from the deterministic path (the exploration GRPO credits), so the sweep shows whether more "
        "exploration buys more reward at equal steps. VBVR-Pro's reading tested: eta 0.7 gives the best "
        "held-out reward of {0.1, 0.3, 0.7, 0.9} (0.548 against 0.509 at eta 0.1), training with CPS raises the "
        "deterministic samplers' reward, and Euler and UniPC give nearly the same figures. The paper trains with "
        "every step stochastic over 30 steps; the recipe's single step 0 is the quickstart's departure (with all "
        "steps stochastic the tiny model's reward did not rise).",
        "",
        f"No-RL start: Euler {fmt([e['euler'] for e in start_evals])} "
        f"({per_seed([e['euler'] for e in start_evals], seeds)}), UniPC {fmt([e['unipc'] for e in start_evals])} "
        f"({per_seed([e['unipc'] for e in start_evals], seeds)}).",
        "",
        *arm_table(PART_ARMS["eta"], results, evals, seeds),
        "",
        f"The Euler figures are this script's own evaluation of the exported policies; they repeat the fits' "
        f"`{TASK.key}` within {mismatch:.4f}.",
        "",
        f"Verdicts (paired per seed, effect counted from {EFFECT}):",
    ]
    recipe = f"eta{RECIPE_ETA}"
    for solver in SOLVERS:
        name = "Euler" if solver == "euler" else "UniPC"
        for eta in ETAS:
            if eta == RECIPE_ETA:
                continue
            gaps = [a[solver] - b[solver] for a, b in zip(evals[recipe], evals[f"eta{eta}"], strict=True)]
            lines.append(claim(f"eta {RECIPE_ETA} ends above eta {eta}, {name}", gaps, seeds))
    for solver in SOLVERS:
        name = "Euler" if solver == "euler" else "UniPC"
        gaps = [a[solver] - b[solver] for a, b in zip(evals[recipe], start_evals, strict=True)]
        lines.append(
            claim(f"GRPO with CPS eta {RECIPE_ETA} raises the {name} reward over the no-RL start", gaps, seeds)
        )
    for who, rows in (("the no-RL start", start_evals), (f"eta {RECIPE_ETA}", evals[recipe])):
        gaps = [r["unipc"] - r["euler"] for r in rows]
        v = verdict(gaps, EFFECT)
        within = -EFFECT < v.low and v.high < EFFECT
        lines.append(
            f"- Euler and UniPC give nearly the same reward ({who}): UniPC minus Euler per seed "
            + ", ".join(f"{s}: {g:+.3f}" for s, g in zip(seeds, gaps, strict=True))
            + f"; mean {v.mean:+.3f}, 95 % CI {v.low:+.3f} to {v.high:+.3f}: "
            + (f"**within ±{EFFECT}**" if within else f"**not shown within ±{EFFECT}**")
        )
    after = {solver: {eta: mean_std([e[solver] for e in evals[f"eta{eta}"]])[0] for eta in ETAS} for solver in SOLVERS}
    best = {solver: max(ETAS, key=lambda eta, solver=solver: after[solver][eta]) for solver in SOLVERS}
    rises = "; ".join(
        f"eta {eta} {fmt([a['euler'] - b['euler'] for a, b in zip(evals[f'eta{eta}'], start_evals, strict=True)])}"
        for eta in ETAS
    )
    solver_gaps = [e["unipc"] - e["euler"] for arm in PART_ARMS["eta"] for e in evals[arm]]
    lines += [
        "",
        f"Reading: the highest mean held-out reward is at eta {best['euler']} with Euler "
        f"({after['euler'][best['euler']]:.3f}) and at eta {best['unipc']} with UniPC "
        f"({after['unipc'][best['unipc']]:.3f}). Rise over the no-RL start (Euler): {rises}. UniPC minus Euler over "
        f"all trained policies: {fmt(solver_gaps)}.{exploration(seeds, out)}",
        "",
        "What the flow quickstart sections cannot show: they train eta 0.7 only and evaluate with Euler only, so "
        "neither whether the recipe's eta is the best of VBVR-Pro's grid nor whether the two deterministic solvers "
        "agree.",
    ]
    return "\n".join(lines)


def late_context(seeds: Sequence[int], start_evals: list[dict], out: Path) -> str:
    """The other parts' figures for the same seeds, where their caches are all there: the rollouts' within-group
    spread on the late window (separation part) and the rise of CPS at the recipe's eta on step 0 (eta part)."""
    text = ""
    caches = [out / f"seed{seed}" / "separation.json" for seed in seeds]
    if all(cache.is_file() for cache in caches):
        rows = [json.loads(cache.read_text())["windows"][_key(LATE_WINDOW)] for cache in caches]
        text += (
            f" Within-group spread of the stage-1 rollouts' reward on {_window(LATE_WINDOW)} (sampling-only section): "
            f"CPS {fmt([r['spread_cps'][0] for r in rows])}, SDE {fmt([r['spread_sde'][0] for r in rows])}."
        )
    arm = f"eta{RECIPE_ETA}"
    caches = [
        out / f"seed{seed}" / arm / "runs" / TASK.grpo.removesuffix(".yaml") / "samplers_eval.json" for seed in seeds
    ]
    if all(cache.is_file() for cache in caches):
        after = [json.loads(cache.read_text())["euler"] for cache in caches]
        rise = [a - b["euler"] for a, b in zip(after, start_evals, strict=True)]
        text += (
            f" For comparison, CPS at eta {RECIPE_ETA} on {_window(EARLY_WINDOW)} (the eta sweep's arm, same starts "
            f"and steps) rose {fmt(rise)} (Euler)."
        )
    return text


def late_section(seeds, stage1, results, evals, start_evals, jobs, mismatch, out: Path) -> str:
    work = sum(r.seconds for arm in PART_ARMS["late"] for r in results[arm])
    lines = header(
        f"Flow-GRPO samplers: CPS against SDE with a late stochastic window ({_window(LATE_WINDOW)})",
        jobs,
        stage1,
        seeds,
        work,
        "GRPO stages (stage 1 is the separation part's; the evaluations, under a minute per seed, not counted)",
    )
    lines += [
        f"Design: per seed, two GRPO arms from the same stage-1 model, {GRPO_STEPS} steps of the flow recipe, eta "
        f"{RECIPE_ETA}, stochastic on {_window(LATE_WINDOW)} of 8 (Euler before), CPS in one and Flow-GRPO's SDE in "
        "the other; evaluated with Euler and UniPC as the eta sweep. The sampling-only section shows the two "
        "samplers' rollouts part there (the SDE's noise std is many times CPS's on the last stochastic step), so a "
        "preference for one of them that comes from their noise (VBVR-Pro and the CPS paper prefer CPS) can show "
        "here.",
        "",
        f"No-RL start: Euler {fmt([e['euler'] for e in start_evals])}, UniPC {fmt([e['unipc'] for e in start_evals])}.",
        "",
        *arm_table(PART_ARMS["late"], results, evals, seeds),
        "",
        f"The Euler figures repeat the fits' `{TASK.key}` within {mismatch:.4f}.",
        "",
        f"Verdicts (paired per seed, effect counted from {EFFECT}):",
    ]
    for solver in SOLVERS:
        name = "Euler" if solver == "euler" else "UniPC"
        gaps = [a[solver] - b[solver] for a, b in zip(evals["cps_late"], evals["sde_late"], strict=True)]
        lines.append(claim(f"CPS ends above SDE at eta {RECIPE_ETA}, {_window(LATE_WINDOW)}, {name}", gaps, seeds))
        for arm in PART_ARMS["late"]:
            gaps = [a[solver] - b[solver] for a, b in zip(evals[arm], start_evals, strict=True)]
            lines.append(claim(f"{ARMS[arm].what} raises the {name} reward over the no-RL start", gaps, seeds))
    early, late = std_ratios(EARLY_WINDOW, RECIPE_ETA), std_ratios(LATE_WINDOW, RECIPE_ETA)
    lines += [
        "",
        "Reading: CPS minus SDE after GRPO, "
        + ", ".join(
            f"{'Euler' if solver == 'euler' else 'UniPC'} {fmt(gaps)} (SDE ahead on {sum(g < 0 for g in gaps)} of "
            f"{len(gaps)} seeds)"
            for solver in SOLVERS
            for gaps in [[a[solver] - b[solver] for a, b in zip(evals["cps_late"], evals["sde_late"], strict=True)]]
        )
        + "; rise over the no-RL start (Euler): "
        + ", ".join(
            f"{ARMS[arm].what.split(',')[0]} "
            + fmt([a["euler"] - b["euler"] for a, b in zip(evals[arm], start_evals, strict=True)])
            for arm in PART_ARMS["late"]
        )
        + "."
        + late_context(seeds, start_evals, out),
        "",
        f"What the `flow-grpo-flow` comparison cannot show: it (CPS = SDE) has {_window(EARLY_WINDOW)} "
        f"stochastic only, where SDE's noise std is {', '.join(f'{r:.2f}' for r in early)}x CPS's and their "
        "rollouts' reward spread within a group is alike (sampling-only section); the samplers' noise models part "
        f"at low sigma ({', '.join(f'{r:.2f}' for r in late)}x on {_window(LATE_WINDOW)}), which it never samples.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=sorted(PART_ARMS))
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--out", default="runs/repro/samplers")
    parser.add_argument("--reuse", action="store_true", help="keep the GRPO arms whose summary.json exists")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="stages run at once (default: one per core)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    arms = PART_ARMS[args.part]
    measure = args.part == "separation"
    torch.set_num_threads(1)  # each seed's measures and evaluations on one core, as a stage
    run = functools.partial(run_seed, arms=arms, out=out, reuse=args.reuse, measure=measure)
    done = for_seeds(run, args.seeds, args.jobs)
    stage1 = [pre for pre, _ in done]
    if measure:
        measures = [m for _, m in done]
        text = separation_section(args.seeds, stage1, measures, args.jobs)
        print("\n" + text, flush=True)
        write_section("samplers-separation", text)
        return
    results = {arm: [runs[arm] for _, (runs, _, _) in done] for arm in arms}
    start_evals = [start for _, (_, start, _) in done]
    evals = {arm: [e[arm] for _, (_, _, e) in done] for arm in arms}
    mismatch = max(
        abs(e["euler"] - r.after[TASK.key]) for arm in arms for e, r in zip(evals[arm], results[arm], strict=True)
    )
    mismatch = max(
        [mismatch] + [abs(e["euler"] - results[arms[0]][i].before[TASK.key]) for i, e in enumerate(start_evals)]
    )
    section = eta_section if args.part == "eta" else late_section
    text = section(args.seeds, stage1, results, evals, start_evals, args.jobs, mismatch, out)
    print("\n" + text, flush=True)
    write_section("samplers-eta" if args.part == "eta" else "samplers-late-window", text)


if __name__ == "__main__":
    main()

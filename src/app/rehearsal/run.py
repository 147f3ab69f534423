"""Rehearse GPU recipes on CPU:
``python -m app rehearse --config configs/vlm/X.yaml [--config Y.yaml ...] [--out DIR]``.

For each recipe (:mod:`app.rehearsal.recipe` lists what changes): generate its data with the header's commands, then
fit as written for one step with a checkpoint, resume from that checkpoint for one more, export the policy from the
last checkpoint, and fit the float32 variant for the same two steps. Fits of recipes that run across processes run
under ``torchrun`` on two gloo processes, all recipes in one launch. Every fit carries a
:class:`~app.rehearsal.probe.RehearsalProbe`; the verdicts (:class:`Verdict`) compare its reports:

- trainable weights and optimizer state are float32 wherever compute is 16-bit;
- the share of trainable elements the two steps changed is within one percentage point of the float32 variant's;
- every logged loss is finite and no update was skipped;
- the checkpoint saved, the resumed fit reached step 2, and the export wrote a folder.

What a rehearsal cannot show: speed or memory on a GPU, CUDA kernels (Liger, flash-attn), NCCL, real checkpoints'
numerics, the recipe's real sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.command_line.console import quiet_known_noise
from app.errors import ConfigError
from app.rehearsal.recipe import Change, RehearsalPlan, float32_variant, gpu_recipes, plan_rehearsal

SHARE_POINTS = 0.01  # the changed share may differ from the float32 variant's by one percentage point
SIXTEEN_BIT = ("bfloat16", "float16")
SUMMARY = "rehearsal.json"


class FitsFailed(RuntimeError):
    """A rehearsal fit raised: its own output says why."""


@dataclass
class Stage:
    """One fit of a rehearsal, from its own config file."""

    recipe: str
    name: str  # "written", "resumed" or "float32"
    config: Path
    report: Path
    processes: int


@dataclass
class Verdict:
    recipe: str
    checks: dict[str, bool] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(self.checks.values())


def _dump(config: dict, path: Path) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def prepare(recipe: Path, out: Path) -> tuple[RehearsalPlan, list[Stage], list[Change]]:
    """The rehearsal of ``recipe`` under ``out/<recipe name>``: its plan, its three fits and the float32 changes."""
    root = out / recipe.stem
    written = plan_rehearsal(recipe, root / "written", root / "data")
    reference = plan_rehearsal(recipe, root / "float32", root / "data")
    reference_config, float32_changes = float32_variant(reference.config)
    stages = []
    for name, config, steps, run in (
        ("written", written.config, 1, root / "written"),
        ("resumed", written.config, 2, root / "written"),
        ("float32", reference_config, 2, root / "float32"),
    ):
        config = json.loads(json.dumps(config))  # a copy per stage
        config["trainer"]["max_steps"] = steps
        report = root / f"{name}.json"
        probe = {
            "class_path": "app.rehearsal.probe.RehearsalProbe",
            "init_args": {"report": str(report), "initial": str(run / "initial.pt")},
        }
        config["trainer"]["callbacks"] = [*(config["trainer"].get("callbacks") or []), probe]
        if name == "resumed":
            config["ckpt_path"] = str(run / "checkpoints" / "last.ckpt")
        if name == "float32":  # a reference: nothing of it is resumed or read but its report
            config["trainer"]["callbacks"] = [c for c in config["trainer"]["callbacks"] if not _writes_files(c)]
            config["trainer"].update(enable_checkpointing=False, logger=False)
        stages.append(Stage(recipe.stem, name, _dump(config, root / f"{name}.yaml"), report, written.processes))
    return written, stages, float32_changes


def _writes_files(callback) -> bool:
    class_path = callback.get("class_path", "") if isinstance(callback, dict) else ""
    return class_path.endswith("ModelCheckpoint") or "output_dir" in (callback.get("init_args") or {})


def generate_data(plan: RehearsalPlan) -> None:
    """Run the recipe header's ``python -m app.tasks`` commands (in this process) at the rehearsal's sizes."""
    from app.tasks.__main__ import main as tasks_main

    for args in plan.data_commands:
        tasks_main(args)


def run_fits(stages: list[Stage], timeout: float | None = None) -> None:
    """Run every stage's fit in order: under ``torchrun`` for the stages on several processes (one launch for all of
    them), in a subprocess otherwise."""
    for processes in sorted({s.processes for s in stages}):
        configs = [str(s.config) for s in stages if s.processes == processes]
        worker = [sys.executable, "-m", "app.rehearsal.worker", *configs]
        if processes > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
            command = [*launcher, "-m", "app.rehearsal.worker", *configs]
        else:
            command = worker
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        result = subprocess.run(command, env=env, timeout=timeout, check=False)
        if result.returncode != 0:
            raise FitsFailed(
                f"the rehearsal fits exited with {result.returncode} (their error is above): {' '.join(command)}"
            )


def export(stage: Stage, output_dir: Path) -> str | None:
    """Export the policy of ``stage``'s last checkpoint; None when it worked, else the error."""
    from app.command_line.commands import main as app_main

    args = ["export", "--config", str(stage.config), "--output_dir", str(output_dir)]
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when it is given args beside a command line
    try:
        app_main(args)
    except SystemExit as error:  # a ConfigError comes back as a message and exit code 1
        if error.code not in (0, None):
            return f"export exited with {error.code}"
    except Exception as error:  # noqa: BLE001 (the verdict reports it)
        return f"{type(error).__name__}: {error}"
    finally:
        sys.argv = argv
    return None if any(output_dir.glob("*")) else "export wrote nothing"


def judge(recipe: str, stages: dict[str, Stage], export_error: str | None, exported: Path) -> Verdict:
    verdict = Verdict(recipe)
    reports = {name: json.loads(s.report.read_text()) if s.report.exists() else None for name, s in stages.items()}
    written, resumed, reference = reports["written"], reports["resumed"], reports["float32"]
    verdict.checks["checkpoint saved and resumed"] = bool(written and resumed and resumed["global_step"] == 2)
    if not (written and resumed and reference):
        verdict.details["missing"] = ", ".join(n for n, r in reports.items() if r is None)
        return verdict
    sixteen_compute = any(dtype in SIXTEEN_BIT for dtype in resumed["compute"])
    stored = {**resumed["trainable"], **resumed["optimizer_state"]}
    verdict.checks["float32 master weights"] = not sixteen_compute or set(stored) == {"float32"}
    share, float32_share = resumed["changed_share"], reference["changed_share"]
    verdict.checks["changed share as float32's"] = float32_share > 0 and abs(share - float32_share) <= SHARE_POINTS
    finite = all(r["losses_finite"] and r["skipped_updates"] == 0 for r in (written, resumed, reference))
    verdict.checks["losses finite"] = finite
    verdict.checks["exported"] = export_error is None
    verdict.details.update(
        compute="+".join(sorted(resumed["compute"])),
        trainable="+".join(sorted(resumed["trainable"])),
        frozen="+".join(sorted(resumed["frozen"])) or "-",
        optimizer_state="+".join(sorted(resumed["optimizer_state"])),
        changed=f"{share:.2%}",
        float32_changed=f"{float32_share:.2%}",
        export=export_error or str(exported),
    )
    return verdict


def rehearse(recipes: list[Path], out: Path, timeout: float | None = None) -> list[Verdict]:
    """Rehearse ``recipes`` under ``out``; prints each plan's changes and the verdicts, writes
    ``out/rehearsal.json``."""
    prepared = [prepare(recipe, out) for recipe in recipes]
    for plan, _, float32_changes in prepared:
        print(changes_table(plan, float32_changes), flush=True)
        generate_data(plan)
    start = time.perf_counter()
    run_fits([stage for _, stages, _ in prepared for stage in stages], timeout=timeout)
    verdicts = []
    for plan, stages, _ in prepared:
        by_name = {s.name: s for s in stages}
        exported = out / plan.name / "exported"
        verdicts.append(judge(plan.name, by_name, export(by_name["resumed"], exported), exported))
    summary = {
        "seconds": round(time.perf_counter() - start, 1),
        "verdicts": [asdict(v) | {"passed": v.passed} for v in verdicts],
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))
    print(verdict_table(verdicts), flush=True)
    return verdicts


# ---------------------------------------------------------------------------------------------------- tables
def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def changes_table(plan: RehearsalPlan, float32_changes: list[Change]) -> str:
    rows = [(c.field, _short(c.recipe), _short(c.rehearsal), c.why) for c in plan.changes]
    rows += [(c.field, _short(c.recipe), _short(c.rehearsal), c.why) for c in float32_changes]
    widths = [max(len(r[i]) for r in rows + [("field", "recipe", "rehearsal", "why")]) for i in range(3)]
    head = f"{'field':<{widths[0]}}  {'recipe':<{widths[1]}}  {'rehearsal':<{widths[2]}}  why"
    lines = [f"rehearsal of {plan.name}: {plan.processes} process(es); everything else as written", head]
    lines += [f"{f:<{widths[0]}}  {r:<{widths[1]}}  {n:<{widths[2]}}  {w}" for f, r, n, w in rows]
    return "\n".join(lines) + "\n"


def verdict_table(verdicts: list[Verdict]) -> str:
    head = f"{'recipe':<40} {'compute':<10} {'trainable':<10} {'frozen':<10} {'changed':>8} {'float32':>8}  checks"
    lines = [head]
    for v in verdicts:
        d = v.details
        failed = [name for name, ok in v.checks.items() if not ok]
        status = "all passed" if v.passed else "FAILED: " + ", ".join(failed or ["no report"])
        lines.append(
            f"{v.recipe:<40} {d.get('compute', '-'):<10} {d.get('trainable', '-'):<10} {d.get('frozen', '-'):<10} "
            f"{d.get('changed', '-'):>8} {d.get('float32_changed', '-'):>8}  {status}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m app rehearse",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--config", action="append", type=Path, help="a GPU recipe (repeatable)")
    parser.add_argument("--all", type=Path, metavar="FOLDER", help="every GPU recipe of FOLDER (configs/)")
    parser.add_argument("--out", type=Path, default=Path("runs/rehearsal"), help="where the rehearsals write")
    args = parser.parse_args(argv)
    recipes = list(args.config or []) + (gpu_recipes(args.all) if args.all else [])
    if not recipes:
        parser.error("name a recipe with --config, or a folder with --all")
    missing = [str(p) for p in recipes if not p.is_file()]
    if missing:
        parser.error(f"no such recipe: {', '.join(missing)}")
    args.out.mkdir(parents=True, exist_ok=True)
    quiet_known_noise()
    try:
        verdicts = rehearse(recipes, args.out)
    except (ConfigError, FitsFailed) as error:
        sys.stderr.write(f"error: {error}\n")
        raise SystemExit(1) from None
    if not all(v.passed for v in verdicts):
        raise SystemExit(1)

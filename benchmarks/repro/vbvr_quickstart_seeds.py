"""The conditioned VBVR quickstart over several seeds: both stages per seed, the held-out reward before and after GRPO.

    OMP_NUM_THREADS=1 python benchmarks/repro/vbvr_quickstart_seeds.py 0 1 2 [--out runs/vbvr_seeds] [--set KEY=VALUE]

Each seed runs ``configs/quickstart_vbvr_pretrain.yaml`` then ``configs/quickstart_vbvr.yaml`` in its own folder
(``<out>/seed<S>``: the recipes' relative ``runs/...`` paths land there) with ``seed_everything``, the module seed and the
data seed set to S, and reads the GRPO stage's ``summary.json``. Prints each seed's held-out ``val/reward/vbvr_scorer``
(and per split / task), then the mean and the sample standard deviation of before, after and the rise. ``--set`` adds
CLI overrides to both stages (e.g. ``--set trainer.max_steps=20``); ``--grpo-set`` / ``--pretrain-set`` to one;
``--reuse-pretrained`` skips stage 1 of a seed whose folder already holds its result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY = "val/reward/vbvr_scorer"


def run_stage(config: str, seed: int, folder: Path, overrides: list[str]) -> float:
    args = [sys.executable, "-m", "app", "fit", "--config", str(ROOT / "configs" / config),
            "--seed_everything", str(seed), "--model.init_args.seed", str(seed), "--data.init_args.seed", str(seed),
            "--trainer.enable_progress_bar", "false"]  # fmt: skip
    for item in overrides:
        key, _, value = item.partition("=")
        args += [f"--{key}", value]
    start = time.time()
    log = folder / f"{config.removesuffix('.yaml')}.log"
    with log.open("w") as out:
        code = subprocess.run(args, cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy()).returncode
    if code:
        raise SystemExit(f"seed {seed}: {config} failed (exit {code}), see {log}")
    return time.time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--out", default="runs/vbvr_quickstart_seeds")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE override for both stages")
    parser.add_argument("--pretrain-set", action="append", default=[])
    parser.add_argument("--grpo-set", action="append", default=[])
    parser.add_argument(
        "--reuse-pretrained", action="store_true", help="skip stage 1 where <out>/seed<S> holds its exported policy"
    )
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        folder = Path(args.out).resolve() / f"seed{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        pretrained = folder / "runs/quickstart_vbvr_pretrain/policy/model_index.json"
        if args.reuse_pretrained and pretrained.exists():
            t_pre = float("nan")  # stage 1 of this seed ran before: reused
        else:
            t_pre = run_stage("quickstart_vbvr_pretrain.yaml", seed, folder, args.set + args.pretrain_set)
        t_grpo = run_stage("quickstart_vbvr.yaml", seed, folder, args.set + args.grpo_set)
        summary = json.loads((folder / "runs/quickstart_vbvr/summary.json").read_text())
        before, after = summary["before"], summary["after"]
        rows.append((seed, before[KEY], after[KEY]))
        groups = sorted(k for k in after if k.count("/") == 3 and not k.startswith("val/failed"))
        detail = ", ".join(f"{k[4:]} {before.get(k, float('nan')):.3f}->{after[k]:.3f}" for k in groups)
        print(f"seed {seed}: {KEY} {before[KEY]:.3f} -> {after[KEY]:.3f} (pretrain {t_pre / 60:.1f} min, "
              f"GRPO {t_grpo / 60:.1f} min; {detail})", flush=True)  # fmt: skip

    def stats(values: list[float]) -> str:
        spread = statistics.stdev(values) if len(values) > 1 else float("nan")
        return f"{statistics.mean(values):.3f} ± {spread:.3f}"

    print(f"\n{len(rows)} seed(s) {[r[0] for r in rows]}: before {stats([r[1] for r in rows])}, after "
          f"{stats([r[2] for r in rows])}, rise {stats([r[2] - r[1] for r in rows])} (mean ± sample std)")  # fmt: skip


if __name__ == "__main__":
    main()

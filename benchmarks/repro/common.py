"""What every reproduction script shares: run one recipe stage for one seed, read its summary, aggregate over seeds,
and write a claim's section of ``docs/results.md``.

Seeds are independent: ``for_seeds`` starts them all at once and lets at most ``--jobs`` stages run at a time (one per
core by default; each stage on one thread unless ``OMP_NUM_THREADS`` says otherwise), so a stage waits only for a free
core and three seeds on 2 cores take about one and a half seeds' time. Each stage runs ``python -m app fit`` in a
subprocess inside the seed's own folder, so the recipes' relative ``runs/...`` paths (and the stage-2 recipes' ``model:
runs/<stage1>/policy`` starts) land in that folder. The recipe's ``seed_everything``, module seed and data seed are all
set to the seed; a stage whose ``summary.json`` is already there is reused when ``reuse`` is true (rerunning a script
after an interruption skips finished work); its wall time is read from ``<log name>.seconds`` beside its log.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results.md"
STARTED = time.time()  # the script's start: its wall time goes into the results document
_stage_slots = threading.BoundedSemaphore(1)  # stages (subprocesses) allowed at once; for_seeds sets it to --jobs


@dataclass(frozen=True)
class StageResult:
    """One finished ``fit``: its held-out metrics before and after, its wall time (kept beside its log, so a reused
    stage still reports what it cost; NaN when unknown) and whether it was read back from an earlier run."""

    before: dict[str, float]
    after: dict[str, float]
    seconds: float
    reused: bool = False


def run_stage(
    config: str,
    seed: int,
    folder: Path,
    overrides: Sequence[str] = (),
    *,
    run_dir: str | None = None,
    log_name: str | None = None,
    reuse: bool = False,
    seed_module: bool = True,
    seed_data: bool = True,
    summary: bool = True,
) -> StageResult:
    """Run ``configs/<config>`` for ``seed`` in ``folder``; return its ``summary.json``.

    ``summary=False`` is for a stage run with ``validate_before_and_after=false`` (one that only exports a start for
    the next): it writes no summary, so its result has no metrics and a finished run (its ``.seconds`` file) is reused.

    ``overrides`` are ``KEY=VALUE`` CLI options (``model.init_args.optimizer.learning_rate=1e-4``). ``run_dir`` is the
    folder (relative to ``folder``) holding ``summary.json`` -- the recipe's ``runs/<config stem>`` unless given.
    """
    stem = config.removesuffix(".yaml")
    log_name = log_name or stem
    summary_path = folder / (run_dir or f"runs/{stem}") / "summary.json"
    seconds_path = folder / f"{log_name}.seconds"
    if reuse and not summary and seconds_path.is_file():
        return StageResult({}, {}, float(seconds_path.read_text()), reused=True)
    if reuse and summary_path.is_file():
        seconds = float(seconds_path.read_text()) if seconds_path.is_file() else float("nan")
        return _read(summary_path, seconds, reused=True)
    folder.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "app",
        "fit",
        "--config",
        str(ROOT / "configs" / config),
        "--seed_everything",
        str(seed),
        "--trainer.enable_progress_bar",
        "false",
    ]
    if seed_module:
        args += ["--model.init_args.seed", str(seed)]
    if seed_data:
        args += ["--data.init_args.seed", str(seed)]
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"override {item!r} is not KEY=VALUE")
        args += [f"--{key}", value]
    summary_path.unlink(missing_ok=True)
    log = folder / f"{log_name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with _stage_slots, log.open("w") as out:
        start = time.time()  # once a slot is free: the stage's own time, not its wait
        code = subprocess.run(args, cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        seconds = time.time() - start
    if code:
        raise SystemExit(f"seed {seed}: {config} failed (exit {code}), see {log}")
    seconds_path.write_text(f"{seconds:.1f}\n")
    return _read(summary_path, seconds) if summary else StageResult({}, {}, seconds)


def stage_slot() -> threading.BoundedSemaphore:
    """The slot a stage holds while it runs: in-process work (an evaluation script) takes one too, so that
    ``--jobs`` bounds everything that runs at once."""
    return _stage_slots


def default_jobs() -> int:
    """Seeds run at once by default: one per core."""
    return os.cpu_count() or 1


def for_seeds(run_seed: Callable[[int], T], seeds: Sequence[int], jobs: int) -> list[T]:
    """``[run_seed(s) for s in seeds]`` with every seed started at once and at most ``jobs`` stages running at a time
    (each stage is a subprocess, so threads suffice); the results keep the order of ``seeds``, and a failed seed stops
    the script once the running stages finish."""
    global _stage_slots
    if jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {jobs}")
    _stage_slots = threading.BoundedSemaphore(jobs)
    with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
        return list(pool.map(run_seed, seeds))


def in_parallel(run: Callable[[str], T], names: Sequence[str]) -> dict[str, T]:
    """``{name: run(name)}`` for independent stages of one seed (arms from the same start), started together; the
    stage slots of ``for_seeds`` bound how many run at once."""
    with ThreadPoolExecutor(max_workers=max(len(names), 1)) as pool:
        return dict(zip(names, pool.map(run, names), strict=True))


def _read(path: Path, seconds: float, reused: bool = False) -> StageResult:
    summary = json.loads(path.read_text())
    return StageResult(summary.get("before", {}), summary.get("after", {}), seconds, reused)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN spread for one value)."""
    spread = statistics.stdev(values) if len(values) > 1 else float("nan")
    return statistics.mean(values), spread


def fmt(values: Sequence[float], digits: int = 3) -> str:
    """``mean ± std`` of ``values``."""
    mean, spread = mean_std(values)
    return f"{mean:.{digits}f} ± {spread:.{digits}f}"


@dataclass(frozen=True)
class Verdict:
    """A three-way verdict on a claimed positive effect, from paired per-seed differences (effect arm minus baseline).

    ``low`` / ``high`` bound the 95 % confidence interval of the mean difference (Student's t over the seeds);
    ``detectable`` is the smallest true effect that this many seeds at this spread detect (the interval excludes 0)
    with 80 % power: ``(t_0.975 + t_0.80) * sd / sqrt(n)``.
    """

    kind: str  # "reproduced" | "not reproduced" | "inconclusive"
    mean: float
    low: float
    high: float
    detectable: float
    n: int
    effect: float

    def __str__(self) -> str:
        return (
            f"{self.mean:+.3f} (95 % CI {self.low:+.3f} to {self.high:+.3f} over {self.n} seeds; smallest effect "
            f"detectable at this spread {self.detectable:.3f}; claimed effect counted from {self.effect:.3f}): "
            f"**{self.kind}**"
        )


def verdict(gaps: Sequence[float], effect: float) -> Verdict:
    """Reproduced when the 95 % interval of the mean paired difference lies above 0; not reproduced when it lies
    below ``effect``, the smallest difference that would count as the paper's effect (an effect that large is then
    excluded at this power); inconclusive otherwise (the seeds can neither show nor exclude it)."""
    from scipy import stats

    n = len(gaps)
    mean, spread = mean_std(gaps)
    if n < 2:
        return Verdict("inconclusive", mean, float("-inf"), float("inf"), float("inf"), n, effect)
    se = spread / n**0.5
    t95, t80 = stats.t.ppf(0.975, n - 1), stats.t.ppf(0.80, n - 1)
    low, high = mean - t95 * se, mean + t95 * se
    kind = "reproduced" if low > 0 else "not reproduced" if high < effect else "inconclusive"
    return Verdict(kind, mean, low, high, (t95 + t80) * se, n, effect)


def in_direction(gaps: Sequence[float]) -> str:
    """Whether paired per-seed differences (effect minus baseline) show the claimed positive effect: on every seed,
    or on the mean with a spread smaller than it."""
    mean, spread = mean_std(gaps)
    above = sum(g > 0 for g in gaps)
    reproduced = above == len(gaps) or (mean > 0 and spread < mean)
    return f"{above}/{len(gaps)} seeds above: " + ("reproduced in direction" if reproduced else "not reproduced")


def write_section(name: str, markdown: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section between ``<!-- repro:NAME -->`` markers in ``docs/results.md``."""
    start, end = f"<!-- repro:{name} -->", f"<!-- /repro:{name} -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = path.read_text() if path.is_file() else "# Reproductions\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + f"\n\n{block}\n"
    path.write_text(text)
    print(f"wrote the {name!r} section of {path}", flush=True)


def wall_time(jobs: int) -> str:
    """How long the script has run, and on what: the figure the 30-minute budget of a reproduction is checked on."""
    return (
        f"{(time.time() - STARTED) / 60:.1f} min of wall time on {os.cpu_count()} CPU cores, "
        f"at most {jobs} stages at a time"
    )


def command_line() -> str:
    """The command that produced a table, for the results document."""
    script = Path(sys.argv[0]).resolve().relative_to(ROOT)
    return " ".join(["python", str(script), *sys.argv[1:]])

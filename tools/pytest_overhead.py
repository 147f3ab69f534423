"""What one mutant's test run costs beyond its tests: ``pytest.main`` repeated in a warm process, as mutmut runs it.

mutmut 3 forks each mutant's run from a process that has already imported torch and the package and collected the
tests, then calls ``pytest.main`` with that mutant's tests. Whatever pytest does per session is paid ~5,000 times. This
script times one cheap test's session with pytest's default plugins and with the arguments of ``[tool.mutmut]
pytest_add_cli_args`` in pyproject.toml, after warming the process up (torch imported, a first run done):

    OMP_NUM_THREADS=1 python tools/pytest_overhead.py
    OMP_NUM_THREADS=1 python tools/pytest_overhead.py --repeats 10 --test tests/sampling/test_logprobs.py

Measured here (2-core machine, idle, 2026-12-02; one numeric-reward test): 0.65 s per session with the default plugins,
0.09 s with mutmut's arguments. Almost all of the difference is the `unraisableexception` plugin's two full
``gc.collect()`` calls at the end of each session, which walk every object of a process holding torch.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for `-p tools.mutant_run_plugin` (mutmut's arguments), as from mutants/
DEFAULT_TEST = "tests/rewards/test_numeric_reward.py::test_ramp_is_monotone_and_continuous"
MUTMUT_FIXED_ARGS = ["--rootdir=.", "--tb=native", "-x", "-q", "-p", "no:randomly", "-p", "no:random-order"]


def mutmut_pytest_args(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The extra pytest arguments of every mutant run, as configured for mutmut."""
    return list(tomllib.loads(pyproject.read_text())["tool"]["mutmut"]["pytest_add_cli_args"])


def session_seconds(args: list[str], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` pytest sessions with ``args`` (output swallowed), after one untimed warm-up."""
    times = []
    for attempt in range(repeats + 1):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            exit_code = pytest.main(args)
        if exit_code != 0:
            raise SystemExit(f"pytest exited with {exit_code} for {' '.join(args)}")
        if attempt:
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test", default=DEFAULT_TEST, help="the test (node id) each session runs")
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()

    import torch  # noqa: F401  (the heap a mutant's fork inherits)

    rows = {
        "default plugins": MUTMUT_FIXED_ARGS + [options.test],
        "mutmut's arguments": MUTMUT_FIXED_ARGS + [options.test] + mutmut_pytest_args(),
    }
    medians = {}
    print(f"{'pytest session':<22} {'median s':>9} {'min s':>7}")
    for name, args in rows.items():
        times = session_seconds(args, options.repeats)
        medians[name] = statistics.median(times)
        print(f"{name:<22} {medians[name]:>9.3f} {min(times):>7.3f}")
    ratio = medians["mutmut's arguments"] / medians["default plugins"]
    print(f"ratio (mutmut's / default): {ratio:.2f}")


if __name__ == "__main__":
    main()

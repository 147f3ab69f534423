"""Check that the mutation selection passes in a forked mutant session with no mutant active.

mutmut runs every test of the selection once in its own process (the statistics run), then forks that process for each
mutant and runs the mutant's tests in the child. A test that fails only in such a child, because of state its module or
the parent's earlier run left behind (a process id taken at import, a helper thread of the parent that the child does
not have), fails for every mutant whose tests include it, and mutmut counts each of those mutants as caught. This
script runs the selection the same way, with a mutant name that matches no function, and lists the tests that pass in
the parent but fail in the fork; it exits 1 if there are any:

    OMP_NUM_THREADS=1 python tools/mutation_fork_check.py        # ~4 min on 2 cores
    OMP_NUM_THREADS=1 python tools/mutation_fork_check.py tests/rewards/test_async_rewards.py

The selection and the per-session arguments are those of ``[tool.mutmut]`` in pyproject.toml (without a path, the whole
selection); ``tools/mutant_run_plugin.py`` treats the child's session as a mutant run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for `-p tools.mutant_run_plugin` (mutmut's arguments), as from mutants/
NO_MUTANT = "app.none.x_nothing__mutmut_1"  # the form of a mutant name: the plugin sees a mutant run
MUTMUT_FIXED_ARGS = ["--rootdir=.", "--tb=line", "-q", "-p", "no:randomly", "-p", "no:random-order"]


def mutmut_settings(pyproject: Path = ROOT / "pyproject.toml") -> tuple[list[str], list[str]]:
    """The selection (paths and marker expression) and the extra arguments of each mutant session."""
    mutmut = tomllib.loads(pyproject.read_text())["tool"]["mutmut"]
    return list(mutmut["pytest_add_cli_args_test_selection"]), list(mutmut["pytest_add_cli_args"])


class FailedTests:
    """A pytest plugin that keeps the ids of failed tests (any phase)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed and report.nodeid not in self.ids:
            self.ids.append(report.nodeid)


def failures(args: list[str]) -> list[str]:
    import pytest

    failed = FailedTests()
    pytest.main(args, plugins=[failed])
    return failed.ids


def failures_in_a_fork(args: list[str]) -> list[str]:
    """The failed test ids of a pytest session in a forked child, as a mutant session runs."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.environ["MUTANT_UNDER_TEST"] = NO_MUTANT
                Path(result.name).write_text(json.dumps(failures(args)))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the forked session died (wait status {status})")
        return json.loads(Path(result.name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="test paths (default: the mutation selection)")
    options = parser.parse_args()
    selection, session_args = mutmut_settings()
    if options.paths:
        marker = selection[selection.index("-m") : selection.index("-m") + 2] if "-m" in selection else []
        selection = [*options.paths, *marker]
    os.chdir(ROOT)
    import torch  # noqa: F401  (imported before the parent's session, as in mutmut's process)

    kills = ROOT / "mutmut-kills"  # where tools/mutant_run_plugin.py records a mutant session's failing test
    if kills.exists():
        raise SystemExit(f"{kills} exists: move it away first (this check would add to it)")
    args = [*MUTMUT_FIXED_ARGS, *session_args, *selection]
    try:
        in_parent = failures(args)
        in_fork = failures_in_a_fork(args)
    finally:
        shutil.rmtree(kills, ignore_errors=True)
    only_in_fork = [test for test in in_fork if test not in in_parent]
    print(f"failed in the parent's run: {len(in_parent)}; in the forked mutant session: {len(in_fork)}")
    for test in only_in_fork:
        print(f"fails only when forked: {test}")
    sys.exit(1 if only_in_fork or in_parent else 0)


if __name__ == "__main__":
    main()

"""The pytest hooks of mutmut's sessions: loaded only by mutant runs (``-p tools.mutant_run_plugin`` in
``[tool.mutmut] pytest_add_cli_args``; ``tools/`` is copied into ``mutants/``, which mutmut puts on ``sys.path``).

mutmut runs the whole selection once in its own process (the statistics run, ``MUTANT_UNDER_TEST=stats``), once more
unmutated (the clean run, ``MUTANT_UNDER_TEST=""``), then each mutant's tests in a new pytest session, forked from that
process, which holds torch, the package and every test module, with the ids of the tests that reach the mutated
function (up to ~1,000 of them) on the command line. The hooks below act only in those sessions (a mutant's name holds
``__mutmut_``); in any other session, with this plugin loaded or not, they change nothing. See docs/development.md,
"Mutation testing".
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

_REQUESTED_IDS = pytest.StashKey[set]()
_MUTMUT_LOOKUP = pytest.StashKey[Callable[[], str]]()

# mutmut records only each test's call phase; fixtures that fit a model would make their file look free. Its statistics
# run (MUTANT_UNDER_TEST=stats) therefore also writes setup + call + teardown per test here, in its working directory.
FULL_DURATIONS = Path("mutmut-full-durations.json")
_full_durations: dict[str, float] = {}

# Which test caught each mutant: a line per caught mutant, in a file per mutated function under KILLS in mutmut's
# working directory (``tools/mutation_summary.py --killers`` reads them).
KILLS = Path("mutmut-kills")
_kill_recorded = False

# mutmut runs the same tests once more, unmutated ("clean", MUTANT_UNDER_TEST=""), in the same process, to check that
# they pass before it mutates anything. After a statistics run over the whole selection that passed, that run is the
# check (the trampolines call the original code in both), so the clean run keeps one test: ~100 s less per run.
# An incremental run, whose statistics cover only new tests or come from the cache, runs its clean run in full.
_STATS_PASSED = "APP_MUTMUT_FULL_STATS_PASSED"


def _in_mutant_run() -> bool:
    return "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")


def _in_stats_run() -> bool:
    return os.environ.get("MUTANT_UNDER_TEST") == "stats"


def _fix_active_mutant(config) -> None:
    """mutmut wraps every mutated function in a trampoline that looks the active mutant up in ``os.environ`` on every
    call (so that a test that clears the environment cannot switch it off). Within one of its sessions the mutant never
    changes, and the look-ups cost up to 40 % of a test that calls a mutated parser in a loop (a numeric-reward mutant
    ran 2.0 s, 1.3 s without them; ``tools/mutmut_trampolines.py`` times one call). The lookup is fixed to
    the session's value until the session ends. Nothing here changes when mutmut's trampoline module is not loaded."""
    trampoline = sys.modules.get("mutmut.mutation.trampoline")
    if trampoline is None or not callable(getattr(trampoline, "get_mutant_under_test", None)):
        return
    active = os.environ["MUTANT_UNDER_TEST"]
    config.stash[_MUTMUT_LOOKUP] = trampoline.get_mutant_under_test
    trampoline.get_mutant_under_test = lambda: active


def pytest_unconfigure(config):
    lookup = config.stash.get(_MUTMUT_LOOKUP, None)
    if lookup is not None:  # the statistics run's session ends in mutmut's own process
        sys.modules["mutmut.mutation.trampoline"].get_mutant_under_test = lookup


def pytest_configure(config):
    """In a mutant run (and mutmut's statistics run): fix the active mutant for the session
    (:func:`_fix_active_mutant`). In a mutant run also: freeze the inherited heap out of the garbage collector (its full
    passes over it cost about a second of collection per mutant), reset what multiprocessing resets in a process it
    forks, stop property tests at their first failing example, and collect the named tests' files whole, keeping the
    named tests afterwards: pytest matches each id on the command line against its file separately, which cost more than
    collecting the files (measured with cProfile on a 760-test mutant run; ``tools/pytest_overhead.py`` times
    sessions)."""
    if _in_mutant_run() or _in_stats_run():
        _fix_active_mutant(config)
    if not _in_mutant_run():
        return
    import gc

    from hypothesis import Phase
    from hypothesis import settings as hypothesis_settings

    gc.freeze()
    # mutmut forks with os.fork, which skips the hooks multiprocessing runs in the processes it forks itself. Among them
    # the reset of the resource sharer that passes tensors' file descriptors to pool workers and DataLoader workers:
    # without it a worker asks the parent's sharer thread (which this process does not have) and dies, and a test that
    # uses a process pool failed for every mutant (14 mutants counted as caught by that failure alone on 2026-12-02)
    from multiprocessing import util as multiprocessing_util

    multiprocessing_util._run_after_forkers()
    # a failing property test stops at its first failing example: shrinking it and explaining it (a traced rerun of
    # every line) show a person the smallest case, and mutmut reads only the exit code
    hypothesis_settings.register_profile("mutant-run", phases=(Phase.explicit, Phase.reuse, Phase.generate))
    hypothesis_settings.load_profile("mutant-run")
    if config.args and all("::" in arg for arg in config.args):
        config.stash[_REQUESTED_IDS] = set(config.args)
        config.args[:] = list(dict.fromkeys(arg.split("::")[0] for arg in config.args))


def _keep_requested(config, items) -> None:
    requested = config.stash.get(_REQUESTED_IDS, None)
    if requested is None:
        return
    missing = requested - {item.nodeid for item in items}
    if missing:
        raise pytest.UsageError(f"{len(missing)} requested test id(s) not found, e.g. {sorted(missing)[0]!r}")
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in requested])
    items[:] = [item for item in items if item.nodeid in requested]


@pytest.hookimpl(trylast=True)  # after the project's own checks of the collected tests (tests/conftest.py)
def pytest_collection_modifyitems(config, items):
    """In a mutant run (see above), keep the named tests, then run the test files with the least recorded time first,
    and in each file its quickest tests first: the run stops at the first failure, so a caught mutant is caught sooner.
    Files stay whole, so module fixtures are built once. In the clean run after a passing full statistics run, keep one
    test (see ``_STATS_PASSED``)."""
    if os.environ.get("MUTANT_UNDER_TEST") == "" and os.environ.get(_STATS_PASSED) and items:
        config.hook.pytest_deselected(items=items[1:])
        del items[1:]
    if not _in_mutant_run():
        return
    _keep_requested(config, items)
    durations = _recorded_test_durations()
    cost: dict[str, float] = {}
    for item in items:
        cost[item.fspath.strpath] = cost.get(item.fspath.strpath, 0.0) + durations.get(item.nodeid, 1.0)
    items.sort(key=lambda item: (cost[item.fspath.strpath], durations.get(item.nodeid, 1.0)))


def pytest_runtest_logreport(report):
    global _kill_recorded
    if _in_stats_run():
        _full_durations[report.nodeid] = _full_durations.get(report.nodeid, 0.0) + report.duration
    elif report.failed and not _kill_recorded and _in_mutant_run():
        _kill_recorded = True
        function, _, number = os.environ["MUTANT_UNDER_TEST"].rpartition("__mutmut_")
        KILLS.mkdir(exist_ok=True)
        with open(KILLS / function, "a", encoding="utf-8") as kills:
            kills.write(f"{number} {report.nodeid}\n")


def pytest_sessionfinish(session, exitstatus):
    if not _in_stats_run():
        return
    whole_selection = not any("::" in arg for arg in session.config.args)
    if whole_selection and exitstatus == 0 and session.testsfailed == 0:
        os.environ[_STATS_PASSED] = "1"
    if _full_durations:
        known = json.loads(FULL_DURATIONS.read_text()) if FULL_DURATIONS.is_file() else {}
        FULL_DURATIONS.write_text(json.dumps({**known, **_full_durations}))
        _full_durations.clear()


def _recorded_test_durations() -> dict[str, float]:
    """Each test's recorded time: setup + call + teardown from mutmut's statistics run if written (see
    ``FULL_DURATIONS``), else mutmut's own call times (its in-memory state in this forked process), else nothing."""
    if FULL_DURATIONS.is_file():
        return json.loads(FULL_DURATIONS.read_text())
    mutmut_state = sys.modules.get("mutmut.state")
    if mutmut_state is not None and mutmut_state.state().duration_by_test:
        return mutmut_state.state().duration_by_test
    return {}

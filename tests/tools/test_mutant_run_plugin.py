"""tools/mutant_run_plugin.py, the hooks of mutmut's sessions, in real pytest runs in a subprocess: the session of a
mutant records which test caught it, fixes the active mutant for mutmut's trampolines, stops a failing property test at
its first example and runs the named tests cheapest first; the statistics run records each test's full time, and the
clean run after it keeps one test; outside mutmut's sessions none of it happens."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # `tools.mutant_run_plugin` is imported from here, as from mutants/
MUTANT = "app.rewards.numeric.x_tolerance_score__mutmut_7"

PROBE = """
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from mutmut.mutation import trampoline

EXAMPLES = []


def test_passes():
    pass


def test_lookup_is_fixed_for_the_session():
    seen = os.environ["MUTANT_UNDER_TEST"]
    os.environ["MUTANT_UNDER_TEST"] = "app.other.x_g__mutmut_1"  # what a test could do to the environment
    try:
        assert trampoline.get_mutant_under_test() == seen
    finally:
        os.environ["MUTANT_UNDER_TEST"] = seen


@settings(max_examples=50, database=None, derandomize=True)  # the same draws every run
@given(st.integers(0, 1000))
def test_fails_from_ten_on(value):
    EXAMPLES.append(value)
    assert value < 10, len(EXAMPLES)
"""

PASSING = """
def test_slow():
    pass


def test_quick():
    pass


def test_not_named():
    pass
"""

# the trampoline module is loaded before the sessions start, as in mutmut's own process; each argument list (a JSON
# list of lists) is one session in this process, under its own MUTANT_UNDER_TEST
RUN = """
import json, os, sys, pytest, mutmut.mutation.trampoline
for mutant, args in json.loads(sys.argv[1]):
    os.environ["MUTANT_UNDER_TEST"] = mutant
    code = pytest.main(args)
    print(f"exit code {int(code)}", flush=True)
"""

PLUGIN_ARGS = ["-p", "tools.mutant_run_plugin", "-p", "no:cacheprovider", "-q", "-rf", "-c", os.devnull]


def run_sessions(tmp_path: Path, *sessions: tuple[str, list[str]]) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "test_passing.py").write_text(PASSING)
    sessions_arg = json.dumps(
        [[mutant, [*PLUGIN_ARGS, "--rootdir", str(tmp_path), *args]] for mutant, args in sessions]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MUTANT_UNDER_TEST", None)
    env.pop("APP_MUTMUT_FULL_STATS_PASSED", None)
    return subprocess.run(
        [sys.executable, "-c", RUN, sessions_arg], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


PROBE_IDS = [
    "test_probe.py::test_passes",
    "test_probe.py::test_lookup_is_fixed_for_the_session",
    "test_probe.py::test_fails_from_ten_on",
]


def test_a_mutant_session_records_its_catching_test_and_stops_a_property_test_at_its_first_failure(tmp_path):
    result = run_sessions(tmp_path, (MUTANT, PROBE_IDS))
    assert "exit code 1" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 passed" in result.stdout and "1 failed" in result.stdout  # the fixed lookup held
    assert "FAILED test_probe.py::test_fails_from_ten_on" in result.stdout
    records = list((tmp_path / "mutmut-kills").iterdir())
    assert [r.name for r in records] == ["app.rewards.numeric.x_tolerance_score"]
    assert records[0].read_text() == "7 test_probe.py::test_fails_from_ten_on\n"
    # no shrinking: the failure is reported at the first failing draw, not at the smallest failing value, 10
    assert "Failing test case: test_fails_from_ten_on(" in result.stdout and "value=10," not in result.stdout


def test_outside_mutant_sessions_nothing_is_recorded(tmp_path):
    result = run_sessions(tmp_path, ("", PROBE_IDS))
    assert "exit code 1" in result.stdout
    assert "FAILED test_probe.py::test_lookup_is_fixed_for_the_session" in result.stdout  # mutmut's own lookup
    assert "2 failed" in result.stdout and not (tmp_path / "mutmut-kills").exists()
    assert "value=10," in result.stdout  # an ordinary run shrinks to the smallest failing value


def test_a_mutant_session_runs_only_the_named_tests_the_quickest_first(tmp_path):
    durations = {"test_passing.py::test_slow": 2.0, "test_passing.py::test_quick": 0.1}
    (tmp_path / "mutmut-full-durations.json").write_text(json.dumps(durations))
    named = ["test_passing.py::test_slow", "test_passing.py::test_quick"]
    result = run_sessions(tmp_path, (MUTANT, [*named, "-vv"]), ("", [*named, "-vv"]))
    mutant_session, clean_session = result.stdout.split("exit code 0", 1)
    order = [line.split()[0] for line in mutant_session.splitlines() if " PASSED" in line]
    assert order == ["test_passing.py::test_quick", "test_passing.py::test_slow"], result.stdout + result.stderr
    assert "test_not_named" not in mutant_session and "2 passed" in mutant_session
    clean_order = [line.split()[0] for line in clean_session.splitlines() if " PASSED" in line]
    assert clean_order == named  # outside mutant sessions the order is pytest's


def test_the_statistics_run_records_full_times_and_after_it_passed_the_clean_run_keeps_one_test(tmp_path):
    result = run_sessions(tmp_path, ("stats", ["test_passing.py"]), ("", ["test_passing.py"]))
    assert result.stdout.count("exit code 0") == 2, result.stdout[-3000:] + result.stderr[-3000:]
    recorded = json.loads((tmp_path / "mutmut-full-durations.json").read_text())
    assert sorted(recorded) == [f"test_passing.py::test_{name}" for name in ("not_named", "quick", "slow")]
    _, clean_session = result.stdout.split("exit code 0", 1)
    assert "1 passed, 2 deselected" in clean_session


def test_a_failing_statistics_run_leaves_the_clean_run_whole(tmp_path):
    result = run_sessions(tmp_path, ("stats", ["test_probe.py"]), ("", ["test_passing.py"]))
    assert "exit code 1" in result.stdout and "exit code 0" in result.stdout
    assert "3 passed" in result.stdout.split("exit code 1", 1)[1]


def test_mutmut_loads_the_plugin_in_its_sessions_and_copies_it_into_its_working_folder():
    import tomllib

    mutmut = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    args = mutmut["pytest_add_cli_args"]
    assert args[args.index("tools.mutant_run_plugin") - 1] == "-p"
    assert "tools/" in mutmut["also_copy"]  # mutmut runs pytest in mutants/, which it puts on sys.path

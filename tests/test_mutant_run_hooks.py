"""The hooks of tests/conftest.py that act only in mutmut's sessions, in a real pytest run in a subprocess: the session
of a mutant records which test caught it, fixes the active mutant for mutmut's trampolines, and stops a failing property
test at its first example; outside mutant sessions none of it happens."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
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

# the trampoline module must be loaded before the session starts, as in mutmut's own process
RUN = "import sys, pytest, mutmut.mutation.trampoline; sys.exit(pytest.main(sys.argv[1:]))"


def run_probe(tmp_path: Path, mutant: str) -> tuple[subprocess.CompletedProcess, Path]:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "MUTANT_UNDER_TEST": mutant, "PYTHONPATH": str(TESTS)}
    args = ["-p", "conftest", "-p", "no:cacheprovider", "-q", "-rf", "--rootdir", str(tmp_path), "-c", os.devnull,
            "test_probe.py::test_passes", "test_probe.py::test_lookup_is_fixed_for_the_session",
            "test_probe.py::test_fails_from_ten_on"]  # fmt: skip
    result = subprocess.run([sys.executable, "-c", RUN, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    return result, tmp_path / "mutmut-kills"


def test_a_mutant_session_records_its_catching_test_and_stops_a_property_test_at_its_first_failure(tmp_path):
    result, kills = run_probe(tmp_path, MUTANT)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 passed" in result.stdout and "1 failed" in result.stdout  # the fixed lookup held
    assert "FAILED test_probe.py::test_fails_from_ten_on" in result.stdout
    records = list(kills.iterdir())
    assert [r.name for r in records] == ["app.rewards.numeric.x_tolerance_score"]
    assert records[0].read_text() == "7 test_probe.py::test_fails_from_ten_on\n"
    # no shrinking: the failure is reported at the first failing draw, not at the smallest failing value, 10
    assert "Failing test case: test_fails_from_ten_on(" in result.stdout and "value=10," not in result.stdout


def test_outside_mutant_sessions_nothing_is_recorded(tmp_path):
    result, kills = run_probe(tmp_path, "")
    assert result.returncode == 1
    assert "FAILED test_probe.py::test_lookup_is_fixed_for_the_session" in result.stdout  # mutmut's own lookup
    assert "2 failed" in result.stdout and not kills.exists()
    assert "value=10," in result.stdout  # an ordinary run shrinks to the smallest failing value

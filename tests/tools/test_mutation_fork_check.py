"""tools/mutation_fork_check.py: it reads mutmut's selection, and finds a test that passes in the process that
imported it but fails in a fork of that process (as every mutant session is)."""

import os

import pytest
from tool_scripts import load_tool  # the scripts are not a package


@pytest.fixture(scope="module")
def check():
    return load_tool("mutation_fork_check")


def test_reads_the_selection_and_the_session_arguments_of_the_project(check):
    selection, session_args = check.mutmut_settings()
    assert "tests/algorithms" in selection and selection[selection.index("-m") + 1] == "not slow"
    assert session_args[session_args.index("no:unraisableexception") - 1] == "-p"


@pytest.mark.slow
def test_a_test_that_fails_only_in_a_fork_is_found(check, tmp_path):
    probe = tmp_path / "test_fork_probe.py"  # a module name no other in-process session imports
    probe.write_text(
        "import os\n\nPID = os.getpid()  # taken at import, in the parent\n\n\n"
        "def test_same_process():\n    assert os.getpid() == PID\n\n\n"
        "def test_fine():\n    pass\n"
    )
    args = [f"--rootdir={tmp_path}", "-p", "no:cacheprovider", "-q", "-c", os.devnull, str(probe)]
    assert check.failures(args) == []
    assert check.failures_in_a_fork(args) == ["test_fork_probe.py::test_same_process"]

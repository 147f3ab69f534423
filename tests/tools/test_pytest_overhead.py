"""tools/pytest_overhead.py: it times exactly the arguments mutmut passes, and a session it times really ran."""

import pytest
from tool_scripts import load_tool  # the scripts are not a package


@pytest.fixture(scope="module")
def overhead():
    return load_tool("pytest_overhead")


def test_reads_mutmuts_pytest_arguments_from_the_project(overhead):
    args = overhead.mutmut_pytest_args()
    # the plugins whose per-session gc.collect() the benchmark exists to show stay switched off for mutant runs
    assert args[args.index("no:unraisableexception") - 1] == "-p"
    assert args[args.index("no:threadexception") - 1] == "-p"


@pytest.mark.slow
def test_times_each_repeat_after_a_warm_up_and_refuses_a_failing_session(overhead, tmp_path):
    calls = tmp_path / "calls.txt"
    test_file = tmp_path / "test_probe.py"
    test_file.write_text(f"def test_probe():\n    open({str(calls)!r}, 'a').write('x')\n")
    args = [f"--rootdir={tmp_path}", "-p", "no:cacheprovider", "-c", str(tmp_path / "none.ini"), str(test_file)]
    (tmp_path / "none.ini").write_text("[pytest]\n")

    times = overhead.session_seconds(args, repeats=2)

    assert len(times) == 2 and all(t > 0 for t in times)
    assert calls.read_text() == "xxx"  # the warm-up and two timed sessions each ran the test
    failing = tmp_path / "test_failing_probe.py"  # a new module: the passing one stays imported in this process
    failing.write_text("def test_probe():\n    assert False\n")
    with pytest.raises(SystemExit, match="pytest exited with 1"):
        overhead.session_seconds([*args[:-1], str(failing)], repeats=1)

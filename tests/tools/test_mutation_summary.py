"""tools/mutation_summary.py: counts per mutated file from mutmut's ``.meta`` files, and the caught rate."""

import json
from pathlib import Path

import pytest
from tool_scripts import load_tool  # the scripts are not a package


@pytest.fixture(scope="module")
def summary():
    return load_tool("mutation_summary")


def write_meta(path: Path, codes: dict, durations: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes, "durations_by_key": durations}))


def test_counts_statuses_per_file_and_rates_only_what_was_checked(summary, tmp_path, capsys):
    mutants = tmp_path / "mutants"
    codes = {"a__mutmut_1": 1, "a__mutmut_2": 1, "a__mutmut_3": 0, "a__mutmut_4": -24, "a__mutmut_5": None}
    write_meta(mutants / "src/app/a.py.meta", codes, {"a__mutmut_1": 0.5, "a__mutmut_2": 1.5})
    write_meta(mutants / "src/app/b.py.meta", {"b__mutmut_1": 37, "b__mutmut_2": 35, "b__mutmut_3": -11}, {})
    write_meta(mutants / "src/app/empty.py.meta", {}, {})
    counts, seconds = summary.summarise(mutants)
    assert set(counts) == {"src/app/a.py", "src/app/b.py"}
    a = counts["src/app/a.py"]
    assert (a["mutants"], a["caught"], a["survived"], a["timeout"], a["not checked"]) == (5, 2, 1, 1, 1)
    assert summary.rate(a) == "50.0 %"  # 2 of the 4 checked
    b = counts["src/app/b.py"]
    assert (b["caught"], b["crashed"], b["other"]) == (1, 1, 1)
    assert seconds == {"src/app/a.py": 2.0, "src/app/b.py": 0.0}
    summary.main(["--mutants", str(mutants), "--markdown"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| file | mutants | caught |")
    assert lines[-1] == "| total | 8 | 3 | 1 | 1 | 1 | 0 | 1 | 1 | 42.9 % | 2 |"


def test_a_missing_mutants_folder_is_a_short_message(summary, tmp_path):
    with pytest.raises(SystemExit, match="no .*mutants/ here: run `mutmut run` first"):
        summary.main(["--mutants", str(tmp_path / "mutants")])


def test_folders_sum_the_files_of_each_folder(summary):
    counts = {"src/app/x/a.py": summary.Counter(mutants=3, caught=2), "src/app/x/b.py": summary.Counter(mutants=1),
              "src/app/c.py": summary.Counter(mutants=2, caught=2)}  # fmt: skip
    folders, seconds = summary.by_folder(counts, {"src/app/x/a.py": 1.0, "src/app/x/b.py": 2.0, "src/app/c.py": 4.0})
    assert folders == {
        "src/app/x/": summary.Counter(mutants=4, caught=2),
        "src/app/": summary.Counter(mutants=2, caught=2),
    }
    assert seconds == {"src/app/x/": 3.0, "src/app/": 4.0}


def test_killers_count_the_catching_test_of_each_mutant_per_test_and_per_file(summary, tmp_path, capsys):
    kills = tmp_path / "mutants" / "mutmut-kills"
    kills.mkdir(parents=True)
    (kills / "app.a.x_f").write_text("1 tests/test_a.py::test_one\n2 tests/test_a.py::test_one\n3 tests/test_b.py::t\n")
    (kills / "app.a.xǁCǁg").write_text("7 tests/test_a.py::test_two[x y]\n")
    caught = summary.killers(tmp_path / "mutants")
    assert caught == {"tests/test_a.py::test_one": 2, "tests/test_b.py::t": 1, "tests/test_a.py::test_two[x y]": 1}
    summary.main(["--mutants", str(tmp_path / "mutants"), "--killers"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["mutants  test file", "      3  tests/test_a.py", "      1  tests/test_b.py"]
    assert lines[5] == "      2  tests/test_a.py::test_one"

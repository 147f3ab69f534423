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


def no_equivalents(tmp_path: Path) -> Path:
    path = tmp_path / "none.toml"
    path.write_text("")
    return path


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
    summary.main(["--mutants", str(mutants), "--markdown", "--equivalents", str(no_equivalents(tmp_path))])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| file | mutants | caught | survived | equivalent |")
    assert lines[-1] == "| total | 8 | 3 | 1 | 0 | 1 | 1 | 0 | 1 | 1 | 42.9 % | 2 |"


def test_a_missing_mutants_folder_is_a_short_message(summary, tmp_path):
    with pytest.raises(SystemExit, match="no .*mutants/ here: run `mutmut run` first"):
        summary.main(["--mutants", str(tmp_path / "mutants")])


def test_folders_sum_the_files_of_each_folder(summary):
    counts = {
        "src/app/x/a.py": summary.Counter(mutants=3, caught=2),
        "src/app/x/b.py": summary.Counter(mutants=1),
        "src/app/c.py": summary.Counter(mutants=2, caught=2),
    }
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


# A mutated file as mutmut writes it: the original of each function and its numbered mutants side by side
MUTATED = """
def x_total__mutmut_orig(a, b):
    return a + b


def x_total__mutmut_1(a, b):
    return a - b


def x_total__mutmut_2(a, b):
    return a + b + 0


def x_total__mutmut_3(a, b):
    return a * b
"""


def entry(number: int, original: str, mutated: str, reason: str) -> str:
    return (
        f'["app.a.x_total__mutmut_{number}"]\noriginal = "{original}"\nmutated = "{mutated}"\nreason = "{reason}"\n\n'
    )


def fake_run(tmp_path: Path, codes: dict, registry: str) -> tuple[Path, Path]:
    """A ``mutants/`` folder with the mutants of ``total`` in ``src/app/a.py`` and their exit codes, and a registry."""
    mutants = tmp_path / "mutants"
    write_meta(mutants / "src/app/a.py.meta", {f"app.a.x_total__mutmut_{n}": code for n, code in codes.items()}, {})
    (mutants / "src/app/a.py").write_text(MUTATED)
    equivalents = tmp_path / "equivalent_mutants.toml"
    equivalents.write_text(registry)
    return mutants, equivalents


def test_a_listed_surviving_mutant_counts_as_equivalent_and_leaves_the_rate(summary, tmp_path, capsys):
    registry = entry(2, "return a + b", "return a + b + 0", "adding 0 changes nothing")
    mutants, equivalents = fake_run(tmp_path, {1: 1, 2: 0, 3: 0}, registry)
    listed = summary.load_equivalents(equivalents)
    assert listed == {
        "app.a.x_total__mutmut_2": {
            "original": "return a + b",
            "mutated": "return a + b + 0",
            "reason": "adding 0 changes nothing",
        }
    }
    codes = summary.exit_codes(mutants)
    assert codes["app.a.x_total__mutmut_2"] == ("src/app/a.py", 0)
    assert summary.mutant_change(mutants, "src/app/a.py", "app.a.x_total__mutmut_3") == ("return a + b", "return a * b")
    assert summary.stale_equivalents(mutants, listed, codes) == {}
    counts, _ = summary.summarise(mutants, equivalent=listed)
    a = counts["src/app/a.py"]
    assert (a["mutants"], a["caught"], a["survived"], a["equivalent"]) == (3, 1, 1, 1)
    assert summary.rate(a) == "50.0 %"  # 1 caught of the 2 that are not equivalent
    summary.main(["--mutants", str(mutants), "--equivalents", str(equivalents), "--check-equivalents"])
    out = capsys.readouterr().out
    assert out.splitlines()[-1].split() == ["total", "3", "1", "1", "1", "0", "0", "0", "0", "0", "50.0", "%", "0"]
    assert "stale" not in out


def test_stale_entries_are_listed_count_for_nothing_and_fail_the_check(summary, tmp_path, capsys):
    registry = (
        entry(2, "return a + b", "return a - b", "renumbered: another mutant has its number now")
        + entry(9, "return a + b", "return 0", "gone")
        + entry(1, "return a + b", "return a - b", "a test catches it")
    )
    mutants, equivalents = fake_run(tmp_path, {1: 1, 2: 0, 3: None}, registry)
    stale = summary.stale_equivalents(mutants, summary.load_equivalents(equivalents), summary.exit_codes(mutants))
    assert stale == {
        "app.a.x_total__mutmut_2": (
            "the mutant now changes 'return a + b' to 'return a + b + 0', the entry 'return a + b' to 'return a - b'"
        ),
        "app.a.x_total__mutmut_9": "no such mutant (renumbered, or its function changed or is gone)",
        "app.a.x_total__mutmut_1": "caught by a test: not equivalent",
    }
    args = ["--mutants", str(mutants), "--equivalents", str(equivalents)]
    summary.main(args)  # listed, without the check: no failure
    out = capsys.readouterr().out.splitlines()
    assert out[2].split()[:5] == ["total", "3", "1", "1", "0"]  # the stale entry's survivor still survives
    assert out[4] == f"stale entries of {equivalents} (3, counted for nothing):"
    assert out[5:] == [f"  {name}: {problem}" for name, problem in stale.items()]
    with pytest.raises(SystemExit) as exit_info:
        summary.main([*args, "--check-equivalents"])
    assert exit_info.value.code == 1


def test_new_entries_for_the_unlisted_survivors_are_a_registry_to_fill_in(summary, tmp_path, capsys):
    mutants, equivalents = fake_run(tmp_path, {1: 1, 2: 0, 3: 0}, "")
    summary.main(["--mutants", str(mutants), "--equivalents", str(equivalents), "--new-equivalents"])
    (tmp_path / "new.toml").write_text(capsys.readouterr().out)
    assert summary.load_equivalents(tmp_path / "new.toml") == {
        "app.a.x_total__mutmut_2": {"original": "return a + b", "mutated": "return a + b + 0", "reason": ""},
        "app.a.x_total__mutmut_3": {"original": "return a + b", "mutated": "return a * b", "reason": ""},
    }


def test_a_malformed_entry_is_refused(summary, tmp_path):
    (tmp_path / "bad.toml").write_text('["app.a.x_total__mutmut_2"]\nmutated = "return a + b + 0"\nreason = "r"\n')
    with pytest.raises(SystemExit, match="exactly mutated, original, reason"):
        summary.load_equivalents(tmp_path / "bad.toml")
    with pytest.raises(SystemExit, match="no equivalent-mutant registry"):
        summary.load_equivalents(tmp_path / "missing.toml")


def test_the_project_registry_gives_every_entry_its_line_and_reason(summary):
    entries = summary.load_equivalents(summary.EQUIVALENTS)
    assert entries and all(entry["original"].strip() and entry["reason"].strip() for entry in entries.values())
    assert all(name.startswith("app.") for name in entries)

"""Summarise a mutmut run: mutants, caught, survived and timed out per mutated file, and the time mutants took.

Run from the folder holding ``mutants/`` after ``mutmut run`` (see README, "Mutation testing"):

    python tools/mutation_summary.py            # table per file, then the total
    python tools/mutation_summary.py --markdown # the same as a Markdown table (for the README)
    python tools/mutation_summary.py --folders  # one row per folder of mutated files
    python tools/mutation_summary.py --killers  # mutants caught per test file, and the tests that caught most

"Caught" counts mutmut's "killed" (a test failed) and "caught by type check". A timeout (the mutant made the code hang)
and a crash (the test process died of a signal, e.g. a native library handed None) are reported on their own: caught in
effect, but not a test's verdict, so they stay out of the caught rate's numerator. Mutants not checked yet (an interrupted
run) are counted apart and left out of the rate.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

# mutmut 3's exit codes (mutmut.stats.status_by_exit_code); any other code is "suspicious"
CAUGHT = {1: "caught", 3: "caught", 37: "caught"}
STATUS = {**CAUGHT, 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout", -24: "timeout",
          24: "timeout", 152: "timeout", 255: "timeout", -11: "crashed", -9: "crashed", None: "not checked"}  # fmt: skip
COLUMNS = ("mutants", "caught", "survived", "timeout", "crashed", "no tests", "not checked", "other")


def summarise(mutants_dir: Path) -> tuple[dict[str, Counter], dict[str, float]]:
    """Status counts and the summed run seconds of the mutants, per mutated source file."""
    counts: dict[str, Counter] = {}
    seconds: dict[str, float] = {}
    for meta in sorted(mutants_dir.glob("**/*.py.meta")):
        data = json.loads(meta.read_text())
        name = str(meta.relative_to(mutants_dir))[: -len(".meta")]
        if not data["exit_code_by_key"]:
            continue
        status = Counter(STATUS.get(code, "other") for code in data["exit_code_by_key"].values())
        status["mutants"] = len(data["exit_code_by_key"])
        counts[name] = status
        seconds[name] = sum(data.get("durations_by_key", {}).values())
    return counts, seconds


def by_folder(counts: dict[str, Counter], seconds: dict[str, float]) -> tuple[dict[str, Counter], dict[str, float]]:
    """The same figures summed over the files of each folder (``src/app/rewards/``, ...)."""
    folder_counts: dict[str, Counter] = {}
    folder_seconds: dict[str, float] = {}
    for name, status in counts.items():
        folder = str(Path(name).parent) + "/"
        folder_counts[folder] = folder_counts.get(folder, Counter()) + status
        folder_seconds[folder] = folder_seconds.get(folder, 0.0) + seconds[name]
    return folder_counts, folder_seconds


def killers(mutants_dir: Path) -> Counter:
    """Mutants caught per test id: the first failing test of each caught mutant's run, as ``tests/conftest.py``
    records it under ``mutmut-kills/`` (one file per mutated function, a line ``<mutant number> <test id>`` each)."""
    caught: Counter = Counter()
    for record in (mutants_dir / "mutmut-kills").glob("*"):
        for line in record.read_text(encoding="utf-8").splitlines():
            caught[line.split(" ", 1)[1]] += 1
    return caught


def print_killers(caught: Counter, top: int = 20) -> None:
    files: Counter = Counter()
    for test_id, n in caught.items():
        files[test_id.split("::")[0]] += n
    print(f"{'mutants':>7}  test file")
    for name, n in files.most_common():
        print(f"{n:>7}  {name}")
    print(f"\n{'mutants':>7}  test (the {top} that caught most)")
    for name, n in caught.most_common(top):
        print(f"{n:>7}  {name}")


def rate(status: Counter) -> str:
    checked = status["mutants"] - status["not checked"]
    return f"{100 * status['caught'] / checked:.1f} %" if checked else "-"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutants", type=Path, default=Path("mutants"), help="mutmut's working folder")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--folders", action="store_true", help="one row per folder instead of per file")
    parser.add_argument("--killers", action="store_true", help="mutants caught per test file and per test instead")
    args = parser.parse_args(argv)
    if not args.mutants.is_dir():
        raise SystemExit(f"no {args.mutants}/ here: run `mutmut run` first, or pass --mutants")
    if args.killers:
        print_killers(killers(args.mutants))
        return
    counts, seconds = summarise(args.mutants)
    if args.folders:
        counts, seconds = by_folder(counts, seconds)
    total = sum(counts.values(), Counter())
    rows = [(name, status, seconds[name]) for name, status in counts.items()]
    rows.append(("total", total, sum(seconds.values())))
    header = ("folder" if args.folders else "file", *COLUMNS, "caught rate", "mutant run s")
    table = [[name, *(str(status[c]) for c in COLUMNS), rate(status), f"{secs:.0f}"] for name, status, secs in rows]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("| --- " + "| ---: " * (len(header) - 1) + "|")
        for row in table:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        print(
            "  ".join(
                str(cell).rjust(w) if i else str(cell).ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )


if __name__ == "__main__":
    main()

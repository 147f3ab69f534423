"""Summarise a mutmut run: mutants, caught, survived, equivalent and timed out per mutated file, and the time mutants
took.

Run from the folder holding ``mutants/`` after ``mutmut run`` (see docs/development.md#mutation-testing):

    python tools/mutation_summary.py            # table per file, then the total
    python tools/mutation_summary.py --markdown # the same as a Markdown table
    python tools/mutation_summary.py --folders  # one row per folder of mutated files
    python tools/mutation_summary.py --killers  # mutants caught per test file, and the tests that caught most
    python tools/mutation_summary.py --check-equivalents  # exit 1 if an entry of the registry is stale
    python tools/mutation_summary.py --new-equivalents    # registry entries to review, one per unlisted survivor

"Caught" counts mutmut's "killed" (a test failed) and "caught by type check". A timeout (the mutant made the code hang)
and a crash (the test process died of a signal, e.g. a native library handed None) are reported on their own: caught in
effect, but not a test's verdict, so they stay out of the caught rate's numerator. Mutants not checked yet (an
interrupted run) are counted apart and left out of the rate.

Equivalent mutants (no input tells them apart from the original) are listed, reviewed, in
``tools/equivalent_mutants.toml`` rather than marked in the source: one table per mutant, named by mutmut's mutant name,
with the line it changes and that line mutated, as ``mutmut show NAME`` shows them (``original``, ``mutated``: the
removed and the added lines of its diff, stripped), and why no input tells it apart (``reason``). A listed mutant that
survived counts as "equivalent", not "survived", and the caught rate is caught / (mutants - equivalent - not checked).
An entry is stale when its mutant no longer exists, when the mutant's lines differ from the entry's (the mutants of a
function are numbered in order, so a changed function renumbers them) or when a test caught it; stale entries are listed
after the table and count for nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import Counter
from collections.abc import Collection
from pathlib import Path

import tomllib

EQUIVALENTS = Path(__file__).resolve().parent / "equivalent_mutants.toml"

# mutmut 3's exit codes (mutmut.stats.status_by_exit_code); any other code is "suspicious"
CAUGHT = {1: "caught", 3: "caught", 37: "caught"}
STATUS = {
    **CAUGHT,
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "crashed",
    -9: "crashed",
    None: "not checked",
}
COLUMNS = ("mutants", "caught", "survived", "equivalent", "timeout", "crashed", "no tests", "not checked", "other")


def exit_codes(mutants_dir: Path) -> dict[str, tuple[str, int | None]]:
    """Each mutant's mutated source file (``src/app/...py``) and its exit code (None: not checked)."""
    codes = {}
    for meta in sorted(mutants_dir.glob("**/*.py.meta")):
        source = str(meta.relative_to(mutants_dir))[: -len(".meta")]
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            codes[name] = (source, code)
    return codes


def summarise(mutants_dir: Path, equivalent: Collection[str] = ()) -> tuple[dict[str, Counter], dict[str, float]]:
    """Status counts and the summed run seconds of the mutants, per mutated source file; a surviving mutant named in
    ``equivalent`` counts as "equivalent"."""
    counts: dict[str, Counter] = {}
    seconds: dict[str, float] = {}
    for meta in sorted(mutants_dir.glob("**/*.py.meta")):
        data = json.loads(meta.read_text())
        name = str(meta.relative_to(mutants_dir))[: -len(".meta")]
        if not data["exit_code_by_key"]:
            continue
        status = Counter(
            "equivalent" if code == 0 and mutant in equivalent else STATUS.get(code, "other")
            for mutant, code in data["exit_code_by_key"].items()
        )
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


FIELDS = {"original", "mutated", "reason"}


def load_equivalents(path: Path) -> dict[str, dict[str, str]]:
    """The registry: mutant name -> ``{"original": line, "mutated": line, "reason": why}``."""
    try:
        entries = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"no equivalent-mutant registry at {path}") from None
    for name, entry in entries.items():
        if "__mutmut_" not in name or not isinstance(entry, dict) or set(entry) != FIELDS:
            raise SystemExit(f"{path}: [{name!r}] must be a mutant's name with exactly {', '.join(sorted(FIELDS))}")
    return entries


def mutant_change(mutants_dir: Path, source: str, mutant: str) -> tuple[str, str]:
    """The lines the mutant changes and what it makes of them, as ``mutmut show`` shows them: the removed and the added
    lines of its diff, each stripped, joined by newlines. ``source`` is the mutated file's path inside
    ``mutants_dir``."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    # mutmut reads its files relative to the folder that holds mutants/
    with contextlib.chdir(mutants_dir.resolve().parent):
        diff = get_diff_for_mutant(mutant, path=source).splitlines()
    removed = [line[1:].strip() for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("+++")]
    return "\n".join(removed), "\n".join(added)


def _stripped(lines: str) -> str:
    return "\n".join(line.strip() for line in lines.strip().splitlines())


def stale_equivalents(
    mutants_dir: Path, equivalents: dict[str, dict[str, str]], codes: dict[str, tuple[str, int | None]]
) -> dict[str, str]:
    """Entries of the registry that no longer describe a surviving equivalent mutant: name -> what is wrong."""
    if equivalents and mutants_dir.name != "mutants":
        raise SystemExit(f"{mutants_dir} must be mutmut's folder, named mutants, to read mutants' lines from")
    stale = {}
    for name, entry in equivalents.items():
        if name not in codes:
            stale[name] = "no such mutant (renumbered, or its function changed or is gone)"
            continue
        source, code = codes[name]
        change = mutant_change(mutants_dir, source, name)
        recorded = (_stripped(entry["original"]), _stripped(entry["mutated"]))
        if change != recorded:
            stale[name] = (
                f"the mutant now changes {change[0]!r} to {change[1]!r}, the entry {recorded[0]!r} to {recorded[1]!r}"
            )
        elif code in CAUGHT:
            stale[name] = "caught by a test: not equivalent"
    return stale


def new_equivalents(mutants_dir: Path, equivalents: Collection[str], codes: dict[str, tuple[str, int | None]]) -> str:
    """Registry entries to review, one per surviving mutant that is not listed: its lines filled in, no reason."""
    survivors = [name for name, (_, code) in codes.items() if code == 0 and name not in equivalents]
    tables = []
    for name in sorted(survivors):
        original, mutated = mutant_change(mutants_dir, codes[name][0], name)
        tables.append(
            f"[{json.dumps(name, ensure_ascii=False)}]\noriginal = {json.dumps(original, ensure_ascii=False)}\n"
            f'mutated = {json.dumps(mutated, ensure_ascii=False)}\nreason = ""\n'
        )
    return "\n".join(tables)


def killers(mutants_dir: Path) -> Counter:
    """Mutants caught per test id: the first failing test of each caught mutant's run, as ``tools/mutant_run_plugin.py``
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
    checked = status["mutants"] - status["equivalent"] - status["not checked"]
    return f"{100 * status['caught'] / checked:.1f} %" if checked else "-"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutants", type=Path, default=Path("mutants"), help="mutmut's working folder")
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS, help="the equivalent-mutant registry")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--folders", action="store_true", help="one row per folder instead of per file")
    parser.add_argument("--killers", action="store_true", help="mutants caught per test file and per test instead")
    parser.add_argument("--check-equivalents", action="store_true", help="exit 1 if a registry entry is stale")
    parser.add_argument("--new-equivalents", action="store_true", help="print entries for the unlisted survivors")
    args = parser.parse_args(argv)
    if not args.mutants.is_dir():
        raise SystemExit(f"no {args.mutants}/ here: run `mutmut run` first, or pass --mutants")
    if args.killers:
        print_killers(killers(args.mutants))
        return
    codes = exit_codes(args.mutants)
    equivalents = load_equivalents(args.equivalents)
    if args.new_equivalents:
        print(new_equivalents(args.mutants, equivalents, codes), end="")
        return
    stale = stale_equivalents(args.mutants, equivalents, codes)
    counts, seconds = summarise(args.mutants, equivalent=set(equivalents) - set(stale))
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
    else:
        widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(len(header))]
        for row in [header, *table]:
            cells = zip(row, widths, strict=True)
            print("  ".join(str(cell).rjust(w) if i else str(cell).ljust(w) for i, (cell, w) in enumerate(cells)))
    if stale:
        print(f"\nstale entries of {args.equivalents} ({len(stale)}, counted for nothing):")
        for name, problem in stale.items():
            print(f"  {name}: {problem}")
    if args.check_equivalents and stale:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""What mutmut's trampoline adds to each call of a mutated function, with the active mutant looked up in ``os.environ``
on every call (mutmut's default) and fixed for the session (what ``tools/mutant_run_plugin.py`` does in mutant runs).

mutmut 3 replaces every function of a mutated module by a trampoline that decides, per call, whether to run the
original or the active mutant. A mutant run's tests call such functions millions of times in total (the number parser
alone, ~230,000 calls in one numeric-reward mutant's session), so the per-call cost decides how long many mutants take:

    OMP_NUM_THREADS=1 python tools/mutmut_trampolines.py
    OMP_NUM_THREADS=1 python tools/mutmut_trampolines.py --calls 500000

It builds a trampoline with mutmut's own ``wrap_in_trampoline`` around a one-line function, with another module's mutant
active (the common case: the trampoline calls the original), and prints the time per call of the plain function and of
the trampoline with each lookup.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from mutmut.mutation import trampoline


def add_one(x: int) -> int:
    return x + 1


def per_call_seconds(function: Callable[[int], int], calls: int, repeats: int) -> float:
    """Median seconds per call of ``function`` over ``repeats`` timed loops of ``calls`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(calls):
            function(i)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()

    active = "app.other_module.x_function__mutmut_1"  # a mutant of another module: the original runs
    os.environ["MUTANT_UNDER_TEST"] = active
    wrapped = trampoline.wrap_in_trampoline({"_mutmut_orig": add_one})(add_one)
    wrapped.__module__ = __name__
    environ_lookup = trampoline.get_mutant_under_test
    rows = {
        "plain function": (add_one, environ_lookup),
        "trampoline, os.environ lookup": (wrapped, environ_lookup),
        "trampoline, fixed lookup": (wrapped, lambda: active),
    }
    print(f"{'call of':<30} {'us per call':>12}")
    seconds = {}
    for name, (function, lookup) in rows.items():
        trampoline.get_mutant_under_test = lookup
        try:
            seconds[name] = per_call_seconds(function, options.calls, options.repeats)
        finally:
            trampoline.get_mutant_under_test = environ_lookup
        print(f"{name:<30} {seconds[name] * 1e6:>12.2f}")
    plain = seconds["plain function"]
    saved = seconds["trampoline, os.environ lookup"] - seconds["trampoline, fixed lookup"]
    overhead = seconds["trampoline, os.environ lookup"] - plain
    print(f"the fixed lookup removes {saved / overhead:.0%} of the trampoline's overhead per call")


if __name__ == "__main__":
    main()

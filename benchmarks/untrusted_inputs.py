"""Time of the reward and parsing code on adversarial, megabyte-sized completions, against a normal-sized one.

The tests in ``tests/rewards`` check that these inputs are handled correctly (finite values made of the documented
terms, valid parses); how long they take is measured here instead, where a slow shared machine cannot fail a test.
The inputs are the tests' own lists (``ONE_MB``, ``ADVERSARIAL_1MB``, ...), loaded from the test files, so the two stay
the same. Each row is one callable on one input: the best of ``--repeats`` calls, in seconds, and its ratio to the
same callable on a normal-sized completion (a few hundred characters) of the same kind.

    python benchmarks/untrusted_inputs.py               # every case, about 10 s on one core
    python benchmarks/untrusted_inputs.py --group trisr  # one group
    python benchmarks/untrusted_inputs.py --slowest 10  # only the 10 slowest rows, then the per-group summary

The tests used to assert under 0.25 s per call (0.5 s for a batch of four consistency completions): the summary
shows the slowest call of each group against that budget.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing

from app.rewards.accuracy import answers_equivalent  # noqa: E402
from app.rewards.parsing import extract_tag, parse_number, parse_option, parse_steps  # noqa: E402
from app.rewards.triplet_parsing import parse_triplet_response  # noqa: E402
from app.rewards.trisr import TripletConsistencyReward, TripletOverallAccuracy, TriSRReward  # noqa: E402
from app.types import VisualSample  # noqa: E402

BUDGET = 0.25  # seconds per call the tests used to allow (0.5 for the consistency batches)
NORMAL_TRIPLET = (
    "<think>Image 1: 7\nImage 2: 4\nImage 3: 2\nCompare 1-2: 1\nCompare 1-3: 1\nCompare 2-3: 2\n"
    "Image 1 has the most dots, then image 2, then image 3.</think><answer>1-2: 1; 1-3: 1; 2-3: 2</answer>"
)
NORMAL_TEXT = (
    "<think>" + "The red dot is left of the blue one, so the answer is yes. " * 5 + "</think><answer>yes</answer>"
)
NORMAL_NUMBER = "<think>" + "Two plus ten is twelve. " * 10 + "</think><answer>12</answer>"
NORMAL_STEPS = (
    "<think>First the colour, then the size.</think>"
    "<answer>change_color(obj_1, red), change_size(obj_2, small)</answer>"
)


def load_test_module(name: str):
    """A test file of ``tests/rewards`` as a module (for its input lists; its tests are not run)."""
    path = ROOT / "tests" / "rewards" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` calls, in seconds (the least disturbed by other processes)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def describe(text: str) -> str:
    head = text[:18].encode("unicode_escape", "backslashreplace").decode()[:18]
    return f"{head!r}... {len(text) / 1e6:.1f} MB"


def cases() -> dict[str, list[tuple[str, str, Callable[[str], object], str]]]:
    """Group -> rows ``(adversarial text, callable name, fn(text), normal text)``; ``fn`` scores or parses a text."""
    groups: dict[str, list] = {}

    trisr = load_test_module("test_trisr")
    sample = trisr.SAMPLES[0]
    rewards = [TriSRReward(), TripletConsistencyReward(), TripletOverallAccuracy()]
    groups["trisr"] = [
        (text, reward.name, lambda t, r=reward: r.score([t], [sample]), NORMAL_TRIPLET)
        for text in trisr.ONE_MB
        for reward in rewards
    ]

    parsing = load_test_module("test_triplet_parsing")
    groups["triplet_parsing"] = [
        (text, "parse_triplet_response", parse_triplet_response, NORMAL_TRIPLET) for text in parsing.ONE_MB
    ]

    stabilizers = load_test_module("test_stabilizers")
    groups["stabilizers"] = [
        (text, reward.name, lambda t, r=reward: r.score([t], [stabilizers.SAMPLE]), NORMAL_TEXT)
        for text in stabilizers.ONE_MB
        for reward in stabilizers.REWARDS
    ]

    consistency = load_test_module("test_consistency_untrusted")
    # test_one_megabyte_inputs' parameters
    texts = ["<answer>" * 125_000, "<answer>" + "9" * 1_000_000 + "</answer>", " " * 1_000_000 + "<answer>3</answer>"]

    def batch_of_four(reward):  # as the test scores it: [text, text, a short answer, text] against a pair of groups
        relation = "negation" if reward.answer_type == "bool" else "identity"
        samples = consistency.pair_samples(2, relation)
        return lambda t: reward.score([t, t, "<answer>3</answer>", t], samples)

    groups["consistency (batch of 4)"] = [
        (text, reward.name, batch_of_four(reward), "<think>three dots</think><answer>3</answer>")
        for text in texts
        for reward in consistency.REWARDS
    ]

    completions = load_test_module("test_untrusted_completions")
    callables = [(r.name, lambda t, r=r: r.score([t], [completions.SAMPLE])) for r in completions.REWARDS]
    callables.append(("extract_tag(think)", lambda t: extract_tag(t, "think")))
    groups["untrusted_completions"] = [
        (text, name, fn, NORMAL_TEXT) for text in completions.ADVERSARIAL_1MB for name, fn in callables
    ]

    new_rewards = load_test_module("test_untrusted_new_rewards")
    parsers = [
        ("parse_number", parse_number, NORMAL_NUMBER),
        ("parse_option", parse_option, NORMAL_NUMBER),
        ("parse_steps", parse_steps, NORMAL_STEPS),
        ("answers_equivalent", lambda t: answers_equivalent(t, t), NORMAL_NUMBER),
    ]
    for reward, label in new_rewards.CASES:
        s = VisualSample(images=[], question="q", task="t", answer=label)
        normal = NORMAL_STEPS if "change_" in label else NORMAL_NUMBER
        parsers.append((reward.name, lambda t, r=reward, s=s: r.score([t], [s]), normal))
    groups["untrusted_new_rewards"] = [
        (text, name, fn, normal) for text in new_rewards.ONE_MB for name, fn, normal in parsers
    ]
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group", action="append", help="only this group (repeatable); default: all")
    parser.add_argument("--repeats", type=int, default=3, help="calls per adversarial input (the best is kept)")
    parser.add_argument("--normal-repeats", type=int, default=50, help="calls per normal-sized input")
    parser.add_argument("--slowest", type=int, default=0, help="print only the N slowest rows (0: every row)")
    args = parser.parse_args()

    groups = cases()
    unknown = set(args.group or []) - set(groups)
    if unknown:
        parser.error(f"unknown group(s) {sorted(unknown)}; known: {sorted(groups)}")
    rows, normal_times = [], {}
    for group, entries in groups.items():
        if args.group and group not in args.group:
            continue
        for text, name, fn, normal in entries:
            key = (group, name, normal)
            if key not in normal_times:
                normal_times[key] = best_time(lambda fn=fn, normal=normal: fn(normal), args.normal_repeats)
            seconds = best_time(lambda fn=fn, text=text: fn(text), args.repeats)
            rows.append((group, describe(text), name, seconds, normal_times[key]))

    shown = sorted(rows, key=lambda r: -r[3])[: args.slowest] if args.slowest else rows
    header = f"{'group':<26} {'input':<40} {'callable':<28} {'s/call':>10} {'normal s/call':>14} {'ratio':>8}"
    print(header)
    print("-" * len(header))
    for group, label, name, seconds, normal in shown:
        print(f"{group:<26} {label:<40} {name:<28} {seconds:>10.6f} {normal:>14.6f} {seconds / normal:>8.0f}")
    print()
    print(f"{'group':<26} {'rows':>5} {'slowest s/call':>15} {'budget':>7} {'max ratio':>10}")
    for group in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == group]
        budget = 2 * BUDGET if group.startswith("consistency") else BUDGET
        slowest = max(r[3] for r in mine)
        ratio = max(r[3] / r[4] for r in mine)
        print(f"{group:<26} {len(mine):>5} {slowest:>15.6f} {budget:>7.2f} {ratio:>10.0f}")


if __name__ == "__main__":
    main()

"""Cost of the reward library: format + accuracy + consistency (OT-GRPO pairing) on one core, and the pairing's share
of a GRPO step.

    python benchmarks/rewards.py              # about 15 s on one core (the tiny model is built and cached on first use)
    python benchmarks/rewards.py --skip-step  # only the reward table, a few seconds

Part 1 scores 10,000 completions, 625 pairs of groups of K = 8 (the paper's per-step volume of 4 prompt pairs x 8
devices x K, times about 20), with each component alone and with the weighted composite, and prints the median of
``--repeats`` runs. Completions are realistic strings (a few hundred characters of thinking, then an answer) from a
simulated model that is right 70% of the time; about 30% are malformed (no answer block, unclosed tags, "maybe", an
empty answer, a truncated thought), so most pairs of groups have unequal numbers of valid answers and go through POT's
network simplex rather than the balanced assignment.

Part 2 compares one GRPO step of the quickstart's shape (8 prompts = 4 pairs, K = 8, 32 new tokens) on the embedded
tiny-qwen3-vl policy, run by a real Lightning Trainer for ``--steps`` steps, with the consistency reward (parsing and
minimal pairing) of 64 realistic completions laid out the same way. The paper reports under 1.5% overhead for OT
pairing at 7B scale; against a tiny model on CPU the step is far cheaper than that, so this is a pessimistic ratio.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import torch  # noqa: E402

from app.rewards import AccuracyReward, FormatReward, WeightedReward  # noqa: E402
from app.rewards.consistency import ConsistencyReward, parse_answers  # noqa: E402
from app.rewards.groups import pair_groups  # noqa: E402
from app.types import VisualSample  # noqa: E402

K = 8
THOUGHTS = [
    "The red dot is near the left edge and the blue dot is further right, so red is left of blue.",
    "I look at both dots. The blue one sits at about a third of the width; the red one is closer to the right side.",
    "Comparing horizontal positions: red centre first, then blue. The order along x decides the answer.",
    "Mirror images swap sides, but here I only need the x coordinates of the two coloured dots in this image.",
]
MALFORMED = [
    "<think>{t}</think> The answer is {a}.",  # no answer block
    "<think>{t}</think><answer>{a}",  # unclosed
    "<think>{t}</think><answer>maybe</answer>",  # unreadable answer
    "<think>{t}</think><answer></answer>",  # empty answer
    "<think>{t} Let me think again about the",  # truncated
]


def realistic_completion(rng: random.Random, truth: str, accuracy: float = 0.7, malformed: float = 0.3) -> str:
    answer = truth if rng.random() < accuracy else {"yes": "no", "no": "yes"}[truth]
    thought = " ".join(rng.sample(THOUGHTS, k=rng.randint(1, 3)))
    if rng.random() < malformed:
        return rng.choice(MALFORMED).format(t=thought, a=answer)
    return f"<think>{thought}</think>\n<answer>{rng.choice([answer, answer.capitalize(), answer + '.'])}</answer>"


def paired_batch(num_pairs: int, seed: int) -> tuple[list[str], list[VisualSample]]:
    """``num_pairs`` pairs of groups of K: completions and samples laid out as the GRPO trainer lays them out."""
    rng = random.Random(seed)
    completions, samples = [], []
    for j in range(num_pairs):
        truth = rng.choice(["yes", "no"])
        relation = rng.choice(["identity", "negation"])
        twin_truth = truth if relation == "identity" else {"yes": "no", "no": "yes"}[truth]
        x = VisualSample([], "Is the red dot left of the blue dot?", "dots", truth, meta={"pair_id": j})
        meta = {"pair_id": j, "relation": relation}
        twin = VisualSample([], "Is the blue dot left of the red dot?", "dots", twin_truth, meta=meta)
        for sample, answer in ((x, truth), (twin, twin_truth)):
            samples += [sample] * K
            completions += [realistic_completion(rng, answer) for _ in range(K)]
    return completions, samples


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def parse_and_pair_times(reward: ConsistencyReward, completions, samples, repeats: int) -> tuple[float, float]:
    """``(whole consistency reward, its answer parsing)`` median times; the difference is the pairing (layout checks,
    verification matrices, couplings)."""
    whole = median_time(lambda: reward.score(completions, samples), repeats)
    parsing = median_time(lambda: parse_answers(completions), repeats)
    return whole, parsing


def reward_table(num_pairs: int, repeats: int) -> None:
    completions, samples = paired_batch(num_pairs, seed=0)
    consistency = ConsistencyReward(answer_type="bool", pairing="minimal")
    components = [FormatReward(weight=0.5), AccuracyReward(), consistency]
    composite = WeightedReward(components)
    composite(completions[: 4 * K], samples[: 4 * K])  # warm-up: imports scipy and POT

    answers = parse_answers(completions)
    valid = [sum(a is not None for a in answers[r]) for pair in pair_groups(samples) for r in pair[:2]]
    unequal = sum(valid[2 * j] != valid[2 * j + 1] for j in range(num_pairs))
    print(
        f"\n{len(completions):,} completions = {num_pairs} pairs x 2 groups x K={K}; "
        f"{sum(a is None for a in answers) / len(answers):.0%} unparseable; {unequal} pairs with unequal valid "
        f"counts (ot.emd), {num_pairs - unequal} balanced (linear_sum_assignment); median of {repeats}, 1 thread\n"
    )
    rows = [(c.name, median_time(lambda c=c: c.score(completions, samples), repeats)) for c in components[:2]]
    whole, parsing = parse_and_pair_times(consistency, completions, samples, repeats)
    rows += [("consistency", whole), ("  parsing answers", parsing), ("  pairing (OT-GRPO)", whole - parsing)]
    rows.append(("total (WeightedReward)", median_time(lambda: composite(completions, samples), repeats)))
    print(f"{'reward':<26}{'time (ms)':>12}{'us / completion':>18}")
    for name, seconds in rows:
        print(f"{name:<26}{seconds * 1e3:>12.1f}{seconds * 1e6 / len(completions):>18.2f}")
    print(f"target: total under 1000 ms -> {'met' if rows[-1][1] < 1.0 else 'MISSED'}")


def grpo_step_ratio(steps: int, repeats: int) -> None:
    import lightning as L

    from app.data import VisualTaskDataModule
    from app.models import VLMPolicy
    from app.modules import VLMGRPOModule
    from app.settings import OptimizerSettings, SamplingSettings
    from app.tasks.dots import PairedDotsDataset

    class StepTimer(L.Callback):
        def __init__(self):
            self.times: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.times.append(time.perf_counter() - self.start)

    torch.manual_seed(0)
    policy = VLMPolicy("tiny-qwen3-vl", lora=None, instruction="")  # full fine-tuning, as in the quickstart
    module = VLMGRPOModule(
        policy,
        rewards=[ConsistencyReward(), FormatReward(weight=0.5)],
        sampling=SamplingSettings(group_size=K, temperature=1.0, max_new_tokens=32),
        optimizer=OptimizerSettings(learning_rate=2e-4),
    )
    data = VisualTaskDataModule(
        functools.partial(PairedDotsDataset, dot_radius=12),
        train_size=64,
        val_size=2,
        test_size=2,
        batch_size=4,
        image_size=64,
    )
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            max_steps=steps,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[timer],
            default_root_dir=root,
        )
        trainer.fit(module, datamodule=data)
    step = statistics.median(timer.times[1:] or timer.times)  # the first step pays one-time costs

    completions, samples = paired_batch(4, seed=1)  # one step's batch: 4 pairs x 2 groups x K = 64 completions
    scoring, parsing = parse_and_pair_times(ConsistencyReward(), completions, samples, repeats * 20)
    pairing = scoring - parsing
    print(f"\nOne GRPO step, quickstart shape (4 pairs = 8 prompts x K={K}, 32 new tokens), tiny-qwen3-vl, 1 thread")
    print(f"{'':<40}{'time (ms)':>12}{'share of step':>16}")
    print(f"{f'GRPO step (median of steps 2..{steps})':<40}{step * 1e3:>12.1f}{'':>16}")
    print(f"{'consistency reward (parse + pairing)':<40}{scoring * 1e3:>12.3f}{scoring / step:>16.3%}")
    print(f"{'  of which pairing (OT-GRPO)':<40}{pairing * 1e3:>12.3f}{pairing / step:>16.3%}")
    print(f"target: consistency reward under 1.5% of a step -> {'met' if scoring / step < 0.015 else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=625, help="pairs of groups of K=8 in the reward table")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps of the tiny model")
    parser.add_argument("--skip-step", action="store_true", help="only the reward table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    reward_table(args.pairs, args.repeats)
    if not args.skip_step:
        grpo_step_ratio(args.steps, args.repeats)


if __name__ == "__main__":
    main()

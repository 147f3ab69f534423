"""What a policy does on labelled dots pairs, for diagnosis only (the training it diagnoses never reads these labels).

    python benchmarks/repro/pair_diagnosis.py runs/quickstart_sft/policy --dot-radius 5 --pairs 200

For each pair ``(x, x')`` of :class:`~app.tasks.dots.PairedDotsDataset` (original wording; the twin mirrored and/or
re-viewed):

- **greedy**: the greedy answers of both prompts; the pair is *consistent and right* (both correct), *consistent and
  wrong* (both wrong: the two answers keep the pair's relation, so a consistency reward is satisfied) or *inconsistent*
  (one right; an unparsable answer counts as wrong). ``accuracy`` is over all prompts.
- **teacher-forced**: ``s(x) = log p(yes target | x) - log p(no target | x)``, the two targets being the SFT targets
  (``<think>red is left/right of blue</think><answer>yes/no</answer>``). On a mirrored pair the correct sign of
  ``s(x) - s(x')`` is that of x's answer (+ for yes): ``correct_sign`` is the fraction of mirrored pairs where it holds,
  i.e. where the policy's preference moves the right way between the two views even when its greedy answers do not.
  That is the latent ability a label-free consistency reward can amplify: minimal pairing credits the completions
  that agree across the pair, and the views where the preference is clearer pull the others along.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from app.models import VLMPolicy
from app.modules.sft import sft_target
from app.rewards.parsing import extract_answer, parse_bool
from app.settings import SamplingSettings
from app.tasks.dots import PairedDotsDataset
from app.types import VisualSample


@dataclass(frozen=True)
class PairDiagnosis:
    accuracy: float  # greedy, over every prompt
    consistent_right: float  # fractions of pairs
    consistent_wrong: float
    inconsistent: float
    correct_sign: float  # over mirrored pairs, teacher-forced
    teacher_forced_accuracy: float  # sign of s(x) right, over every prompt


def target(sample: VisualSample, answer: str) -> str:
    side = "left" if answer == "yes" else "right"
    return sft_target(dataclasses.replace(sample, answer=answer, reasoning=f"red is {side} of blue"))


@torch.no_grad()
def preference(policy: VLMPolicy, samples: Sequence[VisualSample]) -> torch.Tensor:
    """``s(x)`` per sample: the summed log-prob of the yes target minus that of the no target."""
    prompts = policy.encode_prompts(samples)
    scores = []
    for answer in ("yes", "no"):
        targets = policy.encode_targets([target(s, answer) for s in samples])
        logprobs = policy.sequence_logprobs(prompts, targets.completion_ids, targets.completion_mask)
        scores.append((logprobs * targets.completion_mask).sum(dim=1))
    return scores[0] - scores[1]


@torch.no_grad()
def greedy_answers(policy: VLMPolicy, samples: Sequence[VisualSample]) -> list[bool | None]:
    completions = policy.generate(policy.encode_prompts(samples), SamplingSettings(max_new_tokens=32), greedy=True)
    return [None if (a := extract_answer(t)) is None else parse_bool(a) for t in completions.texts]


def diagnose(
    policy_dir: str | Path, pairs: Sequence[tuple[VisualSample, VisualSample]], batch: int = 50
) -> PairDiagnosis:
    if not pairs:
        raise ValueError("no pairs to diagnose")
    policy = VLMPolicy(model=str(policy_dir), lora=None, instruction="")
    policy.eval()
    right, wrong, sign, tf_right = 0, 0, [], 0
    prompts_right = 0
    for start in range(0, len(pairs), batch):
        chunk = pairs[start : start + batch]
        flat = [s for pair in chunk for s in pair]
        answers = greedy_answers(policy, flat)
        scores = preference(policy, flat)
        for j, (x, twin) in enumerate(chunk):
            truth = (x.answer == "yes", twin.answer == "yes")
            correct = [answers[2 * j + k] == truth[k] for k in range(2)]
            prompts_right += sum(correct)
            right += all(correct)
            wrong += not any(correct)
            s_x, s_twin = scores[2 * j].item(), scores[2 * j + 1].item()
            tf_right += (s_x > 0) == truth[0]
            tf_right += (s_twin > 0) == truth[1]
            if twin.meta["relation"] == "negation":
                sign.append((s_x - s_twin > 0) == truth[0])
    n = len(pairs)
    return PairDiagnosis(
        accuracy=prompts_right / (2 * n),
        consistent_right=right / n,
        consistent_wrong=wrong / n,
        inconsistent=(n - right - wrong) / n,
        correct_sign=sum(sign) / len(sign) if sign else float("nan"),
        teacher_forced_accuracy=tf_right / (2 * n),
    )


def target_pairs(
    num_pairs: int,
    seed: int,
    dot_radius: int,
    transforms: Sequence[str] = ("hflip",),
    prob: float = 1.0,
    image_size: int = 64,
):
    """Held-out labelled pairs of the target domain: the seed offset keeps them apart from any training seed's data."""
    dataset = PairedDotsDataset(
        num_pairs,
        seed=10_000 + seed,
        image_size=image_size,
        dot_radius=dot_radius,
        transforms=transforms,
        transform_prob=prob,
    )
    return [dataset[i] for i in range(num_pairs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", help="an exported policy folder")
    parser.add_argument("--dot-radius", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transforms", nargs="+", default=["hflip"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    pairs = target_pairs(args.pairs, args.seed, args.dot_radius, args.transforms)
    print(json.dumps(dataclasses.asdict(diagnose(args.policy, pairs)), indent=1))


if __name__ == "__main__":
    main()

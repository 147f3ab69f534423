"""Monte Carlo check of the random-baseline expectations (docs/algorithms.md; docs/algorithms.md#papers, Proposition
A.1).

An uninformative model answers every prompt with an independent fair coin. Under the identity relation the expected
per-completion reward is 1/2 for random and one-to-all pairing, and for minimal pairing exactly
``E|S + S' - K| / K = C(2K, K) / 4^K`` (S, S' the numbers of "yes" in the two groups; ``S - (K - S')`` is a difference
of two independent Binomial(K, 1/2)), which Stirling's formula turns into the paper's ``1/sqrt(pi K)``.
"""

import math

import pytest
import torch

from app.rewards.consistency import consistency_rewards
from app.types import VisualSample

TRIALS = 2500  # pairs of groups per K; the whole file runs in about 2.5 s on one core


def uninformative_batch(k: int, trials: int, seed: int) -> tuple[list[str], list[VisualSample]]:
    generator = torch.Generator().manual_seed(seed)
    coins = torch.rand(trials * 2 * k, generator=generator) < 0.5
    completions = [f"<think>guess</think><answer>{'yes' if c else 'no'}</answer>" for c in coins.tolist()]
    samples = []
    for t in range(trials):
        x = VisualSample(images=[], question="q", task="t", meta={"pair_id": t})
        twin = VisualSample(images=[], question="q", task="t", meta={"pair_id": t, "relation": "identity"})
        samples += [x] * k + [twin] * k
    return completions, samples


def exact_minimal_expectation(k: int) -> float:
    return math.comb(2 * k, k) / 4**k


@pytest.mark.slow
@pytest.mark.parametrize(("k", "paper_value"), [(8, 0.20), (16, 0.14), (32, 0.10)])
def test_random_baseline_expectations(k, paper_value):
    completions, samples = uninformative_batch(k, TRIALS, seed=k)
    expected = {"random": 0.5, "one_to_all": 0.5, "minimal": exact_minimal_expectation(k)}
    for pairing, mean in expected.items():
        rewards = consistency_rewards(completions, samples, pairing=pairing)  # [TRIALS * 2K]
        per_pair = rewards.double().view(TRIALS, 2 * k).mean(dim=1).numpy()  # pairs are independent trials
        estimate = per_pair.mean()
        standard_error = per_pair.std(ddof=1) / math.sqrt(TRIALS)
        assert abs(estimate - mean) <= 4 * standard_error + 1e-12, (pairing, estimate, mean, standard_error)
    # The exact minimal-pairing expectation is the paper's 1/sqrt(pi K) up to Stirling's correction (< 1.6% here) ...
    approximation = 1 / math.sqrt(math.pi * k)
    assert abs(exact_minimal_expectation(k) - approximation) < 0.016 * approximation
    assert round(approximation, 2) == paper_value  # ... and rounds to the paper's Table 2 figure.

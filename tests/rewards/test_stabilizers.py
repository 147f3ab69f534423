"""Training stabilisers: cosine length reward, n-gram repetition penalty, soft overlong penalty; reference formulas on
random inputs, exact boundaries, and untrusted completions."""

import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reward_contract import assert_well_behaved

from app.rewards import AccuracyReward, WeightedReward
from app.rewards.stabilizers import (
    CosineLengthReward,
    RepetitionPenalty,
    SoftOverlongPenalty,
    cosine_length_reward,
    repetition_penalty,
    soft_overlong_penalty,
    text_length,
)
from app.rewards.trisr import TripletOverallAccuracy
from app.types import VisualSample

SAMPLE = VisualSample(images=[], question="Is the cube red?", task="color", answer="yes")


def words(n: int, rng: random.Random | None = None) -> str:
    rng = rng or random.Random(0)
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "x"]) + str(rng.randint(0, 3)) for _ in range(n))


# ------------------------------------------------------------------------------------------ cosine length
def ref_cosine(length, correct, max_length, v=(1.0, 0.5, -0.5, 0.0)):
    """ms-swift CosineReward.cosfn with min/max swapped for correct answers; lengths clamped at max_length."""
    min_value, max_value = (v[1], v[0]) if correct else (v[3], v[2])
    t = min(length, max_length)
    return max_value - (max_value - min_value) * (1 - math.cos(t * math.pi / max_length)) / 2


@pytest.mark.parametrize("seed", range(100))
def test_cosine_matches_the_reference_on_random_inputs(seed):
    rng = random.Random(seed)
    max_length = rng.randint(1, 200)
    values = tuple(round(rng.uniform(-2, 2), 3) for _ in range(4))
    lengths = [rng.randint(0, 2 * max_length) for _ in range(4)] + [max_length, max_length + rng.randint(1, 50)]
    correct = [rng.random() < 0.5 for _ in lengths]
    texts = [words(n, rng) for n in lengths]
    kwargs = dict(
        min_len_value_correct=values[0],
        max_len_value_correct=values[1],
        min_len_value_wrong=values[2],
        max_len_value_wrong=values[3],
    )
    out = cosine_length_reward(texts, correct, max_length, **kwargs)
    expected = [ref_cosine(n, c, max_length, values) for n, c in zip(lengths, correct, strict=True)]
    assert out.tolist() == pytest.approx(expected, abs=1e-5)
    # at max_length and beyond: exactly the value at max_length (max_len_value_correct or max_len_value_wrong)
    for n, c, value in zip(lengths, correct, out.tolist(), strict=True):
        if n >= max_length:
            assert value == pytest.approx(values[1] if c else values[3], abs=1e-6), (n, c)


def test_cosine_end_points_and_clamp():
    texts = ["", words(50), words(100), words(101), words(10_000)]
    assert cosine_length_reward(texts, [True] * 5, max_length=100).tolist() == pytest.approx([1.0, 0.75, 0.5, 0.5, 0.5])
    assert cosine_length_reward(texts, [False] * 5, max_length=100).tolist() == pytest.approx(
        [-0.5, -0.25, 0.0, 0.0, 0.0]
    )


def test_cosine_length_units():
    assert cosine_length_reward(["abcd"], [True], max_length=4, length_unit="chars").item() == pytest.approx(0.5)
    assert cosine_length_reward(["abcd"], [True], max_length=4, length_unit="words").item() == pytest.approx(
        ref_cosine(1, True, 4)
    )


def test_cosine_wraps_a_correctness_reward():
    reward = CosineLengthReward(max_length=10)
    assert isinstance(reward.correctness, AccuracyReward) and reward.name == "cosine_length"
    assert reward.value_range == (-0.5, 1.0)
    texts = ["<answer>yes</answer>", "<answer>no</answer>", "a " * 20 + "<answer>yes</answer>"]
    assert reward.score(texts, [SAMPLE] * 3).tolist() == pytest.approx(
        [ref_cosine(1, True, 10), ref_cosine(1, False, 10), 0.5]
    )
    # triplets: correct = all three sub-answers right
    meta = {"pair_answers": {"1-2": "1", "1-3": "1", "2-3": "2"}}
    triplet = VisualSample(images=[], question="q", task="t", meta=meta)
    reward = CosineLengthReward(correctness=TripletOverallAccuracy(), max_length=10, max_len_value_wrong=-1.0)
    assert reward.value_range == (-1.0, 1.0)
    out = reward.score(["<answer>1-2: 1; 1-3: 1; 2-3: 2</answer>", "<answer>1-2: 1</answer>"], [triplet] * 2)
    assert out.tolist() == pytest.approx([ref_cosine(6, True, 10), ref_cosine(2, False, 10, (1.0, 0.5, -0.5, -1.0))])
    # threshold: partial credit counts as correct from 0.5 on
    numeric = CosineLengthReward(correctness=_Half(), correct_threshold=0.5, max_length=10)
    assert numeric.score(["a"], [SAMPLE]).item() == pytest.approx(ref_cosine(1, True, 10))


class _Half(AccuracyReward):
    def score(self, completions, samples):
        return torch.full((len(completions),), 0.5)


def test_cosine_checks():
    with pytest.raises(ValueError, match="max_length"):
        CosineLengthReward(max_length=0)
    with pytest.raises(ValueError, match="length_unit"):
        CosineLengthReward(length_unit="tokens")
    with pytest.raises(ValueError, match="finite"):
        CosineLengthReward(min_len_value_wrong=float("nan"))
    with pytest.raises(ValueError, match="correctness flags"):
        cosine_length_reward(["a", "b"], [True])
    with pytest.raises(ValueError, match="answer=None"):  # misconfiguration, from the wrapped accuracy reward
        CosineLengthReward().score(["a"], [VisualSample(images=[], question="q", task="t")])


# ------------------------------------------------------------------------------------------ repetition
def ref_repetition(text, n, max_penalty):
    tokens = text.lower().split()
    if len(tokens) < n:
        return 0.0
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return max_penalty * (1 - len(set(grams)) / len(grams))


@pytest.mark.parametrize("seed", range(100))
def test_repetition_matches_the_reference_on_random_inputs(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 5)
    max_penalty = -rng.uniform(0, 2)
    vocabulary = ["a", "B", "b", "c", "dd", "e\u00e9"][: rng.randint(1, 6)]
    texts = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 40))) for _ in range(5)]
    texts += ["\n\t".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 8)))]
    out = repetition_penalty(texts, n, max_penalty)
    assert out.tolist() == pytest.approx([ref_repetition(t, n, max_penalty) for t in texts], abs=1e-5)
    reward = RepetitionPenalty(ngram_size=n, max_penalty=max_penalty)
    assert reward.value_range == (max_penalty, 0.0)
    assert torch.equal(reward.score(texts, [SAMPLE] * len(texts)), out)


def test_repetition_hand_worked():
    assert repetition_penalty(["a b c a b c"], 3).item() == pytest.approx(-(1 - 3 / 4))
    assert repetition_penalty(["A a a a"], 1).item() == pytest.approx(-(1 - 1 / 4))
    assert repetition_penalty(["", "one two", "one two three"], 3).tolist() == [0.0, 0.0, 0.0]
    assert RepetitionPenalty().name == "repetition_penalty"
    # only the first max_words words are read
    assert repetition_penalty(["a b c d " + "z " * 100], 1, max_words=4).item() == 0.0


def test_repetition_checks():
    with pytest.raises(ValueError, match="max_penalty"):
        RepetitionPenalty(max_penalty=0.5)
    with pytest.raises(ValueError, match="ngram_size"):
        RepetitionPenalty(ngram_size=0)


# ------------------------------------------------------------------------------------------ soft overlong
def ref_overlong(length, max_length, cache):
    if length <= max_length - cache:
        return 0.0
    if length <= max_length:
        return ((max_length - cache) - length) / cache
    return -1.0


@pytest.mark.parametrize("unit", ["words", "chars"])
def test_overlong_boundaries(unit):
    max_length, cache = 100, 20
    unit_text = "w " if unit == "words" else "c"
    lengths = [0, 79, 80, 81, 90, 99, 100, 101, 5000]
    texts = [unit_text * n for n in lengths]
    out = soft_overlong_penalty(texts, max_length, cache, unit).tolist()
    assert out[2] == 0.0  # exactly L_max - L_cache
    assert out[3] == pytest.approx(-1 / 20)
    assert out[4] == pytest.approx(-0.5)
    assert out[6] == -1.0  # exactly L_max
    assert out[7] == -1.0 and out[8] == -1.0
    assert out == pytest.approx([ref_overlong(n, max_length, cache) for n in lengths])


@pytest.mark.parametrize("seed", range(50))
def test_overlong_matches_the_reference_on_random_inputs(seed):
    rng = random.Random(seed)
    max_length = rng.randint(1, 300)
    cache = rng.randint(1, max_length)
    lengths = [rng.randint(0, 2 * max_length) for _ in range(8)]
    texts = [words(n, rng) for n in lengths]
    expected = [ref_overlong(n, max_length, cache) for n in lengths]
    assert soft_overlong_penalty(texts, max_length, cache).tolist() == pytest.approx(expected, abs=1e-6)
    reward = SoftOverlongPenalty(max_length=max_length, cache_length=cache)
    assert reward.score(texts, [SAMPLE] * len(texts)).tolist() == pytest.approx(expected, abs=1e-6)


def test_overlong_cache_equal_to_max_length_and_checks():
    assert soft_overlong_penalty(["", "w", "w w"], max_length=2, cache_length=2).tolist() == [0.0, -0.5, -1.0]
    assert SoftOverlongPenalty().name == "soft_overlong_penalty"
    with pytest.raises(ValueError, match="cache_length"):
        SoftOverlongPenalty(max_length=10, cache_length=11)
    with pytest.raises(ValueError, match="cache_length"):
        SoftOverlongPenalty(max_length=10, cache_length=0)


def test_text_length():
    assert text_length(" a\tb\n\nc  ") == 3 and text_length(" a\tb\n\nc  ", "chars") == 9
    assert text_length("a " * 1000, cap=10) == 10 and text_length(None) == 0
    with pytest.raises(ValueError, match="length_unit"):
        text_length("a", "tokens")


# ------------------------------------------------------------------------------------------ untrusted completions
REWARDS = [
    CosineLengthReward(max_length=50),
    CosineLengthReward(max_length=50, length_unit="chars", min_len_value_wrong=-0.3, name="cosine_chars"),
    RepetitionPenalty(),
    RepetitionPenalty(ngram_size=1, max_penalty=-0.5, name="repetition_1"),
    SoftOverlongPenalty(max_length=50, cache_length=10),
    SoftOverlongPenalty(max_length=50, cache_length=10, length_unit="chars", name="overlong_chars"),
]
CODE = "__import__('os').system('touch PWNED')"
SPECIAL = ["nan", "1e309", "-0", "inf", "1" * 100_000, CODE]


def reference_scores(reward, completions, samples) -> list[float]:
    """What ``reward`` must give, from the reference formulas above (scores are clamped to ``value_range``, so a range
    check could not catch a wrong value). A non-string completion is empty, except for the cosine reward, which gives
    it its lowest value."""
    texts = [c if isinstance(c, str) else "" for c in completions]
    lengths = [len(t) if getattr(reward, "length_unit", None) == "chars" else len(t.split()) for t in texts]
    if isinstance(reward, CosineLengthReward):
        correct = (reward.correctness.score(completions, samples) >= reward.correct_threshold).tolist()
        values = tuple(
            reward.values[k]
            for k in ("min_len_value_correct", "max_len_value_correct", "min_len_value_wrong", "max_len_value_wrong")
        )
        return [
            ref_cosine(n, c, reward.max_length, values) if isinstance(text, str) else min(values)
            for n, c, text in zip(lengths, correct, completions, strict=True)
        ]
    if isinstance(reward, RepetitionPenalty):
        return [
            ref_repetition(" ".join(t.split()[: reward.max_words]), reward.ngram_size, reward.max_penalty)
            for t in texts
        ]
    assert isinstance(reward, SoftOverlongPenalty)
    return [ref_overlong(n, reward.max_length, reward.cache_length) for n in lengths]


def assert_matches_reference(completions, samples=None):
    samples = samples or [SAMPLE] * len(completions)
    for reward in REWARDS:
        values = assert_well_behaved(reward, completions, samples)
        expected = reference_scores(reward, completions, samples)
        assert values.tolist() == pytest.approx(expected, abs=1e-5), (reward.name, completions)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=4))
def test_arbitrary_unicode(completions):
    assert_matches_reference(completions)


_PIECES = st.one_of(
    st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "yes", " ", "\n", *SPECIAL[:4]]),
    st.text(max_size=8),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_tag_soup(text):
    assert_matches_reference([text])


@pytest.mark.parametrize("value", SPECIAL)
def test_special_values(value):
    s = VisualSample(images=[], question="q", task="t", answer=value)
    texts = [value, f"<think>{value}</think><answer>{value}</answer>"]
    assert_matches_reference(texts, [s, s])


ONE_MB = [
    "<answer>" * 125_000,
    "a " * 500_000,
    " ".join(str(i) for i in range(150_000)),  # every n-gram distinct
    "x" * 1_000_000,
    " " * 1_000_000,
    "\ud800 " * 500_000,
    "<think>" + "la " * 330_000 + "</think><answer>yes</answer>",
]


@pytest.mark.parametrize("text", ONE_MB, ids=range(len(ONE_MB)))
def test_one_megabyte_scores(text):
    """The reference values on megabyte inputs (their timing: benchmarks/untrusted_inputs.py)."""
    assert_matches_reference([text])


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=16))
def test_one_megabyte_strings(unit):
    assert_matches_reference([unit * (1_000_000 // len(unit) + 1)])


def test_code_is_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    texts = [CODE, f"<answer>{CODE}</answer>", f"<think>{CODE}</think><answer>{CODE}</answer>"]
    rewards = WeightedReward(REWARDS)
    for answer in ("yes", CODE):
        s = VisualSample(images=[], question="q", task="t", answer=answer)
        out = rewards(texts, [s] * len(texts), accumulate=True)
        assert all(math.isfinite(v) for v in out.total.tolist())
    rewards.compute()
    assert list(tmp_path.iterdir()) == []


def test_non_string_completions_score_in_range():
    completions = [None, b"<answer>yes</answer>", 3, ["<answer>yes</answer>"]]
    assert_matches_reference(completions)
    assert repetition_penalty(completions).tolist() == [0.0] * 4
    assert soft_overlong_penalty(completions).tolist() == [0.0] * 4
    assert CosineLengthReward().score(completions, [SAMPLE] * 4).tolist() == [-0.5] * 4

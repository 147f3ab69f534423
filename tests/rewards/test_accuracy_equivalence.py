"""AccuracyReward's normalisation beyond strings: option letters, booleans, numbers."""

import random

import pytest

from app.rewards.accuracy import AccuracyReward, accuracy_reward, answers_equivalent
from app.types import VisualSample


@pytest.mark.parametrize(
    ("pred", "answer", "expected"),
    [
        # option letters
        ("(b)", "B", True),
        ("Option B", "b", True),
        ("the answer is (B).", "B", True),
        ("Answer: b", "(B)", True),
        ("B", "Option B", True),
        ("C", "B", False),
        ("(A) cup", "A", False),  # a letter with text is not a bare option
        ("A or B", "A", False),
        # booleans
        ("True", "yes", True),
        ("yes.", "TRUE", True),
        ("No", "false", True),
        ("false", "yes", False),
        ("maybe", "yes", False),
        ("1", "yes", False),
        # numbers
        ("0.50", "1/2", True),
        ("1/2", "0.5", True),
        ("$\\frac{1}{2}$", "0.5", True),
        ("50%", "0.5", True),
        ("3.0", "3", True),
        ("3 cm", "3", True),
        ("1,000", "1000", True),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),  # equal up to float rounding
        ("-0", "0", True),
        ("0.33", "1/3", False),
        ("3.0001", "3", False),
        ("three", "3", False),
        ("nan", "nan", True),  # equal strings: the plain exact match
        ("inf", "1e309", False),
        # plain strings
        ("the Red  cube", "the red cube.", True),
        ("", "", False),
        ("red", "", False),
    ],
)
def test_answers_equivalent(pred, answer, expected):
    assert answers_equivalent(pred, answer) is expected
    assert accuracy_reward([f"<answer>{pred}</answer>"], [answer]).item() == float(expected)


def test_fresh_random_number_spellings(random_seed):  # fresh values: another APP_TEST_SEED
    rng = random.Random(random_seed)
    for _ in range(200):
        numerator, denominator = rng.randint(-999, 999), rng.choice([1, 2, 4, 5, 8, 10, 20, 25, 50])
        value = numerator / denominator
        spellings = [f"{numerator}/{denominator}", f"\\frac{{{numerator}}}{{{denominator}}}", repr(value), f"{value}0"]
        for a in spellings:
            for b in spellings:
                assert answers_equivalent(a, b), (a, b)
        assert not answers_equivalent(repr(value + 0.01), spellings[0])


def test_class_uses_the_same_rule():
    sample = VisualSample(images=[], question="q", task="t", answer="1/2")
    out = AccuracyReward().score(["<answer>0.5</answer>", "<answer>0.6</answer>", "0.5"], [sample] * 3)
    assert out.tolist() == [1.0, 0.0, 0.0]

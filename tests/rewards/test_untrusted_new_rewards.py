"""Untrusted completions against the numeric, function-sequence, caption-format and equivalence code paths: finite
values inside value_range, no exception, nothing evaluated, bounded time on megabyte inputs."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reward_contract import assert_well_behaved

from app.rewards.accuracy import AccuracyReward, answers_equivalent
from app.rewards.composite import WeightedReward
from app.rewards.format import CAPTION_TAGS, FormatReward
from app.rewards.function_sequence import FunctionSequenceReward
from app.rewards.numeric import NumericToleranceReward
from app.rewards.parsing import parse_number, parse_option, parse_steps
from app.types import VisualSample

GT_STEPS = "change_color(obj_1, red), change_size(obj_2, small)"
HUGE_INT = "9" * 100_000
PWN = "__import__('os').system('touch PWNED')"

# (reward, label): each reward scored against samples carrying its label
CASES = [
    (NumericToleranceReward(), "12"),
    (NumericToleranceReward(name="numeric_zero", zero_scale=0.5), "0"),
    (FunctionSequenceReward(), GT_STEPS),
    (FunctionSequenceReward(alpha=0.0, beta=0.0, name="fs_exact"), GT_STEPS),
    (FunctionSequenceReward(alpha=-0.25, beta=-0.5, name="fs_penalty"), GT_STEPS),
    (FunctionSequenceReward(ordered=True, name="fs_ordered"), GT_STEPS),
    (FormatReward(tags=CAPTION_TAGS, name="caption_format"), "yes"),
    (AccuracyReward(name="acc_number"), "1/2"),
    (AccuracyReward(name="acc_option"), "B"),
    (AccuracyReward(name="acc_bool"), "yes"),
]


def assert_rewards_and_parsers_well_behaved(completions):
    for reward, label in CASES:
        samples = [VisualSample(images=[], question="q", task="t", answer=label)] * len(completions)
        assert_well_behaved(reward, completions, samples)
    for text in completions:
        number = parse_number(text)
        assert number is None or (isinstance(number, float) and math.isfinite(number))
        assert parse_option(text) is None or parse_option(text) in "abcdefghijklmnopqrstuvwxyz"
        steps = parse_steps(text)
        assert steps is None or 1 <= len(steps) <= 64
        assert answers_equivalent(text, "12") in (True, False)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=4))
def test_arbitrary_unicode(completions):
    assert_rewards_and_parsers_well_behaved(completions)


_PIECES = st.one_of(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
            "<summary>",
            "</summary>",
            "<caption>",
            "</caption>",
            "change_color(",
            "change_size(obj_2, small)",
            "obj_1",
            ", ",
            ")",
            "(",
            "->",
            ";",
            "\n",
            "\\frac{",
            "\\sqrt",
            "\\pi",
            "{",
            "}",
            "$",
            "-",
            "/",
            "%",
            "°",
            "1e309",
            "nan",
            "inf",
            "-0",
            "12",
            "0.5",
            "(B)",
            "Option",
            "yes",
            PWN,
        ]
    ),
    st.text(max_size=8),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_PIECES, max_size=24).map("".join))
def test_tag_and_latex_soup(text):
    assert_rewards_and_parsers_well_behaved([text, f"<answer>{text}</answer>"])


@pytest.mark.parametrize(
    "answer",
    [
        "1e309",
        "-1e309",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "-0",
        HUGE_INT,
        "-" + HUGE_INT,
        "1/" + HUGE_INT,
        PWN,
        "\\frac{1}{0}",
    ],
    ids=lambda a: a[:12].replace("\\", "/"),
)
def test_special_answers(answer):
    completions = [answer, f"<answer>{answer}</answer>", f"<think>t</think><answer>{answer}</answer>"]
    assert_rewards_and_parsers_well_behaved(completions)
    assert parse_number(answer) in (None, 0.0)


ONE_MB = [
    "<answer>" * 125_000,
    "<answer>" + "9" * 1_000_000 + "</answer>",
    "<answer>" + "\\frac{" * 200_000 + "</answer>",
    "<answer>" + "(" * 1_000_000 + "</answer>",
    "<answer>" + "change_color(obj_1, red), " * 40_000 + "</answer>",
    "<answer>" + "change_color(" * 80_000 + "</answer>",
    "<summary>" * 120_000 + "</answer>",
    "<answer>" + "1," * 500_000 + "</answer>",
    "<answer>" + "\\sqrt" * 200_000 + "2</answer>",
    "<answer>" + "the answer is " * 75_000 + "</answer>",
    " " * 1_000_000 + "<answer>12</answer>",
    "\ud800" * 1_000_000,
]


@pytest.mark.parametrize("text", ONE_MB, ids=range(len(ONE_MB)))
def test_one_megabyte_inputs(text):
    """Well-behaved on megabyte inputs (their timing: benchmarks/untrusted_inputs.py)."""
    assert len(text) >= 1_000_000
    assert answers_equivalent(text, text) in (True, False)
    assert_rewards_and_parsers_well_behaved([text])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=16))
def test_one_megabyte_repeats(unit):
    assert_rewards_and_parsers_well_behaved([unit * (1_000_000 // len(unit) + 1)])


def test_code_in_answers_is_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = [
        PWN,
        f"<answer>{PWN}</answer>",
        f"<think>x</think><answer>{PWN}</answer>",
        "<answer>change_color(__import__('os').system('touch PWNED'), red)</answer>",
        "<answer>\\frac{__import__('os').system('touch PWNED')}{1}</answer>",
        "<answer>exec(\"open('PWNED','w').write('x')\")</answer>",
    ]
    for reward, label in CASES:
        samples = [VisualSample(images=[], question="q", task="t", answer=label)] * len(code)
        rewards = WeightedReward([reward])
        out = rewards(code, samples, accumulate=True)
        assert all(math.isfinite(v) for v in out.total.tolist())
        rewards.compute()
    for text in code:
        parse_number(text), parse_option(text), parse_steps(text), answers_equivalent(text, PWN)
    assert list(tmp_path.iterdir()) == []

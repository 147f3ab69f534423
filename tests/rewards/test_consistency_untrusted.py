"""Consistency rewards on untrusted completions: finite values in [0, 1], no exception, nothing evaluated."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reward_contract import assert_well_behaved

from app.rewards.consistency import ConsistencyReward
from app.types import VisualSample

REWARDS = [
    ConsistencyReward(answer_type=answer_type, pairing=pairing, seed=0, name=f"{answer_type}_{pairing}")
    for answer_type in ("bool", "count", "distance")
    for pairing in ("minimal", "one_to_all", "random")
]
CODE = [
    "__import__('os').system('touch PWNED')",
    "<answer>__import__('os').system('touch PWNED')</answer>",
    "<think>x</think><answer>__import__('os').system('touch PWNED')</answer>",
    "<answer>exec(\"open('PWNED','w').write('x')\")</answer>",
    "<answer>eval(compile('import os; os.system(\"touch PWNED\")', 'f', 'exec'))</answer>",
    "<answer>1 if __import__('os').system('touch PWNED') else 0</answer>",
    "<answer>${IFS}touch${IFS}PWNED; $(touch PWNED) `touch PWNED`</answer>",
    "<answer>nan</answer>",
    "<answer>1e309</answer>",
    "<answer>-inf</answer>",
]
NUMERIC_LIKE = ["nan", "NaN", "inf", "1e309", "-1e309", "1e-400", "0", "-0", "3", "3.0", "1/0", "50%", "yes", "no"]


def pair_samples(k: int, relation: str) -> list[VisualSample]:
    x = VisualSample(images=[], question="q", task="t", meta={"pair_id": 0})
    twin = VisualSample(images=[], question="q'", task="t", meta={"pair_id": 0, "relation": relation})
    return [x] * k + [twin] * k


def assert_pairs_well_behaved(completions: list[str]) -> None:
    """Every consistency reward on the completions as k pairs (the first half the originals, the second their twins),
    its values inside [0, 1]."""
    k = len(completions) // 2
    for reward in REWARDS:
        relation = "negation" if reward.answer_type == "bool" else "identity"
        assert reward.value_range == (0.0, 1.0)
        assert_well_behaved(reward, completions[: 2 * k], pair_samples(k, relation))


_PIECES = st.one_of(
    st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "<answer><answer>", "\n", " "]),
    st.sampled_from(NUMERIC_LIKE),
    st.text(max_size=8),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(), min_size=2, max_size=8))
def test_arbitrary_unicode(completions):
    assert_pairs_well_behaved(completions)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_PIECES, max_size=12).map("".join), min_size=2, max_size=16))
def test_nested_and_unclosed_tags(completions):
    assert_pairs_well_behaved(completions)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(NUMERIC_LIKE).map(lambda a: f"<answer>{a}</answer>"), min_size=2, max_size=16))
def test_numeric_edge_cases(completions):
    assert_pairs_well_behaved(completions)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=16))
def test_one_megabyte_strings(unit):
    big = unit * (1_000_000 // len(unit) + 1)
    assert_pairs_well_behaved([big, "<answer>yes</answer>", big, "<answer>" + big])


@pytest.mark.parametrize(
    "text",
    ["<answer>" * 125_000, "<answer>" + "9" * 1_000_000 + "</answer>", " " * 1_000_000 + "<answer>3</answer>"],
    ids=["open_tags", "long_number", "late_answer"],
)
def test_one_megabyte_inputs(text):
    """Well-behaved on megabyte inputs (their timing: benchmarks/untrusted_inputs.py)."""
    assert_pairs_well_behaved([text, text, "<answer>3</answer>", text])


def test_code_is_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_pairs_well_behaved(CODE)
    assert_pairs_well_behaved(CODE[::-1])
    assert list(tmp_path.iterdir()) == []


def test_non_string_completions_score_zero():
    for reward in REWARDS:
        relation = "negation" if reward.answer_type == "bool" else "identity"
        values = reward.score([None, b"<answer>yes</answer>", 3, ["<answer>1</answer>"]], pair_samples(2, relation))
        assert values.tolist() == [0.0] * 4

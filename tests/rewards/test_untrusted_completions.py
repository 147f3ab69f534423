"""Completions are untrusted input: every reward returns a finite value in its range, never raises, never evaluates."""

import ast
import math
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reward_contract import assert_well_behaved

import app.rewards
from app.rewards import AccuracyReward, FormatReward, WeightedReward
from app.rewards.parsing import extract_answer, extract_tag, normalize_answer, parse_bool
from app.types import VisualSample

SAMPLE = VisualSample(images=[], question="q", task="t", answer="yes")
REWARDS = [FormatReward(), FormatReward(allowed_answers=["yes", "no"], name="yes_no"), AccuracyReward()]

CODE = [
    "__import__('os').system('touch PWNED')",
    "<answer>__import__('os').system('touch PWNED')</answer>",
    "<think>x</think><answer>__import__('os').system('touch PWNED')</answer>",
    "<answer>exec(\"open('PWNED','w').write('x')\")</answer>",
    "<answer>eval(compile('import os; os.system(\"touch PWNED\")', 'f', 'exec'))</answer>",
    "<answer>sympy.sympify(\"__import__('os').system('touch PWNED')\")</answer>",
    "<answer>{{ ''.__class__.__mro__[1].__subclasses__() }}</answer>",
    "<answer>${IFS}touch${IFS}PWNED; $(touch PWNED) `touch PWNED`</answer>",
]
ADVERSARIAL_1MB = [
    "<answer>" * 125_000,
    "<think>" * 150_000 + "</think>",
    "<think>" + "a" * 1_000_000 + "</think><answer>yes</answer>",
    "(" * 1_000_000,
    "<" * 1_000_000,
    " " * 1_000_000 + "<answer>yes</answer>",
    "<answer>" + "(a) " * 250_000 + "</answer>",
    "\ud800" * 1_000_000,  # lone surrogates
]


def assert_rewards_and_parsers_well_behaved(completions):
    for reward in REWARDS:
        assert_well_behaved(reward, completions, [SAMPLE] * len(completions))
    for text in completions:
        assert extract_answer(text) is None or isinstance(extract_answer(text), str)
        assert isinstance(normalize_answer(text), str)
        assert parse_bool(text) in (True, False, None)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=4))
def test_arbitrary_unicode(completions):
    assert_rewards_and_parsers_well_behaved(completions)


_PIECES = st.one_of(st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "(A)", "yes", "\n"]), st.text())


@settings(max_examples=150, deadline=None)
@given(st.lists(_PIECES, max_size=20).map("".join))
def test_tag_soup(text):
    assert_rewards_and_parsers_well_behaved([text])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=16))
def test_one_megabyte_strings(unit):
    assert_rewards_and_parsers_well_behaved([unit * (1_000_000 // len(unit) + 1)])


@pytest.mark.parametrize("text", ADVERSARIAL_1MB, ids=range(len(ADVERSARIAL_1MB)))
def test_one_megabyte_parses(text):
    """Well-behaved on megabyte inputs (their timing: benchmarks/untrusted_inputs.py)."""
    assert_rewards_and_parsers_well_behaved([text])
    think = extract_tag(text, "think")
    assert think is None or (isinstance(think, str) and len(think) < len(text))


def test_code_is_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rewards = WeightedReward(REWARDS)
    for answer in ("yes", *CODE):
        sample = VisualSample(images=[], question="q", task="t", answer=answer)
        out = rewards(CODE, [sample] * len(CODE), accumulate=True)
        assert all(math.isfinite(v) for v in out.total.tolist())
    rewards.compute()
    assert list(tmp_path.iterdir()) == []


def test_non_string_completions_score_zero():
    completions = [None, b"<answer>yes</answer>", 3, ["<answer>yes</answer>"]]
    for reward in REWARDS:
        assert reward.score(completions, [SAMPLE] * 4).tolist() == [0.0] * 4


def test_rewards_package_never_evaluates_text():
    builtins = {"eval", "exec", "compile", "__import__"}  # re.compile and Module.eval are fine
    methods = {"sympify", "parse_expr", "literal_eval"}
    for path in pathlib.Path(app.rewards.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name):
                    assert func.id not in builtins, f"{path.name}:{node.lineno} calls {func.id}"
                if isinstance(func, ast.Attribute):
                    assert func.attr not in methods, f"{path.name}:{node.lineno} calls {func.attr}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(m.split(".")[0] == "sympy" for m in modules), f"{path.name} imports sympy"

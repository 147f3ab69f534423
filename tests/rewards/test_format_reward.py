import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from app.rewards import FormatReward
from app.rewards.functional import format_reward
from app.rewards.parsing import MAX_PARSE_CHARS
from app.types import VisualSample

GOOD = [
    "<think>reasoning</think><answer>yes</answer>",
    "<think>a</think>\n<answer>b</answer>",
    "  \n<think>multi\nline</think>  \n\n <answer> 42 </answer>\n ",
    "<think></think><answer>x</answer>",  # empty thinking is allowed (as in the paper's regex)
    "<think>1 < 2 and 3 > 2</think><answer>a <b> c</answer>",
]
BAD = [
    "",
    "yes",
    "<answer>yes</answer>",  # no think
    "<think>r</think>",  # no answer
    "<answer>yes</answer><think>r</think>",  # reversed order
    "prefix <think>r</think><answer>yes</answer>",  # text before
    "<think>r</think><answer>yes</answer> suffix",  # text after
    "<think>r</think> between <answer>yes</answer>",  # text between
    "<think>r</think><answer></answer>",  # empty answer
    "<think>r</think><answer>   </answer>",  # blank answer
    "<think>r</think><answer>yes",  # unclosed answer
    "<think>r<answer>yes</answer>",  # unclosed think
    "<think>r</think><answer>a</answer><answer>b</answer>",  # repeated answer
    "<think>r</think><think>s</think><answer>a</answer>",  # repeated think
    "<think>r<think>s</think></think><answer>a</answer>",  # nested think
    "<think>r</think><answer><answer>a</answer></answer>",  # nested answer
    "<think>r<answer>x</answer></think><answer>a</answer>",  # answer inside think
    "<think>r</think><answer>a</think></answer>",  # stray closing tag
    "<Think>r</Think><answer>a</answer>",  # case-sensitive tags
    "<think >r</think><answer>a</answer>",
]


@pytest.mark.parametrize("text", GOOD)
def test_accepts(text):
    assert format_reward([text]).tolist() == [1.0]


@pytest.mark.parametrize("text", BAD)
def test_rejects(text):
    assert format_reward([text]).tolist() == [0.0]


def test_batch_dtype_and_shape():
    out = format_reward(GOOD + BAD)
    assert out.dtype == torch.float32 and out.shape == (len(GOOD) + len(BAD),)
    assert out.tolist() == [1.0] * len(GOOD) + [0.0] * len(BAD)
    assert format_reward([]).shape == (0,)


def test_allowed_answers():
    texts = [f"<think>t</think><answer>{a}</answer>" for a in ["Yes", "no.", " NO ", "maybe", "yes no", "(yes)"]]
    assert format_reward(texts, allowed_answers=["yes", "no"]).tolist() == [1, 1, 1, 0, 0, 0]
    assert format_reward(texts).tolist() == [1] * 6
    assert format_reward(texts[:1], allowed_answers=["YES."]).tolist() == [1]


@pytest.mark.parametrize("allowed", ["yes", [], [""]])
def test_allowed_answers_misconfigured(allowed):
    with pytest.raises(ValueError, match="allowed_answers"):
        FormatReward(allowed_answers=allowed)


def test_over_long_completion_scores_zero():
    text = "<think>" + "a" * MAX_PARSE_CHARS + "</think><answer>yes</answer>"
    assert format_reward([text]).tolist() == [0.0]


def test_class_matches_functional():
    sample = VisualSample(images=[], question="q", task="t")
    reward = FormatReward(allowed_answers=["yes", "no"])
    texts = GOOD + BAD + ["<think>t</think><answer>No</answer>"]
    assert torch.equal(reward.score(texts, [sample] * len(texts)), format_reward(texts, ["yes", "no"]))
    assert reward.name == "format" and reward.allowed_answers == ["yes", "no"]


_REFERENCE = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_PIECES = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "a", "yes", "<", ">", "/"])


@given(st.lists(_PIECES, max_size=12).map("".join))
def test_matches_reference_regex(text):
    """On small inputs the linear-time check agrees with the paper's regex plus 'each tag once, answer non-empty'."""
    match = _REFERENCE.fullmatch(text)
    expected = (
        match is not None
        and all(text.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>"))
        and match.group(2).strip() != ""
    )
    assert format_reward([text]).item() == float(expected)


def test_scores_are_float32_under_a_float64_default_dtype():
    # Lightning's "64-true" precision makes float64 the default dtype; rewards stay float32.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        functional = format_reward(GOOD[:2] + BAD[:1])
        sample = VisualSample(images=[], question="q", task="t")
        reward = FormatReward().score(GOOD[:2] + BAD[:1], [sample] * 3)
    finally:
        torch.set_default_dtype(previous)
    for out in (functional, reward):
        assert out.dtype == torch.float32 and out.tolist() == [1.0, 1.0, 0.0]


def test_a_completion_of_exactly_the_parse_limit_is_still_checked():
    filler = "a" * (MAX_PARSE_CHARS - len("<think></think><answer>yes</answer>"))
    text = f"<think>{filler}</think><answer>yes</answer>"
    assert len(text) == MAX_PARSE_CHARS
    assert format_reward([text, text + " "]).tolist() == [1.0, 0.0]


def test_a_closing_tag_before_its_opening_tag_is_malformed():
    assert format_reward(["<think></answer>t</think><answer>a"]).tolist() == [0.0]
    # The second block's closing tag sits inside the first block, and what follows it looks like the rest of the
    # sequence; the closing tag must be searched for after the opening one.
    tags = ("summary", "caption", "think", "answer")
    text = "<summary></caption><think>t</think><answer>a</summary><caption></answer>"
    assert format_reward([text], tags=tags).tolist() == [0.0]
    assert format_reward(
        ["<summary>s</summary><caption>c</caption><think>t</think><answer>a</answer>"], tags=tags
    ).tolist() == [1.0]


def test_misconfiguration_messages():
    with pytest.raises(
        ValueError, match=r"^allowed_answers must hold at least one non-empty answer \(or be None to allow"
    ):
        FormatReward(allowed_answers=[" ", "."])
    with pytest.raises(ValueError, match=r"^tags must name at least one block$"):
        FormatReward(tags=[])


def test_constructor_defaults_and_base_arguments():
    reward = FormatReward()
    assert (reward.name, reward.weight, reward.tags, reward.allowed_answers) == (
        "format",
        1.0,
        ("think", "answer"),
        None,
    )
    custom = FormatReward(weight=0.5, dist_sync_on_step=True)
    assert (custom.weight, custom.dist_sync_on_step) == (0.5, True)

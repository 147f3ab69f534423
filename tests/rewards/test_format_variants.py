"""FormatReward with other tag sequences (Reason-RFT's <summary><caption><think><answer> variant)."""

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from app.rewards.format import CAPTION_TAGS, DEFAULT_TAGS, FormatReward, format_reward
from app.types import VisualSample

SAMPLE = VisualSample(images=[], question="q", task="t")

GOOD = [
    "<summary>s</summary><caption>c</caption><think>t</think><answer>a</answer>",
    "  <summary>s</summary>\n<caption>c</caption>\n\n<think>t</think> <answer> a </answer>\n",
    "<summary></summary><caption></caption><think></think><answer>a</answer>",  # only the answer must be non-empty
]
BAD = [
    "<think>t</think><answer>a</answer>",  # the default form lacks summary and caption
    "<caption>c</caption><summary>s</summary><think>t</think><answer>a</answer>",  # out of order
    "<summary>s</summary><think>t</think><caption>c</caption><answer>a</answer>",
    "<summary>s</summary><caption>c</caption><think>t</think><answer> </answer>",  # empty answer
    "<summary>s</summary><caption>c</caption><think>t</think><answer>a",  # unclosed
    "<summary>s<caption>c</caption></summary><think>t</think><answer>a</answer>",  # nested
    "<summary>s</summary><summary>s</summary><caption>c</caption><think>t</think><answer>a</answer>",  # repeated
    "<summary>s</summary>x<caption>c</caption><think>t</think><answer>a</answer>",  # text between
    "x<summary>s</summary><caption>c</caption><think>t</think><answer>a</answer>",
    "<summary>s</summary><caption>c</caption><think>t</think><answer>a</answer>x",
    "<summary>s</summary><caption>c</caption><think>t</think><answer>a</answer></answer>",
    "<summary>s</summary><caption>c</caption><think>t</think></answer>a<answer>",
    "",
]


@pytest.mark.parametrize("text", GOOD)
def test_caption_variant_accepts(text):
    assert format_reward([text], tags=CAPTION_TAGS).tolist() == [1.0]
    assert FormatReward(tags=CAPTION_TAGS).score([text], [SAMPLE]).tolist() == [1.0]


@pytest.mark.parametrize("text", BAD)
def test_caption_variant_rejects(text):
    assert format_reward([text], tags=CAPTION_TAGS).tolist() == [0.0]


def test_default_is_think_answer_and_unchanged():
    assert DEFAULT_TAGS == ("think", "answer") and CAPTION_TAGS == ("summary", "caption", "think", "answer")
    assert FormatReward().tags == DEFAULT_TAGS
    texts = GOOD + BAD
    torch.testing.assert_close(format_reward(texts), format_reward(texts, tags=["think", "answer"]))
    assert format_reward(GOOD).tolist() == [0.0] * len(GOOD)  # extra blocks are text outside the default form


def test_other_tag_sequences_and_allowed_answers():
    assert format_reward(
        ["<answer>yes</answer>", "<think>t</think><answer>yes</answer>"], tags=("answer",)
    ).tolist() == [
        1.0,
        0.0,
    ]
    texts = [f"<summary>s</summary><caption>c</caption><think>t</think><answer>{a}</answer>" for a in ("Yes.", "maybe")]
    assert format_reward(texts, allowed_answers=["yes", "no"], tags=CAPTION_TAGS).tolist() == [1.0, 0.0]
    reward = FormatReward(allowed_answers=["yes", "no"], tags=CAPTION_TAGS, name="caption_format")
    assert reward.score(texts, [SAMPLE, SAMPLE]).tolist() == [1.0, 0.0] and reward.name == "caption_format"


@pytest.mark.parametrize("tags", ["think", (), ("think", "think"), ("a.*",), ("think", ""), (None,), ("<think>",)])
def test_bad_tags_rejected(tags):
    with pytest.raises(ValueError, match="tags"):
        FormatReward(tags=tags)
    with pytest.raises(ValueError, match="tags"):
        format_reward(["x"], tags=tags)


_REFERENCE = re.compile(
    r"\s*<summary>(.*?)</summary>\s*<caption>(.*?)</caption>\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*",
    re.DOTALL,
)
_TAGS = [f"<{t}>" for t in CAPTION_TAGS] + [f"</{t}>" for t in CAPTION_TAGS]
_PIECES = st.sampled_from(_TAGS + [" ", "\n", "a", "<", ">", "/"])


@given(st.lists(_PIECES, max_size=16).map("".join))
def test_matches_reference_regex(text):
    """The authors' caption-format regex, plus 'each tag once, answer non-empty', agrees with the linear check."""
    match = _REFERENCE.fullmatch(text)
    expected = match is not None and all(text.count(t) == 1 for t in _TAGS) and match.group(4).strip() != ""
    assert format_reward([text], tags=CAPTION_TAGS).item() == float(expected)


@given(st.permutations(list(CAPTION_TAGS)), st.lists(st.sampled_from(["", "x", " "]), min_size=4, max_size=4))
def test_only_the_configured_order_passes(order, contents):
    text = "".join(f"<{t}>{c}</{t}>" for t, c in zip(order, contents, strict=True))
    text = text.replace("<answer></answer>", "<answer>a</answer>").replace("<answer> </answer>", "<answer>a</answer>")
    assert format_reward([text], tags=CAPTION_TAGS).item() == float(tuple(order) == CAPTION_TAGS)

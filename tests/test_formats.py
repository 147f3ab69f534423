"""The response formats are spelled once: the prompt, the SFT target, the tokenizer's tokens and the parsers agree."""

import pytest

from app.formats import (
    ANSWER,
    CAPTION_TAGS,
    PAIRS,
    REASONING_INSTRUCTION,
    REASONING_TAGS,
    THINK,
    TRIPLET_RESPONSE_INSTRUCTION,
    close_tag,
    format_response,
    format_triplet_response,
    open_tag,
)
from app.rewards.format import DEFAULT_TAGS, format_reward
from app.rewards.parsing import extract_answer, extract_tag
from app.rewards.triplet_parsing import parse_triplet_response
from app.tiny.tokenizer import REASONING_TOKENS


def test_tags_and_markers():
    assert REASONING_TAGS == DEFAULT_TAGS == (THINK, ANSWER) == ("think", "answer")
    assert CAPTION_TAGS == ("summary", "caption", "think", "answer")
    assert (open_tag(THINK), close_tag(ANSWER)) == ("<think>", "</answer>")
    assert REASONING_TOKENS == ["<think>", "</think>", "<answer>", "</answer>"]
    for marker in REASONING_TOKENS:
        assert marker in REASONING_INSTRUCTION
    assert "<think> </think>" in TRIPLET_RESPONSE_INSTRUCTION and "<answer> </answer>" in TRIPLET_RESPONSE_INSTRUCTION


def test_a_formatted_response_is_what_the_rewards_accept_and_read():
    text = format_response("two and two", "4")
    assert text == "<think>two and two</think><answer>4</answer>"
    assert format_reward([text]).tolist() == [1.0]
    assert extract_answer(text) == "4" and extract_tag(text, THINK) == "two and two"
    captioned = format_response("r", "yes", tags=CAPTION_TAGS)
    assert captioned == "<summary></summary><caption></caption><think>r</think><answer>yes</answer>"
    assert format_reward([captioned], tags=CAPTION_TAGS).tolist() == [1.0]
    with pytest.raises(ValueError, match="reasoning block and an answer block"):
        format_response("r", "a", tags=("answer",))


def test_the_triplet_format_round_trips():
    answers = {"1-2": "2", "1-3": "1", "2-3": "2"}
    reasoning, answer = format_triplet_response([4, 7.5, 2], answers, answers)
    parsed = parse_triplet_response(format_response(reasoning, answer))
    assert parsed.attributes == (4.0, 7.5, 2.0)
    assert parsed.judgments == parsed.answers == answers
    assert tuple(answers) == PAIRS

import pytest

from app.rewards import parsing
from app.rewards.parsing import MAX_PARSE_CHARS, extract_answer, extract_tag, normalize_answer, parse_bool


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>yes</answer>", "yes"),
        ("<think>x</think><answer>  two words \n</answer>", "two words"),
        ("<answer>first</answer><answer>second</answer>", "first"),
        ("<answer></answer>", ""),
        ("<answer>unclosed", None),
        ("</answer>closed before<answer>", None),
        ("no tags", None),
        ("<ANSWER>case</ANSWER>", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_tag_other_tags_and_bad_input():
    assert extract_tag("<think> a <b> </think>", "think") == "a <b>"
    assert extract_tag(None, "think") is None
    assert extract_tag(b"<think>x</think>", "think") is None
    with pytest.raises(ValueError, match="plain name"):
        extract_tag("<a.*>x</a.*>", "a.*")


def test_parsing_is_bounded_to_prefix():
    late = " " * MAX_PARSE_CHARS + "<answer>late</answer>"
    assert extract_answer(late) is None
    early = "<answer>early</answer>" + " " * (2 * MAX_PARSE_CHARS)
    assert extract_answer(early) == "early"


def test_bound_is_read_at_call_time(monkeypatch):
    monkeypatch.setattr(parsing, "MAX_PARSE_CHARS", 10)
    assert extract_answer("<answer>a</answer>") is None
    assert extract_answer("<answer>a") is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Yes", "yes"),
        ("  YES.  ", "yes"),
        ("the  red\n\tcube!", "the red cube"),
        ("(A)", "a"),
        ("(b).", "b"),
        ("C.", "c"),
        ("d)", "d"),
        ("[E]", "e"),
        ("（Ａ）", "a"),  # full-width
        ("Straße", "strasse"),
        ("3.5", "3.5"),
        ("f(x)", "f(x)"),
        ("(A) red", "(a) red"),
        ("...", ""),
        ("", ""),
        (None, ""),
        (42, ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("yes", True),
        ("True", True),
        ("YES.", True),
        ("no", False),
        ("False!", False),
        (" nO ", False),
        ("maybe", None),
        ("yes no", None),
        ("", None),
        (None, None),
        ("1", None),
    ],
)
def test_parse_bool(raw, expected):
    assert parse_bool(raw) is expected

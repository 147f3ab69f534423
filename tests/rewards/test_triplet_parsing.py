"""The structured triplet response: the documented format, the prompt instruction, lenient spellings, malformed
parts."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.rewards import triplet_parsing
from app.rewards.triplet_parsing import (
    PAIRS,
    TRIPLET_RESPONSE_INSTRUCTION,
    TripletResponse,
    format_triplet_response,
    parse_real,
    parse_triplet_response,
)

DOC_EXAMPLE = """<think>
I count the dots in each image.
Image 1: 4
Image 2: 7
Image 3: 2
Compare 1-2: 2
Compare 1-3: 1
Compare 2-3: 2
</think>
<answer>1-2: 2; 1-3: 1; 2-3: 2</answer>"""
EMPTY = TripletResponse()


def test_the_documented_example_is_in_the_module_doc_and_parses():
    assert DOC_EXAMPLE.replace("\n", "\n    ") in triplet_parsing.__doc__
    r = parse_triplet_response(DOC_EXAMPLE)
    assert r.attributes == (4.0, 7.0, 2.0)
    assert r.judgments == {"1-2": "2", "1-3": "1", "2-3": "2"}
    assert r.answers == {"1-2": "2", "1-3": "1", "2-3": "2"}


def test_the_instruction_asks_for_the_parsed_format():
    """Filling the instruction's own templates gives a response the parser reads completely."""
    for template in ("'Image 1: <number>'", "'Compare 1-2: <answer>'", "'1-2: <answer>; 1-3: <answer>; 2-3: <answer>'"):
        assert template in TRIPLET_RESPONSE_INSTRUCTION
    assert "<think> </think>" in TRIPLET_RESPONSE_INSTRUCTION and "<answer> </answer>" in TRIPLET_RESPONSE_INSTRUCTION
    lines = [f"Image {k}: <number>" for k in (1, 2, 3)] + [f"Compare {p}: <answer>" for p in PAIRS]
    filled = "<think>" + "\n".join(lines) + "</think><answer>1-2: <answer>; 1-3: <answer>; 2-3: <answer></answer>"
    filled = filled.replace("<number>", "3.5").replace(": <answer>", ": same")
    r = parse_triplet_response(filled)
    assert r.attributes == (3.5, 3.5, 3.5)
    assert set(r.judgments.values()) == {"same"} and set(r.answers.values()) == {"same"}


@pytest.mark.parametrize("seed", range(50))
def test_format_and_parse_round_trip(seed):
    rng = random.Random(seed)
    attributes = [rng.choice([rng.randint(0, 50), round(rng.uniform(-100, 100), 3)]) for _ in range(3)]
    words = ["1", "2", "3", "same", "image 2", "[-3, -1]", "left of", "a"]
    judgments = {p: rng.choice(words) for p in PAIRS}
    answers = {p: rng.choice(words) for p in PAIRS}
    reasoning, answer = format_triplet_response(attributes, judgments, answers)
    r = parse_triplet_response(f"<think>{reasoning}</think>\n<answer>{answer}</answer>")
    assert r.attributes == tuple(float(a) for a in attributes)
    assert r.judgments == judgments and r.answers == answers


def test_lenient_spellings():
    text = (
        "<think>Let me look.\n- **Image 1:** 3 dots\n* IMAGE 2 = 5.\n  image3: 1\n"
        "## Compare (1, 2): Image 2\ncompare 1 vs 3 = (A)\nCOMPARE 2-3: B.</think>"
        "<answer>\n(1,2): Image 2\npair 1 vs 3 = 1\n2–3: second.</answer>"
    )
    r = parse_triplet_response(text)
    assert r.attributes == (3.0, 5.0, 1.0)
    assert r.judgments == {"1-2": "image 2", "1-3": "a", "2-3": "b"}
    assert r.answers == {"1-2": "image 2", "1-3": "1", "2-3": "second"}


def test_thinking_model_completion_without_the_opening_think_tag():
    r = parse_triplet_response("Image 1: 2\nCompare 1-2: 1\n</think>\n<answer>1-2: 1</answer>")
    assert r.attributes == (2.0, None, None) and r.judgments["1-2"] == "1" and r.answers["1-2"] == "1"


@pytest.mark.parametrize(
    "text, expected",
    [
        # conflicting repeats are ambiguous; identical repeats are fine
        ("<answer>1-2: 1; 1-2: 2; 1-3: 3; 1-3: 3</answer>", {"1-2": None, "1-3": "3", "2-3": None}),
        # reversed pairs and pairs of an image with itself are not read
        ("<answer>2-1: 1; 3-3: 3; 1-3: 1</answer>", {"1-2": None, "1-3": "1", "2-3": None}),
        # empty and over-long values are malformed
        (
            "<answer>1-2: ; 1-3: " + "x" * 65 + "; 2-3: " + "y" * 64 + "</answer>",
            {"1-2": None, "1-3": None, "2-3": "y" * 64},
        ),
        # unclosed answer block, or none at all
        ("<answer>1-2: 1; 1-3: 1; 2-3: 2", dict.fromkeys(PAIRS)),
        ("1-2: 1; 1-3: 1; 2-3: 2", dict.fromkeys(PAIRS)),
        # judgments are not answers
        ("<think>Compare 1-2: 1</think>", dict.fromkeys(PAIRS)),
    ],
)
def test_malformed_answers(text, expected):
    assert parse_triplet_response(text).answers == expected


def test_malformed_reasoning():
    r = parse_triplet_response(
        "<think>Image 1: four\nImage 2: 3\nImage 2: 3.0\nImage 3: 1\nImage 3: 2\nImage 4: 9\nCompare 1-2: 1\n"
        "Compare 1-2: 2\nCompare 2-1: 1</think><answer>x</answer>"
    )
    assert r.attributes == (None, 3.0, None)  # not a number; repeated equal; conflicting
    assert r.judgments == dict.fromkeys(PAIRS)
    # the reasoning must be a closed <think> block (or text before </think>): here it is unclosed
    assert parse_triplet_response("<think>Image 1: 3\nCompare 1-2: 1").attributes == (None, None, None)


@pytest.mark.parametrize("bad", [None, b"<answer>1-2: 1</answer>", 3, ["<answer>1-2: 1</answer>"], ""])
def test_non_strings_and_empty_give_empty_responses(bad):
    assert parse_triplet_response(bad) == EMPTY


@pytest.mark.parametrize(
    "text, value",
    [
        ("4", 4.0),
        ("-0", 0.0),
        ("3.25.", 3.25),
        (".5", 0.5),
        ("2E3", 2000.0),
        ("nan", None),
        ("inf", None),
        ("1e309", None),
        ("-1e309", None),
        ("1" * 100_000, None),
        ("1" * 33, None),
        ("0x10", None),
        ("1_000", None),
        ("__import__('os').system('touch PWNED')", None),
    ],
)
def test_parse_real(text, value):
    result = parse_real(text)
    assert result == value and (value is None or type(result) is float)


def test_special_numbers_as_estimates():
    digits = "7" * 100_000
    r = parse_triplet_response(f"<think>Image 1: nan\nImage 2: 1e309\nImage 3: {digits}</think>")
    assert r.attributes == (None, None, None)
    r = parse_triplet_response("<think>Image 1: -0\nImage 2: -1e308\nImage 3: 1e-320</think>")
    assert r.attributes == (0.0, -1e308, 1e-320)


def assert_valid(r: TripletResponse):
    assert isinstance(r, TripletResponse) and len(r.attributes) == 3
    assert all(a is None or (isinstance(a, float) and abs(a) < float("inf")) for a in r.attributes)
    for field in (r.judgments, r.answers):
        assert set(field) == set(PAIRS)
        assert all(v is None or (isinstance(v, str) and 0 < len(v) <= 64) for v in field.values())


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_arbitrary_unicode(text):
    assert_valid(parse_triplet_response(text))


_PIECES = st.one_of(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
            "Image 1: ",
            "Compare 1-2: ",
            "1-3: ",
            "2-3 =",
            ";",
            "\n",
            "nan",
            "1e309",
            "-0",
            "(A)",
            "same",
            " vs ",
            "**",
        ]
    ),
    st.text(max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_tag_soup(text):
    assert_valid(parse_triplet_response(text))


ONE_MB = [
    "<think>" + "Image 1: 3\n" * 100_000 + "</think>",
    "<answer>" + "1-2: 1;" * 150_000 + "</answer>",
    "<answer>" + "(" * 1_000_000,
    "<think>" + "Compare 1-2:" * 90_000 + "</think><answer>" + "1" * 1_000_000 + "</answer>",
    " " * 1_000_000 + "<answer>1-2: 1</answer>",
    "<think>" + "image " * 170_000,
    "\ud800" * 1_000_000,
]


@pytest.mark.parametrize("text", ONE_MB, ids=range(len(ONE_MB)))
def test_one_megabyte_parses(text):
    """Valid parses of megabyte inputs (their timing: benchmarks/untrusted_inputs.py)."""
    assert_valid(parse_triplet_response(text))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=16))
def test_one_megabyte_strings(unit):
    assert_valid(parse_triplet_response(unit * (1_000_000 // len(unit) + 1)))

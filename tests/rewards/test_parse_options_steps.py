"""parse_option and parse_steps: accepted forms, refusals, bounds."""

import pytest

from app.rewards.parsing import FUNCTIONS, MAX_STEPS, FunctionStep, parse_option, parse_steps


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A", "a"),
        ("b", "b"),
        ("(b)", "b"),
        ("[C]", "c"),
        ("d)", "d"),
        ("D.", "d"),
        ("（Ａ）", "a"),
        ("Option C", "c"),
        ("option (c)", "c"),
        ("Choice: B", "b"),
        ("the answer is D", "d"),
        ("The answer is (d).", "d"),
        ("Answer: B", "b"),
        ("answer: (b)", "b"),
        ("The correct answer is option B.", "b"),
        ("Final answer: C", "c"),
        ("  (a)  ", "a"),
        ("(A) cup", None),  # letter plus option text: not accepted
        ("A or B", None),
        ("A, B", None),
        ("AB", None),
        ("(a)(b)", None),
        ("yes", None),
        ("42", None),
        ("", None),
        ("the answer is", None),
        ("Option", None),
        (None, None),
        (b"A", None),
        ("A" + " " * 100, "a"),
        ("x" * 100 + " A", None),
    ],
)
def test_parse_option(text, expected):
    assert parse_option(text) == expected


def test_parse_option_reads_answers_up_to_64_characters():
    # the bound is on the stripped text before whitespace is collapsed: 64 characters are read, 65 are not
    at_bound = "option" + " " * 57 + "a"
    assert len(at_bound) == 64 and parse_option(at_bound) == "a"
    assert parse_option(" " + at_bound + " ") == "a"  # surrounding whitespace does not count
    assert parse_option("option" + " " * 58 + "a") is None


def test_parse_option_num_options():
    assert [parse_option(x, 4) for x in "ABCDE"] == ["a", "b", "c", "d", None]
    assert parse_option("(z)", 26) == "z"
    assert parse_option("B", 1) is None
    for bad in (0, 27, -1, 2.0, "4"):
        with pytest.raises(ValueError, match="num_options"):
            parse_option("A", bad)


def step(f, o, v):
    return FunctionStep(f, o, v)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("change_color(obj_2, red)", [step("change_color", "obj_2", "red")]),
        (
            "change_color(obj_2, red), change_size(obj_1, small)",
            [step("change_color", "obj_2", "red"), step("change_size", "obj_1", "small")],
        ),
        (
            "change_color(2,red);change_size(1,small)",
            [step("change_color", "2", "red"), step("change_size", "1", "small")],
        ),
        (
            "change_color(2, red)\nchange_size(1, small)\n",
            [step("change_color", "2", "red"), step("change_size", "1", "small")],
        ),
        (
            "change_color(2, red) -> change_size(1, small) → change_shape(0, cube)",
            [step("change_color", "2", "red"), step("change_size", "1", "small"), step("change_shape", "0", "cube")],
        ),
        (
            "[change_material(3, 'metal'), change_position(0, \"front left\")]",
            [step("change_material", "3", "metal"), step("change_position", "0", "front left")],
        ),
        ("  CHANGE_COLOR ( OBJ_2 ,  Red  ) ; ", [step("change_color", "obj_2", "red")]),
        ("change_size(obj 1,  very   small)", [step("change_size", "obj 1", "very small")]),
        ("change_color(2, red),\n-> change_size(1, small)", None),  # two separators in a row
        ("change_color(obj_2)", None),
        ("change_color(obj_2, red, blue)", None),
        ("change_color(, red)", None),
        ("change_color(obj_2, )", None),
        ("change_color(obj_2, red) change_size(1, small)", None),  # no separator
        ("change_color(obj_2, red), and then change_size(1, small)", None),
        ("change_colour(obj_2, red)", None),  # not in the whitelist
        ("delete(obj_2, red)", None),
        ("__import__('os').system('touch PWNED')", None),
        ("os.system(rm, rf)", None),
        ("change_color(obj_2, r$d)", None),
        ("change_color(obj(2), red)", None),
        ("change_color obj_2 red", None),
        ("", None),
        ("[]", None),
        ("[change_color(1, red))", None),  # an opening bracket without its closing one
        (",", None),
        (None, None),
        (3, None),
    ],
)
def test_parse_steps(text, expected):
    assert parse_steps(text) == expected


def test_parse_steps_is_bounded():
    one = "change_size(1, small)"
    assert len(parse_steps(", ".join([one] * MAX_STEPS))) == MAX_STEPS
    assert parse_steps(", ".join([one] * (MAX_STEPS + 1))) is None


def test_function_step_is_frozen_and_hashable():
    s = FunctionStep("change_size", "1", "small")
    with pytest.raises(AttributeError):
        s.obj = "2"
    assert len({s, FunctionStep("change_size", "1", "small")}) == 1
    assert FUNCTIONS == ("change_size", "change_color", "change_material", "change_shape", "change_position")

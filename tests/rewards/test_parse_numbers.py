"""parse_number: the whitelist grammar (plain numbers, units, simple LaTeX), and what it must refuse."""

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.rewards.parsing import parse_number

PI = math.pi

ACCEPTED = [
    # plain numbers
    ("42", 42.0),
    ("-0.5", -0.5),
    ("+7", 7.0),
    (".25", 0.25),
    ("3.", 3.0),
    ("2.5e3", 2500.0),
    ("1E-2", 0.01),
    ("1,000", 1000.0),
    ("12,345.5", 12345.5),
    ("1,000,000", 1e6),
    ("3/4", 0.75),
    ("-3/4", -0.75),
    ("3 / -4", -0.75),
    ("50%", 0.5),
    ("50 %", 0.5),
    ("50\\%", 0.5),
    ("12.5 percent", 0.125),
    ("−3", -3.0),  # unicode minus
    ("½", 0.5),
    ("３", 3.0),  # full-width digit
    ("  7. ", 7.0),
    # currency, units, degrees
    ("$5", 5.0),
    ("\\$5", 5.0),
    ("3.5 m", 3.5),
    ("12 cm", 12.0),
    ("12cm", 12.0),
    ("12 cm^2", 12.0),
    ("12 cm²", 12.0),
    ("7 meters", 7.0),
    ("3 square meters", 3.0),
    ("45°", 45.0),
    ("45 °", 45.0),
    ("45^\\circ", 45.0),
    ("45^{\\circ}", 45.0),
    ("45 degrees", 45.0),
    ("45\\degree", 45.0),
    ("5\\text{m}", 5.0),
    ("5 \\text{ cm}", 5.0),
    ("5\\mathrm{cm}^2", 5.0),
    ("4 apples", 4.0),
    # LaTeX
    ("$\\frac{3}{4}$", 0.75),
    ("\\frac{3}{4}", 0.75),
    ("\\dfrac{1}{2}", 0.5),
    ("\\tfrac{1}{8}", 0.125),
    ("\\frac12", 0.5),
    ("\\frac{-1}{2}", -0.5),
    ("-\\frac{1}{2}", -0.5),
    ("\\sqrt{2}", math.sqrt(2)),
    ("\\sqrt 2", math.sqrt(2)),
    ("\\sqrt2", math.sqrt(2)),
    ("\\sqrt{16}", 4.0),
    ("2\\sqrt{3}", 2 * math.sqrt(3)),
    ("\\frac{\\sqrt{3}}{2}", math.sqrt(3) / 2),
    ("\\frac{2\\sqrt{3}}{3}", 2 * math.sqrt(3) / 3),
    ("\\pi", PI),
    ("π", PI),
    ("pi", PI),
    ("3\\pi", 3 * PI),
    ("3 \\pi", 3 * PI),
    ("2π", 2 * PI),
    ("-2\\pi", -2 * PI),
    ("\\frac{\\pi}{2}", PI / 2),
    ("\\frac\\pi2", PI / 2),
    ("\\pi/2", PI / 2),
    ("\\frac{3}{2}\\pi", 1.5 * PI),
    ("\\frac{3\\pi}{4}", 0.75 * PI),
    ("4\\sqrt{2}\\pi", 4 * math.sqrt(2) * PI),
    ("$-\\frac{3}{4}$", -0.75),
    ("\\(0.5\\)", 0.5),
    ("\\[0.5\\]", 0.5),
    ("\\left(\\frac{1}{2}\\right)", 0.5),
    ("(3)", 3.0),
    ("{3}", 3.0),
    ("1\\,000", 1000.0),
    ("\\displaystyle \\frac{1}{4}", 0.25),
    ("$12$ cm", 12.0),
    ("\\frac{9}{2}\\text{ cm}", 4.5),
    ("1" * 30, float("1" * 30)),
    ("1" * 30 + "e2", float("1" * 30 + "e2")),  # exponent digits do not count towards the 30
    ("2\\sqrt{2}\\pi\\pi", 2 * math.sqrt(2) * PI * PI),  # four factors: the most one product takes
    ("(1)/" + "(" * 8 + "2" + ")" * 8, 0.5),  # the nesting limit counts open groups, not groups seen before
    ("4 pix", 4.0),  # a unit that starts with "pi" is not pi
    ("2 pints", 2.0),
    ("7?", 7.0),  # trailing punctuation
    ("3.5;", 3.5),
    ("42!", 42.0),
    ("1" + " " * 254 + "m", 1.0),  # 256 characters: the longest answer read
]

REFUSED = [
    "",
    "   ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "infinity",
    "\\infty",
    "1e309",
    "-1e309",
    "1e308 * 10",
    "1" * 31,  # more digits than any sensible answer
    "1" * 100_000,
    "1,5",  # ambiguous decimal comma
    "1,0000",
    "2 + 2",
    "3 - 1",
    "2 * 3",
    "2 \\times 3",
    "2^3",
    "10^{3}",
    "1/2/3",
    "1/0",
    "\\frac{1}{0}",
    "\\sqrt{-1}",
    "\\sqrt[3]{8}",
    "2\\frac{1}{2}",  # mixed number: ambiguous
    "\\pi2",
    "3 4",
    "3 and 4",
    "3 or 4",
    "3 and four",
    "x",
    "x = 5",
    "five",
    "(a)",
    "yes",
    "2e",
    "--5",
    "+-5",
    "5 m/s",
    "((((((((((1))))))))))",  # nesting deeper than the limit
    "(1)/" + "(" * 9 + "2" + ")" * 9,
    "2\\pi\\pi\\pi\\pi",  # five factors
    "2πr",  # pi times a variable
    "2πr2",
    "3 or. four",  # a connective, even with a dot
    "\\(1/2",  # an unclosed \( delimiter
    "1" + " " * 300 + "m",  # longer than 256 characters
    "\\frac{1}{2",
    "\\frac{1}",
    "\\sqrt{}",
    "{}",
    "()",
    "__import__('os').system('touch PWNED')",
    "0x10",
    "1_000",
    None,
    b"42",
    42,
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_accepted_forms(text, expected):
    value = parse_number(text)
    assert value is not None and math.isclose(value, expected, rel_tol=1e-12), value


@pytest.mark.parametrize("text", REFUSED)
def test_refused_forms(text):
    assert parse_number(text) is None


@pytest.mark.parametrize("text", ["-0", "-0.0", "-0/5", "-0%", "-0 m", "0"])
def test_negative_zero_is_zero(text):
    value = parse_number(text)
    assert value == 0.0 and math.copysign(1.0, value) == 1.0


@pytest.mark.parametrize(
    "form", ["\\pi", "π", "pi", "Π", "PI"], ids=["latex", "greek", "letters", "greek-capital", "letters-capital"]
)
def test_each_pi_form_is_read_whole_and_nothing_past_it(form):
    # what follows pi is read on: a "/" right after it, a factor before it, a unit after it
    assert parse_number(f"{form}/4") == PI / 4
    assert parse_number(f"2{form}/4") == PI / 2
    assert parse_number(f"{form}/4 m") == PI / 4
    assert parse_number(f"{form}2") is None


@pytest.mark.parametrize(("text", "expected"), [("\\sqrt{0}", 0.0), ("\\sqrt0", 0.0), ("\\sqrt{0.25}", 0.5)])
def test_sqrt_of_zero_and_of_values_below_one(text, expected):
    assert parse_number(text) == expected


def test_bounded_nesting_is_accepted_up_to_the_limit():
    assert parse_number("(" * 8 + "1" + ")" * 8) == 1.0
    assert parse_number("(" * 9 + "1" + ")" * 9) is None


def test_random_floats_round_trip(random_seed):
    rng = random.Random(random_seed)
    for _ in range(500):
        value = rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-8, 8)
        assert parse_number(repr(value)) == value
        assert parse_number(f"{value:,.6f}") == pytest.approx(value, rel=1e-12, abs=1e-6)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_finite_float_repr_parses_to_itself(value):
    assert parse_number(repr(value)) == value + 0.0


@given(st.integers(min_value=-(10**29), max_value=10**29), st.integers(min_value=1, max_value=10**6))
def test_fractions_and_latex_fractions_agree(numerator, denominator):
    expected = numerator / denominator
    assert parse_number(f"{numerator}/{denominator}") == pytest.approx(expected)
    assert parse_number(f"\\frac{{{numerator}}}{{{denominator}}}") == pytest.approx(expected)

"""Safe parsing of untrusted model text.

Completions are untrusted input (docs/rewards.md#completions-are-untrusted-text): nothing here evaluates text (no
``eval``, ``exec``, ``compile`` or sympy), every function bounds its work, and malformed input maps to ``None`` (or
``""``), never to an exception.

Bounded work:

- Every function first cuts its input to its first :data:`MAX_PARSE_CHARS` characters, before any search or regex.
  A completion longer than that is treated as its prefix, so an answer block that starts past the bound is not seen.
  :class:`~app.rewards.FormatReward` goes further and scores any over-long completion 0 (it cannot check the rest).
- Tags are found with ``str.find`` (linear), not with ``<tag>(.*?)</tag>`` regexes, which go quadratic on inputs such
  as ``"<answer>" * 100_000``. Regexes are matched at a position (``match``/``fullmatch``, never ``search`` over a
  completion), with bounded repetitions, or run only on the few hundred characters a short-answer parser accepts.
- Non-string input (``None``, bytes, numbers) is malformed: parsers return ``None``, :func:`normalize_answer` ``""``.
- Parsers of short answers (:func:`parse_number`, :func:`parse_option`) reject anything longer than a few hundred
  characters before looking at it. :func:`parse_number` is a small recursive descent over a whitelist grammar (numbers,
  ``\\frac``, ``\\sqrt``, ``\\pi``, unary minus) with a depth limit, not an expression evaluator; digit strings longer
  than 30 are rejected before ``float`` sees them (``int`` is never called on text).
- :func:`parse_steps` reads at most :data:`MAX_STEPS` function steps with anchored, bounded regexes.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

from app.formats import ANSWER, close_tag, open_tag

MAX_PARSE_CHARS = 20_000
"""Characters of a completion that parsing looks at; the rest is ignored (about 5k tokens, far above a usual answer)."""

_TAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_OPTION_LETTER = re.compile(r"[(\[]?([a-z])[)\]]?")  # "(a)", "[a]", "a)", "a" -> "a"; fullmatch only, no nesting
_TRAILING = ".,;:!?。 "
_TRUE = frozenset({"true", "yes"})
_FALSE = frozenset({"false", "no"})


def bounded(text: object) -> str | None:
    """Return ``text`` cut to :data:`MAX_PARSE_CHARS` characters, or ``None`` if it is not a string."""
    if not isinstance(text, str):
        return None
    return text[:MAX_PARSE_CHARS]


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the first ``<tag>...</tag>`` in ``text``, stripped; ``None`` if the tag is missing or unclosed.

    ``tag`` is trusted (code or config) and must be a plain name such as ``"answer"``; ``text`` is untrusted.
    Matching is case-sensitive, as in the Reason-RFT format.

    >>> extract_tag("<think>hmm</think> <answer> Yes </answer>", "answer")
    'Yes'
    >>> extract_tag("<answer>never closed", "answer") is None
    True
    """
    if not isinstance(tag, str) or _TAG_NAME.fullmatch(tag) is None:
        raise ValueError(f"tag must be a plain name like 'answer', got {tag!r}")
    text = bounded(text)
    if text is None:
        return None
    opening, closing = open_tag(tag), close_tag(tag)
    start = text.find(opening)
    if start < 0:
        return None
    start += len(opening)
    end = text.find(closing, start)
    if end < 0:
        return None
    return text[start:end].strip()


def extract_answer(text: str) -> str | None:
    """Content of the first ``<answer>...</answer>`` block, stripped; ``None`` if there is none.

    >>> extract_answer("<think>2 + 2</think><answer>4</answer>")
    '4'
    """
    return extract_tag(text, ANSWER)


def normalize_answer(s: str) -> str:
    """Canonical form of a short answer for exact-match comparison.

    Steps: NFKC (full-width letters become ASCII), casefold, collapse runs of whitespace to one space, strip surrounding
    whitespace and trailing punctuation (``.,;:!?``), and reduce a bare option letter such as ``"(A)"``, ``"[B]"``,
    ``"C)"`` or ``"D."`` to the letter. Non-strings give ``""``.

    >>> normalize_answer("  The   Red Cube. ")
    'the red cube'
    >>> normalize_answer("(A)"), normalize_answer("b."), normalize_answer("Yes!")
    ('a', 'b', 'yes')
    """
    s = bounded(s)
    if s is None:
        return ""
    s = unicodedata.normalize("NFKC", s).casefold()
    s = " ".join(s.split()).rstrip(_TRAILING)
    option = _OPTION_LETTER.fullmatch(s)
    return option.group(1) if option is not None else s


def parse_bool(s: str) -> bool | None:
    """``True`` for true/yes, ``False`` for false/no (any case, trailing punctuation allowed), else ``None``.

    >>> parse_bool("Yes."), parse_bool("FALSE"), parse_bool("maybe")
    (True, False, None)
    """
    s = normalize_answer(s)
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    return None


_MAX_OPTION_CHARS = 64
_OPTION = re.compile(
    r"(?:(?:the )?(?:correct |final |right )?(?:answer|option|choice)(?: is)?:? )?"  # "the correct answer is: "
    r"(?:option |choice )?[(\[]?([a-z])[)\]]?"  # "option (b)", "[c]", "d"
)


def parse_option(s: str, num_options: int | None = None) -> str | None:
    """The option letter an answer names, lower-case; ``None`` if it names none or is not only an option.

    Accepted: a bare letter with optional brackets (``"B"``, ``"(b)"``, ``"[B]"``, ``"b)"``, ``"B."``), optionally after
    ``"option"``/``"choice"`` or ``"(the) (correct|final) answer (is)(:)"``. A letter followed by more text, such as
    ``"(A) cup"`` or ``"A or B"``, is ``None``: it could contradict itself, and exact match should not guess. With
    ``num_options``, a letter past the last option (``"E"`` of 4) is ``None`` too.

    >>> parse_option("Option C"), parse_option("the answer is (d)."), parse_option("A or B"), parse_option("E", 4)
    ('c', 'd', None, None)
    """
    if num_options is not None and not (isinstance(num_options, int) and 1 <= num_options <= 26):
        raise ValueError(f"num_options must be an int in 1..26, got {num_options!r}")
    text = bounded(s)
    if text is None or len(text := text.strip()) > _MAX_OPTION_CHARS:
        return None
    match = _OPTION.fullmatch(normalize_answer(text))
    if match is None:
        return None
    letter = match.group(1)
    if num_options is not None and ord(letter) - ord("a") >= num_options:
        return None
    return letter


# ---------------------------------------------------------------------------------------------------------------------
# Numbers: a hand-written recursive descent over a whitelist grammar, on at most _MAX_NUMBER_CHARS characters.

_MAX_NUMBER_CHARS = 256
_MAX_DIGITS = 30  # digits of one literal; longer ones are rejected before float() sees them
_MAX_DEPTH = 8  # nesting of braces, parentheses and \frac/\sqrt arguments
_MAX_FACTORS = 4  # factors of one implicit product, as in 3\sqrt{2}\pi
_NUMBER = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:e[+-]?\d{1,3})?|\.\d+(?:e[+-]?\d{1,3})?")
_SPACES = re.compile(" *")
_COMMAND = re.compile(r"\\([a-z]+)")
_LATEX_NOISE = re.compile(r"\\(?:left|right|displaystyle)(?![a-z])|\\[,;:! ]|\\?\$|~")
_UNIT_WORD = r"[a-z]{1,16}\.?(?: [a-z]{1,16}\.?)?(?: ?\^ ?\{?[23]\}?|[23])?"
_UNIT = re.compile(
    r"(?:\^ ?\{? ?\\circ ?\}?|°|\\circ|\\degree)? ?"
    rf"(?:\\(?:text|mathrm|mbox|rm) ?\{{ ?{_UNIT_WORD} ?\}}(?: ?\^ ?\{{?[23]\}}?)?|{_UNIT_WORD})?"
)
_NOT_UNITS = frozenset({"and", "or", "to", "plus", "minus", "times", "over", "divided", "by", "x", "e", "i"})
_PERCENT = frozenset({"%", "\\%", "percent"})
_FRAC_COMMANDS = frozenset({"frac", "dfrac", "tfrac"})


class _Malformed(Exception):
    """Internal: the text is outside the grammar (never escapes :func:`parse_number`)."""


class _NumberParser:
    """Recursive descent over::

        expr    := signed ["/" signed]
        signed  := ["-" | "+"] product
        product := lead {sqrt | pi}                   implicit multiplication, at most 4 factors
        lead    := number | frac | sqrt | pi | "(" expr ")" | "{" expr "}"
        frac    := ("\\frac" | "\\dfrac" | "\\tfrac") arg arg
        sqrt    := "\\sqrt" arg
        arg     := "{" expr "}" | digit | pi          as in LaTeX: \\frac12 is 1/2, \\sqrt 2 is sqrt(2)
        pi      := "\\pi" | "π" | "pi"

    Values are Python floats; every intermediate value must be finite. It stops at the first character it cannot
    read; :func:`parse_number` decides whether the rest is a unit.
    """

    def __init__(self, text: str) -> None:
        self.text, self.pos, self.depth = text, 0, 0

    def skip(self) -> None:
        self.pos = _SPACES.match(self.text, self.pos).end()  # a match, not a loop: no edit of it can spin forever

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos : self.pos + 1]

    def command(self) -> str | None:
        """The LaTeX command at the cursor (without consuming it), e.g. ``"frac"``."""
        self.skip()
        match = _COMMAND.match(self.text, self.pos)
        return match.group(1) if match is not None else None

    def eat_command(self, name: str) -> None:
        self.pos += 1 + len(name)

    def is_pi(self) -> bool:
        self.skip()
        if self.text.startswith(("π", "pi"), self.pos):
            end = self.pos + (1 if self.text[self.pos] == "π" else 2)
            return not self.text[end : end + 1].isalpha()
        return self.command() == "pi"

    def eat_pi(self) -> float:
        self.pos += 1 if self.text[self.pos] == "π" else (2 if self.text[self.pos] == "p" else 3)
        return math.pi

    def expr(self) -> float:
        value = self.signed()
        if self.peek() == "/":
            self.pos += 1
            denominator = self.signed()
            if denominator == 0:
                raise _Malformed
            value = _finite(value / denominator)
        return value

    def signed(self) -> float:
        sign = 1.0
        if self.peek() in ("-", "+"):
            sign = -1.0 if self.text[self.pos] == "-" else 1.0
            self.pos += 1
        return sign * self.product()

    def product(self) -> float:
        value = self.lead()
        for _ in range(_MAX_FACTORS - 1):
            if self.is_pi():
                value = _finite(value * self.eat_pi())
            elif self.command() == "sqrt":
                value = _finite(value * self.sqrt())
            else:
                break
        return value

    def lead(self) -> float:
        char = self.peek()
        if char in ("(", "{"):
            return self.group(char)
        if self.is_pi():
            return self.eat_pi()
        name = self.command()
        if name in _FRAC_COMMANDS:
            self.eat_command(name)
            numerator, denominator = self.arg(), self.arg()
            if denominator == 0:
                raise _Malformed
            return _finite(numerator / denominator)
        if name == "sqrt":
            return self.sqrt()
        match = _NUMBER.match(self.text, self.pos)
        if match is None:
            raise _Malformed
        literal = match.group()
        mantissa = literal.split("e")[0]
        if sum(c.isdigit() for c in mantissa) > _MAX_DIGITS:
            raise _Malformed
        self.pos = match.end()
        return _finite(float(literal.replace(",", "")))

    def sqrt(self) -> float:
        self.eat_command("sqrt")
        value = self.arg()
        if value < 0:
            raise _Malformed
        return math.sqrt(value)

    def arg(self) -> float:
        char = self.peek()
        if char == "{":
            return self.group("{")
        if char.isdigit() and char.isascii():
            self.pos += 1
            return float(char)
        if self.is_pi():
            return self.eat_pi()
        raise _Malformed

    def group(self, opening: str) -> float:
        closing = ")" if opening == "(" else "}"
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Malformed
        self.pos += 1
        value = self.expr()
        if self.peek() != closing:
            raise _Malformed
        self.pos += 1
        self.depth -= 1
        return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise _Malformed
    return value


def _clean_number_text(text: str) -> str:
    """NFKC, casefold, unicode minus and fraction slash, LaTeX spacing, ``$`` and ``\\(..\\)`` delimiters removed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = text.replace("\u2212", "-").replace("\u2044", "/")
    text = _LATEX_NOISE.sub("", text)
    text = " ".join(text.split()).rstrip(_TRAILING)
    for opening, closing in (("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(opening) and text.endswith(closing):
            text = text[len(opening) : -len(closing)].strip()
    return text


def parse_number(s: str) -> float | None:
    """A finite number from a short answer, or ``None``. Never evaluates the text.

    Understood: integers and decimals (``"1,234.5"`` with thousands separators in groups of three, ``"2.5e3"``),
    ``a/b``, percentages (``"50%"``, ``"50\\%"``, ``"50 percent"`` -> 0.5), a leading ``$`` or ``$...$`` math
    delimiters, a trailing unit of at most two words of letters (``"3.5 m"``, ``"12 cm^2"``, ``"7 meters"``,
    ``"\\text{m}"``; not a connective such as ``"and"``, ``"or"``, ``"times"``) or a degree sign (``"45°"``,
    ``"45^\\circ"``), and simple LaTeX: ``\\frac{a}{b}`` / ``\\dfrac`` / ``\\tfrac``,
    ``\\sqrt{x}`` and ``\\sqrt 2``, ``\\pi``, products such as ``3\\pi`` / ``2\\sqrt{3}`` / ``\\frac{\\pi}{2}``, unary
    minus, ``\\left( .. \\right)``. The grammar is in :class:`_NumberParser`; anything else (operators, powers,
    variables, ``"nan"``, ``"inf"``) is ``None``, as are values that are not finite (``"1e309"``), literals of more than
    30 digits and answers longer than 256 characters (checked first, so megabyte inputs cost nothing). ``"-0"`` gives
    ``0.0``.

    >>> parse_number("42"), parse_number("-0.5"), parse_number("3/4"), parse_number("50%"), parse_number("1e309")
    (42.0, -0.5, 0.75, 0.5, None)
    >>> parse_number("$\\\\frac{3}{4}$"), parse_number("1,000 m"), parse_number("45°"), parse_number("2 + 2")
    (0.75, 1000.0, 45.0, None)
    >>> round(parse_number("\\\\frac{\\\\pi}{2}"), 6), parse_number("2\\\\sqrt{4}"), parse_number("-0")
    (1.570796, 4.0, 0.0)
    """
    text = bounded(s)
    if text is None:
        return None
    text = text.strip()
    if not text or len(text) > _MAX_NUMBER_CHARS:
        return None
    text = _clean_number_text(text)
    parser = _NumberParser(text)
    try:
        value = parser.expr()
    except _Malformed:
        return None
    tail = text[parser.pos :].strip()
    if tail in _PERCENT:
        value *= 0.01
    elif tail and (_UNIT.fullmatch(tail) is None or tail.split()[0].removesuffix(".") in _NOT_UNITS):
        return None
    return value + 0.0  # finite (the parser checks every value); + 0.0 turns -0.0 into 0.0


# ---------------------------------------------------------------------------------------------------------------------
# Function-step sequences (Reason-RFT spatial transformation).

FUNCTIONS = ("change_size", "change_color", "change_material", "change_shape", "change_position")
"""Transformation functions of the Reason-RFT spatial-transformation task (TRANCE); other names are malformed."""

MAX_STEPS = 64
"""Most steps :func:`parse_steps` reads; a longer list is malformed."""

_STEP = re.compile(r"([a-z_]{1,32})[ \t]{0,4}\(([^(),\n]{1,48}),([^(),\n]{1,48})\)")
_STEP_SEPARATOR = re.compile(r"\s*(?:,|;|->|→|\n)\s*")
_STEP_ARG = re.compile(r"[a-z0-9_][a-z0-9_ .\-]{0,39}")
_QUOTES = "'\""  # stripped around a step argument


@dataclass(frozen=True)
class FunctionStep:
    """One transformation step ``function(obj, value)``, all three lower-case and stripped."""

    function: str
    obj: str
    value: str


def _step_arg(raw: str) -> str | None:
    arg = " ".join(raw.strip().strip(_QUOTES).split())
    return arg if _STEP_ARG.fullmatch(arg) else None


def parse_steps(s: str) -> list[FunctionStep] | None:
    """The steps of a function-call list such as ``change_color(obj_2, red) -> change_size(1, 'small')``.

    Steps are separated by ``,``, ``;``, a newline or ``->`` (a trailing separator and one pair of enclosing square
    brackets are allowed). Names and arguments are case-insensitive and returned lower-case; arguments may be quoted.
    Anything else is malformed and gives ``None``: an unknown function (see :data:`FUNCTIONS`), a missing or extra
    argument, text between steps, an empty list, or more than :data:`MAX_STEPS` steps.

    >>> parse_steps("change_color(obj_2, Red); change_size(1, 'small')")
    [FunctionStep(function='change_color', obj='obj_2', value='red'),
     FunctionStep(function='change_size', obj='1', value='small')]
    >>> parse_steps("change_color(obj_2)") is None, parse_steps("rm_rf(1, 2)") is None
    (True, True)
    """
    text = bounded(s)
    if text is None:
        return None
    text = unicodedata.normalize("NFKC", text).casefold().strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1].strip()
    steps: list[FunctionStep] = []
    pos = 0
    while pos < len(text):
        match = _STEP.match(text, pos)
        if match is None or match.group(1) not in FUNCTIONS or len(steps) == MAX_STEPS:
            return None
        obj, value = _step_arg(match.group(2)), _step_arg(match.group(3))
        if obj is None or value is None:
            return None
        steps.append(FunctionStep(match.group(1), obj, value))
        pos = match.end()
        if pos < len(text):
            separator = _STEP_SEPARATOR.match(text, pos)
            if separator is None:
                return None
            pos = separator.end()
    return steps or None

"""Safe parsing of untrusted model text.

Completions are untrusted input (DESIGN.md): nothing here evaluates text (no ``eval``, ``exec``, ``compile`` or sympy),
every function bounds its work, and malformed input maps to ``None`` (or ``""``), never to an exception.

Bounded work:

- Every function first cuts its input to its first :data:`MAX_PARSE_CHARS` characters, before any search or regex.
  A completion longer than that is treated as its prefix, so an answer block that starts past the bound is not seen.
  :class:`~app.rewards.FormatReward` goes further and scores any over-long completion 0 (it cannot check the rest).
- Tags are found with ``str.find`` (linear), not with ``<tag>(.*?)</tag>`` regexes, which go quadratic on inputs such
  as ``"<answer>" * 100_000``. The only regex is anchored and has no nested quantifiers.
- Non-string input (``None``, bytes, numbers) is malformed: parsers return ``None``, :func:`normalize_answer` ``""``.
"""

from __future__ import annotations

import re
import unicodedata

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
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    start = text.find(open_tag)
    if start < 0:
        return None
    start += len(open_tag)
    end = text.find(close_tag, start)
    if end < 0:
        return None
    return text[start:end].strip()


def extract_answer(text: str) -> str | None:
    """Content of the first ``<answer>...</answer>`` block, stripped; ``None`` if there is none.

    >>> extract_answer("<think>2 + 2</think><answer>4</answer>")
    '4'
    """
    return extract_tag(text, "answer")


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


_MAX_NUMBER_CHARS = 64
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d{1,3})?")
_FRACTION = re.compile(r"([+-]?\d{1,18})\s*/\s*(\d{1,18})")


def parse_number(s: str) -> float | None:
    """A finite number from a short answer: integers, decimals, ``a/b`` fractions, percentages (``"50%"`` -> 0.5);
    ``None`` for anything else, for non-finite values and for answers longer than 64 characters.

    >>> parse_number("42"), parse_number("-0.5"), parse_number("3/4"), parse_number("50%"), parse_number("1e309")
    (42.0, -0.5, 0.75, 0.5, None)
    """
    s = normalize_answer(s).replace(",", "")
    if not s or len(s) > _MAX_NUMBER_CHARS:
        return None
    scale = 1.0
    if s.endswith("%"):
        s, scale = s[:-1].rstrip(), 0.01
    if _PLAIN_NUMBER.fullmatch(s):
        value = float(s) * scale
    elif (fraction := _FRACTION.fullmatch(s)) is not None and int(fraction.group(2)) != 0:
        value = int(fraction.group(1)) / int(fraction.group(2)) * scale
    else:
        return None
    return value if value == value and abs(value) != float("inf") else None

"""Safe parsing of the structured response to a triplet question (CoRe / TriSR, docs/algorithms.md#trisr-rewards).

A triplet sample shows three images, numbered 1, 2 and 3, and asks one comparison question for each pair
``"1-2"``, ``"1-3"`` and ``"2-3"``. TriSR scores the intermediate structure of the response, so the prompt asks for it
explicitly (the paper: "per-image attribute estimates, pairwise comparative judgments inferred in the reasoning trace,
and final predicted answers", in the ``<think>...</think> <answer>...</answer>`` form). The format the triplet prompts
ask for (:data:`app.formats.TRIPLET_RESPONSE_INSTRUCTION`, written by :func:`app.formats.format_triplet_response`), here
for "which image has more dots?"::

    <think>
    I count the dots in each image.
    Image 1: 4
    Image 2: 7
    Image 3: 2
    Compare 1-2: 2
    Compare 1-3: 1
    Compare 2-3: 2
    </think>
    <answer>1-2: 2; 1-3: 1; 2-3: 2</answer>

- **Attribute estimates** ``v_hat_k``: lines ``Image k: <number>`` in the reasoning, k in 1..3. The value is the first
  whitespace-separated word after the colon, read by :func:`parse_real` (``4``, ``-3.5``, ``2e3``; trailing
  punctuation allowed); lines whose value is not a number (``Image 1: shows a crowd``) are free text and ignored.
- **Judgments** ``y~_ij``: lines ``Compare i-j: <answer>`` in the reasoning.
- **Final answers** ``y_hat_ij``: ``i-j: <answer>`` items in the ``<answer>`` block, separated by ``;`` or newlines.

Free text may surround the structured lines; a line may start with list markers (``-``, ``*``, ``#``). Keys are
case-insensitive; ``=`` may replace ``:``; a pair may be written ``1-2``, ``(1,2)`` or ``1 vs 2``, smaller image first
(a reversed pair such as ``2-1`` is not read). The reasoning is the first ``<think>...</think>`` block, or, when the
completion has no ``<think>`` (chat templates of thinking models open it in the prompt), everything before the first
``</think>``. The answer block is the first ``<answer>...</answer>``.

An ``<answer>`` value is what the question asks for; TriSR (:mod:`app.rewards.trisr`) reads it by the sample's
answer type: ordinal (``2`` or ``Image 2`` names the image that wins the comparison, ``same`` a tie), interval
(``[-3, -1]``, a range of the difference ``v_i - v_j``) or categorical (a label). :func:`parse_triplet_response` only
normalises values (:func:`~app.rewards.parsing.normalize_answer`: case, whitespace, trailing punctuation, option
letters); :func:`canonical_answer` reads one by its type.

Safety: the input is cut to :data:`~app.rewards.parsing.MAX_PARSE_CHARS` characters first, tags are found with
``str.find``, lines are matched by anchored regexes with bounded repetitions (linear time), and nothing raises.
Anything malformed is ``None``: a missing line, a non-number estimate, a value over 64 characters, and a key given
twice with different values (a hedge such as ``1-2: 1; 1-2: 2`` is ambiguous, not two chances).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.formats import PAIRS, THINK, close_tag, open_tag
from app.formats import TRIPLET_RESPONSE_INSTRUCTION as TRIPLET_RESPONSE_INSTRUCTION  # re-exported
from app.formats import format_triplet_response as format_triplet_response  # re-exported
from app.rewards.parsing import bounded, extract_answer, extract_tag, normalize_answer

MAX_VALUE_CHARS = 64
"""Longest answer or judgment value read; a longer one is malformed (``None``)."""

_MARKERS = "-*#>•· \t"
_REAL = re.compile(r"[+-]?(?:\d{1,32}(?:\.\d{0,32})?|\.\d{1,32})(?:e[+-]?\d{1,3})?", re.IGNORECASE)
# One pair key, then ":" or "=": "1-2:", "(1, 2) =", "Image 1 vs Image 2:". Anchored (re.match), bounded repetitions.
_PAIR = (
    r"\(?\s{0,4}(?:image\s{0,4})?([1-3])\s{0,4}(?:-|–|,|vs\.?|and)\s{0,4}(?:image\s{0,4})?([1-3])\s{0,4}\)?\s{0,4}[:=]"
)
_ATTRIBUTE_LINE = re.compile(r"image\s{0,4}([1-3])\s{0,4}[:=]", re.IGNORECASE)
_JUDGMENT_LINE = re.compile(r"compare\s{0,4}" + _PAIR, re.IGNORECASE)
_ANSWER_ITEM = re.compile(r"(?:pair\s{0,4})?" + _PAIR, re.IGNORECASE)


@dataclass(frozen=True)
class TripletResponse:
    """What a triplet response states; every field is ``None`` where the response leaves it out or garbles it.

    Attributes:
        attributes: estimates ``(v_hat_1, v_hat_2, v_hat_3)`` (finite floats or None).
        judgments: pair (``"1-2"``, ``"1-3"``, ``"2-3"``) -> normalised judgment ``y~_ij`` from the reasoning, or None.
        answers: pair -> normalised final answer ``y_hat_ij`` from the ``<answer>`` block, or None.
    """

    attributes: tuple[float | None, float | None, float | None] = (None, None, None)
    judgments: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(PAIRS))
    answers: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(PAIRS))


class _Collector:
    """Per-key values; a key seen with two different values is ambiguous and reads as None."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}
        self.conflicted: set[str] = set()

    def add(self, key: str, value: object) -> None:
        if key in self.values and self.values[key] != value:
            self.conflicted.add(key)
        self.values.setdefault(key, value)

    def get(self, key: str):
        return None if key in self.conflicted else self.values.get(key)


def parse_real(text: object) -> float | None:
    """A finite number written as a plain decimal (``4``, ``-0.5``, ``.5``, ``2e3``), else ``None``.

    Trailing punctuation is ignored; at most 32 digits on each side of the point (a 100,000-digit integer is
    ``None``), and overflow (``1e309``), ``nan`` and ``inf`` are ``None``. No ``eval``: a regex then ``float``.

    >>> parse_real("4."), parse_real("-0.5"), parse_real("1e309"), parse_real("nan"), parse_real("four")
    (4.0, -0.5, None, None, None)
    """
    if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS:
        return None
    text = text.strip().rstrip(".,;:!?")
    if _REAL.fullmatch(text) is None:
        return None
    value = float(text)
    return value if abs(value) != float("inf") else None


def _value(text: str) -> str | None:
    text = text.strip()
    if not text or len(text) > MAX_VALUE_CHARS:
        return None
    return normalize_answer(text) or None


def _pair_key(match: re.Match) -> str | None:
    i, j = match.group(1), match.group(2)
    return f"{i}-{j}" if i < j else None


def _reasoning(text: str) -> str | None:
    """First ``<think>`` block, or what precedes the first ``</think>`` when there is no ``<think>``."""
    if open_tag(THINK) in text:
        return extract_tag(text, THINK)
    end = text.find(close_tag(THINK))
    return text[:end] if end >= 0 else None


def parse_triplet_response(text: object) -> TripletResponse:
    """Read the attribute estimates, judgments and final answers of a triplet response (format in the module doc).

    Never raises: a non-string, or anything malformed, gives ``None`` fields.

    >>> r = parse_triplet_response(
    ...     "<think>Image 1: 4\\nImage 2: 7 dots\\nImage 3: two\\nCompare 1-2: Image 2\\nCompare 2-3: 2</think>"
    ...     "<answer>1-2: 2; 1-3: Image 1.; 2-3: 2; 2-3: 3</answer>"
    ... )
    >>> r.attributes
    (4.0, 7.0, None)
    >>> r.judgments
    {'1-2': 'image 2', '1-3': None, '2-3': '2'}
    >>> r.answers  # 2-3 was given twice with different values
    {'1-2': '2', '1-3': 'image 1', '2-3': None}
    """
    text = bounded(text)
    if text is None:
        return TripletResponse()
    attributes, judgments, answers = _Collector(), _Collector(), _Collector()

    reasoning = _reasoning(text)
    for line in (reasoning or "").splitlines():
        line = line.strip().lstrip(_MARKERS).replace("*", "")
        if (match := _JUDGMENT_LINE.match(line)) is not None:
            if (key := _pair_key(match)) is not None and (value := _value(line[match.end() :])) is not None:
                judgments.add(key, value)
        elif (match := _ATTRIBUTE_LINE.match(line)) is not None:
            words = line[match.end() :].split(maxsplit=1)
            number = parse_real(words[0]) if words else None
            if number is not None:
                attributes.add(match.group(1), number)

    for item in re.split(r"[;\n]", extract_answer(text) or ""):
        item = item.strip().lstrip(_MARKERS)
        if (match := _ANSWER_ITEM.match(item)) is not None:
            if (key := _pair_key(match)) is not None and (value := _value(item[match.end() :])) is not None:
                answers.add(key, value)

    return TripletResponse(
        attributes=tuple(attributes.get(k) for k in "123"),
        judgments={pair: judgments.get(pair) for pair in PAIRS},
        answers={pair: answers.get(pair) for pair in PAIRS},
    )


# ------------------------------------------------------------------------------------------------ canonical answers
ANSWER_TYPES = ("ordinal", "interval", "categorical")
"""How a sample's answers are read (``meta["answer_type"]``); see :mod:`app.rewards.trisr`."""

_TIE = frozenset({"same", "the same", "equal", "tie", "=", "neither"})
_IMAGE_ALIASES = {"1": "1", "2": "2", "3": "3", "a": "1", "b": "2", "c": "3"}
_INTERVAL = re.compile(r"[\[(]?\s{0,4}(\S{1,40}?)\s{0,4}(?:,|to|\.\.|~)\s{0,4}(\S{1,40}?)\s{0,4}[\])]?")

Canonical = int | tuple[float, float] | str
"""A canonical answer: an ordinal sign, an interval ``(lo, hi)``, or a categorical label."""


def canonical_answer(value: object, pair: str, answer_type: str = "ordinal") -> Canonical | None:
    """The canonical form of an answer to ``pair`` (``"1-2"``, ...) read as ``answer_type``; ``None`` if it is missing
    or unreadable. Equal canonical forms are equal answers.

    - ``ordinal``: the sign ``s_ij``: +1 for image i (``1``, ``Image 1``, ``A``, ``first``, ``>``; images 1/2/3 are
      also A/B/C), -1 for image j (likewise, ``second``, ``<``), 0 for a tie (``same``, ``equal``, ``tie``, ``=``,
      ``neither``); an image outside the pair is unreadable.
    - ``interval``: ``(lo, hi)`` from ``[lo, hi]``, ``(lo, hi)``, ``lo to hi``, ``lo..hi`` or one number (``lo == hi``);
      ``lo > hi`` is unreadable.
    - ``categorical``: the normalised label.

    ``answer_type`` is trusted (it comes from the data): an unknown one raises ``ValueError``.

    >>> canonical_answer("Image 2", "1-2"), canonical_answer("A", "1-3"), canonical_answer("same", "2-3")
    (-1, 1, 0)
    >>> canonical_answer("3", "1-2") is None  # image 3 is not in the pair
    True
    >>> canonical_answer("[-3, -1]", "1-2", "interval"), canonical_answer("2", "1-3", "interval")
    ((-3.0, -1.0), (2.0, 2.0))
    """
    if not isinstance(value, str):
        return None
    value = normalize_answer(value)
    if not value:
        return None
    if answer_type == "ordinal":
        return _ordinal_sign(value, pair)
    if answer_type == "interval":
        return _interval(value)
    if answer_type == "categorical":
        return value
    raise ValueError(f"answer_type must be one of {ANSWER_TYPES}, got {answer_type!r}")


def _ordinal_sign(value: str, pair: str) -> int | None:
    if value in _TIE:
        return 0
    if value in ("first", ">"):
        return 1
    if value in ("second", "<"):
        return -1
    image = _IMAGE_ALIASES.get(value.removeprefix("image").strip())
    if image == pair[0]:
        return 1
    if image == pair[2]:
        return -1
    return None


def _interval(value: str) -> tuple[float, float] | None:
    single = parse_real(value)
    if single is not None:
        return (single, single)
    match = _INTERVAL.fullmatch(value)
    if match is None:
        return None
    lo, hi = parse_real(match.group(1)), parse_real(match.group(2))
    if lo is None or hi is None or lo > hi:
        return None
    return (lo, hi)

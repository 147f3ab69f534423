"""Question Generation Expert of CoRe (CoRe section 3.2, docs/algorithms.md#papers): a template library, the comparator
``g_m`` (eq. 4), shuffled options, and the target response in the structured TriSR format.

One template per triplet phrases the three pairwise sub-questions (``1-2``, ``1-3``, ``2-3``); each sub-question lists
its two options in an order shuffled per pair, so the correct option sits first or second equally often. Answers are
the option *values*, never option letters: :func:`~app.rewards.triplet_parsing.canonical_answer` reads ``A``/``B``/``C``
as images 1/2/3, so lettered options would be misread.

Answer types (what :mod:`app.rewards.trisr_scores` supports):

- counting, depth, distance: ``ordinal``. The options are the two images; the answer is the number of the image that
  wins the comparison the template asks for (``direction`` ``"larger"``: more people / farther; ``"smaller"``: fewer
  / closer). The attributes ``v_k`` are the metric values (counts; metres rounded to centimetres, far finer than the
  15 % minimum gap, so rounding never flips an answer).
- spatial: ``categorical``, options ``same`` / ``different``: is the subject's relation to the reference the same in
  the two images? Grounding needs a number per image, so the question defines a relation code (``1`` left of, ``2``
  right of, ``3`` above, ``4`` below) and ``v_k`` is that code: the target writes it exactly, and a wrong code loses
  at least ``1 - exp(-1/4)`` (~22 %) of that image's grounding score. TriSR has no consistency rule for labels, so
  ``R_tc`` is 0 on this task.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from app.formats import PAIRS, TRIPLET_RESPONSE_INSTRUCTION, format_triplet_response
from app.tasks.core.metrics import RELATIONS
from app.tasks.core.quality import PAIR_INDICES


@dataclass(frozen=True)
class Template:
    """One phrasing of a sub-question: ``{a}``/``{b}`` are the shuffled options, ``{i}``/``{j}`` the image numbers,
    ``{subject}``/``{reference}`` the objects named; ``direction`` says which value wins (None: categorical)."""

    key: str
    text: str
    direction: str | None = None


@dataclass(frozen=True)
class TaskText:
    """What a task's prompt says around the sub-questions, and how it is answered."""

    intro: str
    quantity: str
    unit: str | None
    answer_type: str
    templates: tuple[Template, ...]


def _templates(task: str, direction: str | None, *texts: str) -> tuple[Template, ...]:
    name = direction or "relation"
    return tuple(Template(f"{task}/{name}/{k}", text, direction) for k, text in enumerate(texts))


TASK_TEXTS: dict[str, TaskText] = {
    "counting": TaskText(
        "Image 1, Image 2 and Image 3 each show people standing on open ground, among a few cubes and balls.",
        "For each image, the quantity to estimate is the number of people.",
        "people",
        "ordinal",
        _templates(
            "counting",
            "larger",
            "Which image shows more people, {a} or {b}?",
            "Which of {a} and {b} has the larger crowd?",
            "Where are more people standing: in {a} or in {b}?",
        )
        + _templates(
            "counting",
            "smaller",
            "Which image shows fewer people, {a} or {b}?",
            "Which of {a} and {b} has the smaller crowd?",
            "Where are fewer people standing: in {a} or in {b}?",
        ),
    ),
    "depth": TaskText(
        "Image 1, Image 2 and Image 3 each show objects on open ground; in each image a red box marks one object.",
        "For each image, the quantity to estimate is the depth of the boxed object in metres (its distance from the"
        " camera along the viewing direction).",
        "m",
        "ordinal",
        _templates(
            "depth",
            "larger",
            "In which image is the boxed object farther from the camera, {a} or {b}?",
            "Which image has the boxed object deeper in the scene, {a} or {b}?",
            "Which of {a} and {b} shows its boxed object at the greater depth?",
        )
        + _templates(
            "depth",
            "smaller",
            "In which image is the boxed object closer to the camera, {a} or {b}?",
            "Which image has the boxed object nearer to the viewer, {a} or {b}?",
            "Which of {a} and {b} shows its boxed object at the smaller depth?",
        ),
    ),
    "distance": TaskText(
        "Image 1, Image 2 and Image 3 each show objects on open ground, among them one {subject}.",
        "For each image, the quantity to estimate is the distance from the camera to the centre of the {subject}, in"
        " metres.",
        "m",
        "ordinal",
        _templates(
            "distance",
            "larger",
            "In which image is the {subject} farther from the camera, {a} or {b}?",
            "Which of {a} and {b} shows the {subject} at a greater distance from the viewer?",
            "In which image would you walk farther to reach the {subject}, {a} or {b}?",
        )
        + _templates(
            "distance",
            "smaller",
            "In which image is the {subject} closer to the camera, {a} or {b}?",
            "Which of {a} and {b} shows the {subject} at a shorter distance from the viewer?",
            "In which image would you walk less far to reach the {subject}, {a} or {b}?",
        ),
    ),
    "spatial": TaskText(
        "Image 1, Image 2 and Image 3 each show a {subject} and a {reference} among other objects.",
        "For each image, the quantity to estimate is where the {subject} is relative to the {reference} in the"
        " picture, as a code: 1 = left of, 2 = right of, 3 = above, 4 = below.",
        None,
        "categorical",
        _templates(
            "spatial",
            None,
            "Is the {subject} placed the same way relative to the {reference} in Image {i} and Image {j}?"
            " Options: {a}, {b}.",
            "Compare where the {subject} is relative to the {reference} (left of, right of, above or below) in"
            " Image {i} and in Image {j}. Options: {a}, {b}.",
            "From Image {i} to Image {j}, does the relation of the {subject} to the {reference} stay the same or"
            " change? Options: {a}, {b}.",
        ),
    ),
}
"""The template library, per task."""

ANSWER_HINTS = {
    "ordinal": "Answer each question with the number of the image you choose.",
    "categorical": "Answer each question with 'same' or 'different'.",
}


@dataclass(frozen=True)
class TripletQuestion:
    """A generated triplet prompt with its ground truth and target response.

    Attributes:
        question: the prompt text (ends with the structured-response instruction).
        template: key of the template used.
        direction: ``"larger"`` / ``"smaller"`` (ordinal tasks) or None.
        options: pair -> the option values in the order shown.
        pair_answers: pair -> the correct option value ``y*_ij``.
        answer_positions: pair -> index of the correct option in ``options[pair]``.
        attributes: ``[v_1, v_2, v_3]`` as numbers for attribute grounding.
        reasoning: the target response's ``<think>`` contents.
        answer: the target response's ``<answer>`` contents.
    """

    question: str
    template: str
    direction: str | None
    options: dict[str, list[str]]
    pair_answers: dict[str, str]
    answer_positions: dict[str, int]
    attributes: list[float]
    reasoning: str
    answer: str


def compare(a: float | str, b: float | str, i: int, j: int, direction: str | None) -> str:
    """``g_m``: the answer to the pair (image ``i`` with value ``a``, image ``j`` with ``b``).

    Ordinal: the number of the winning image (``"same"`` on a tie, which quality control normally rules out).
    Categorical (``direction`` None): ``"same"`` if the labels are equal, else ``"different"``.

    >>> compare(7, 3, 1, 2, "larger"), compare(7, 3, 1, 2, "smaller"), compare("left", "above", 2, 3, None)
    ('1', '2', 'different')
    """
    if direction is None:
        return "same" if a == b else "different"
    if a == b:
        return "same"
    return str(i if (a > b) == (direction == "larger") else j)


def attribute_values(task: str, values: Sequence[float | str]) -> list[float]:
    """``v_k`` as the numbers written in ``Image k: <number>`` lines (see the module docstring)."""
    if task == "spatial":
        return [RELATIONS.index(v) + 1 for v in values]
    if task == "counting":
        return [int(v) for v in values]
    return [round(float(v), 2) for v in values]


def _display(value: str, answer_type: str) -> str:
    return f"Image {value}" if answer_type == "ordinal" else value


def build_question(
    task: str,
    values: Sequence[float | str],
    rng: random.Random,
    subject: str | None = None,
    reference: str | None = None,
) -> TripletQuestion:
    """The prompt, ground truth and target response for a triplet with metric values ``values`` (one per image)."""
    if task not in TASK_TEXTS:
        raise ValueError(f"unknown CoRe task {task!r}; known tasks: {', '.join(TASK_TEXTS)}")
    text = TASK_TEXTS[task]
    template = rng.choice(text.templates)
    names = {"subject": subject, "reference": reference}
    lines, options, answers, positions = [], {}, {}, {}
    for pair, (a, b) in zip(PAIRS, PAIR_INDICES, strict=True):
        i, j = a + 1, b + 1
        answers[pair] = compare(values[a], values[b], i, j, template.direction)
        choices = [str(i), str(j)] if text.answer_type == "ordinal" else ["same", "different"]
        if rng.random() < 0.5:
            choices.reverse()
        if answers[pair] not in choices:
            raise ValueError(f"pair {pair} of {task} has no correct option (values {values[a]!r}, {values[b]!r} tie)")
        options[pair], positions[pair] = choices, choices.index(answers[pair])
        shown = [_display(c, text.answer_type) for c in choices]
        lines.append(f"{pair}: " + template.text.format(a=shown[0], b=shown[1], i=i, j=j, **names))
    question = " ".join([text.intro.format(**names), text.quantity.format(**names)])
    question += "\nAnswer these three questions, one for each pair of images:\n" + "\n".join(lines)
    question += "\n" + ANSWER_HINTS[text.answer_type] + TRIPLET_RESPONSE_INSTRUCTION
    attributes = attribute_values(task, values)
    reasoning, answer = format_triplet_response(attributes, answers, answers)
    return TripletQuestion(
        question, template.key, template.direction, options, answers, positions, attributes, reasoning, answer
    )

"""Discrete accuracy reward (Reason-RFT "discrete-valued type"): exact match of the ``<answer>`` block with the label,
after normalisation (docs/algorithms.md#discrete-accuracy)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from app.rewards.base import RewardComponent
from app.rewards.parsing import extract_answer, normalize_answer, parse_bool, parse_number, parse_option
from app.types import VisualSample

Parsed = TypeVar("Parsed")


def answers_equivalent(pred: str, answer: str) -> bool:
    """Whether a predicted answer equals the label, after normalisation.

    In order: equal after :func:`~app.rewards.parsing.normalize_answer` (case, whitespace, trailing punctuation, a
    bare option letter such as ``"(B)"``); else, judged by the kind of the label: a boolean label (yes/true, no/false)
    matches a prediction with the same :func:`~app.rewards.parsing.parse_bool` value; a numeric label matches a
    prediction with the same :func:`~app.rewards.parsing.parse_number` value (relative tolerance 1e-9, only to absorb
    float rounding: ``"0.50"`` equals ``"1/2"``, ``"0.33"`` does not equal ``"1/3"``); an option-letter label matches a
    prediction naming the same letter with :func:`~app.rewards.parsing.parse_option` (``"Option B"``,
    ``"the answer is (b)"``). An empty prediction never matches.

    >>> answers_equivalent("True", "yes"), answers_equivalent("0.50", "1/2"), answers_equivalent("Option B", "b")
    (True, True, True)
    >>> answers_equivalent("(A) cup", "A"), answers_equivalent("0.33", "1/3")
    (False, False)
    """
    pred_norm, answer_norm = normalize_answer(pred), normalize_answer(answer)
    if not pred_norm:
        return False
    if pred_norm == answer_norm:  # (an empty label matches nothing: "" is no bool, number or option)
        return True
    if (label_bool := parse_bool(answer_norm)) is not None:
        return parse_bool(pred_norm) is label_bool
    if (label_number := parse_number(answer)) is not None:
        pred_number = parse_number(pred)
        return pred_number is not None and math.isclose(pred_number, label_number)  # rel_tol 1e-9, abs_tol 0
    if (label_option := parse_option(answer)) is not None:
        return parse_option(pred) == label_option
    return False


def _match(completion: object, answer: str) -> bool:
    pred = extract_answer(completion)
    return pred is not None and answers_equivalent(pred, answer)


def require_answers(reward: RewardComponent, samples: Sequence[VisualSample]) -> list[str]:
    """``sample.answer`` of every sample; ``ValueError`` naming the task if one is missing (a misconfiguration)."""
    for sample in samples:
        if sample.answer is None:
            raise ValueError(
                f"{type(reward).__name__} ({reward.name!r}) needs labeled samples, but a sample of task "
                f"{sample.task!r} has answer=None; label-free training must use a consistency reward instead"
            )
    return [sample.answer for sample in samples]


def check_labels(fn_name: str, completions: Sequence[object], answers: Sequence[object]) -> None:
    """Same length, and no ``None`` label: the checks every labeled functional reward makes."""
    if len(completions) != len(answers):
        raise ValueError(f"got {len(completions)} completions but {len(answers)} answers")
    for i, answer in enumerate(answers):
        if answer is None:
            raise ValueError(f"{fn_name} needs a label for every completion; answers[{i}] is None")


def parsed_answer_scores(
    fn_name: str,
    completions: Sequence[object],
    answers: Sequence[object],
    parse: Callable[[str | None], Parsed | None],
    score: Callable[[Parsed, Parsed], float],
    label_kind: str,
) -> Tensor:
    """``[N]`` float32: ``score(pred, gt)`` of what ``parse`` reads in the first ``<answer>`` block of
    ``completions[i]`` and in ``answers[i]``; 0 for a completion without an answer block or one ``parse`` cannot read.

    Every label is checked before any completion is read (:func:`check_labels`); one that ``parse`` cannot read raises
    ``ValueError`` saying it is not ``label_kind`` (the data is misconfigured).
    """
    check_labels(fn_name, completions, answers)
    labels = [_parsed_label(parse, answer, i, label_kind) for i, answer in enumerate(answers)]
    values = []
    for completion, gt in zip(completions, labels):  # noqa: B905 (check_labels: equal lengths)
        pred = parse(extract_answer(completion))  # None without an answer block too
        values.append(0.0 if pred is None else score(pred, gt))
    return torch.tensor(values, dtype=torch.float32)


def _parsed_label(parse: Callable[[str], Parsed | None], answer: object, i: int, label_kind: str) -> Parsed:
    parsed = parse(str(answer))
    if parsed is None:
        raise ValueError(f"answers[{i}] = {str(answer)[:80]!r} is not {label_kind}")
    return parsed


def accuracy_reward(completions: Sequence[str], answers: Sequence[str]) -> Tensor:
    """``[N]`` float32: 1.0 where the first ``<answer>`` block matches ``answers[i]`` (see
    :func:`answers_equivalent`: case, whitespace, trailing punctuation, option letters, booleans, numbers), else 0.0.

    A completion without an answer block, or with an empty one, scores 0. Every answer must be given (not ``None``).

    >>> accuracy_reward(["<answer> (B) </answer>", "<answer>b</answer>", "B"], ["b", "B.", "B"])
    tensor([1., 1., 0.])
    >>> accuracy_reward(["<answer>true</answer>", "<answer>$\\\\frac{1}{2}$</answer>", "<answer>Option C</answer>"],
    ...                 ["yes", "0.50", "(c)"])
    tensor([1., 1., 1.])
    """
    check_labels("accuracy_reward", completions, answers)
    matches = [_match(c, str(a)) for c, a in zip(completions, answers)]  # noqa: B905 (check_labels: equal lengths)
    return torch.tensor([float(m) for m in matches], dtype=torch.float32)


class AccuracyReward(RewardComponent):
    """Exact-match accuracy against ``sample.answer`` (see :func:`accuracy_reward`); name ``"accuracy"``.

    Needs labeled samples: a sample with ``answer=None`` raises ``ValueError``. Label-free training uses a consistency
    reward instead.

    Args:
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"accuracy"``.

    Example:
        >>> from app.types import VisualSample
        >>> sample = VisualSample(images=[], question="Which is closer? (A) cup (B) lamp", task="depth", answer="A")
        >>> reward = AccuracyReward()
        >>> reward.score(["<think>..</think><answer>(a)</answer>", "<answer>B</answer>"], [sample, sample])
        tensor([1., 0.])
    """

    completion_kinds = ("text",)

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        return accuracy_reward(completions, require_answers(self, samples))

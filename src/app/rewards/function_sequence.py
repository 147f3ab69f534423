"""Reason-RFT function-sequence accuracy ("function-based type", spatial transformation).

A prediction is a list of steps ``f(object, value)`` (:func:`~app.rewards.parsing.parse_steps`), as is the label.
Each predicted step is paired with at most one label step and each label step with at most one predicted step; a pair
is a full match (same function, object and value; counts 1), a partial match (same function and same object or same
value; counts ``alpha``) or a function-only match (counts ``beta``); unpaired steps and pairs of different functions
count 0. The reward is the sum over ``max(len(pred), len(gt))``. Paper settings: ``(alpha, beta)`` = (0, 0),
(0.5, 0.25), (-0.25, -0.5).

Decisions where the paper is silent:

- **Order is ignored** by default: the pairing is the one-to-one assignment that has the most full matches, then
  (among those) the most partial matches, then the most function-only matches, found exactly with
  ``scipy.optimize.linear_sum_assignment``. The pairing does not depend on ``alpha`` and ``beta``, so negative values
  penalise near misses (setting (c)) instead of being avoided by the matching. With ``ordered=True`` step ``i`` is
  compared only with label step ``i``.
- **Duplicates are not merged**: a repeated predicted step can pair with one label step only, and every copy counts in
  ``len(pred)``. ``[A, A]`` against ``[A]`` scores 1/2, against ``[A, A]`` scores 1. (The authors' code instead
  de-duplicates the prediction and multiplies by ``unique/total``; both give 1/2 in the first case.)
- A completion without an ``<answer>`` block or whose steps do not parse scores 0, the value of no match; with negative
  ``alpha``/``beta`` that is more than a badly wrong but well-formed answer can get, so pair it with a format reward.

See docs/algorithms.md#function-sequence.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from functools import partial

import numpy as np
from torch import Tensor

from app.rewards.accuracy import parsed_answer_scores, require_answers
from app.rewards.base import RewardComponent
from app.rewards.parsing import FunctionStep, parse_steps
from app.types import VisualSample

FULL, PARTIAL, FUNCTION_ONLY, NO_MATCH = 3, 2, 1, 0


def match_level(pred: FunctionStep, gt: FunctionStep) -> int:
    """:data:`FULL`, :data:`PARTIAL` (function and object or value), :data:`FUNCTION_ONLY` or :data:`NO_MATCH`."""
    if pred.function != gt.function:
        return NO_MATCH
    same_obj, same_value = pred.obj == gt.obj, pred.value == gt.value
    if same_obj and same_value:
        return FULL
    return PARTIAL if same_obj or same_value else FUNCTION_ONLY


def step_match_counts(
    pred: Sequence[FunctionStep], gt: Sequence[FunctionStep], ordered: bool = False
) -> tuple[int, int, int]:
    """``(full, partial, function_only)`` pair counts of the one-to-one pairing of the module docstring.

    >>> from app.rewards.parsing import parse_steps
    >>> gt = parse_steps("change_color(1, red), change_size(2, small)")
    >>> step_match_counts(parse_steps("change_size(2, small), change_color(1, blue)"), gt)
    (1, 1, 0)
    >>> step_match_counts(parse_steps("change_size(2, small), change_color(1, blue)"), gt, ordered=True)
    (0, 0, 0)
    """
    counts: Counter[int] = Counter()  # by level
    if ordered:
        for i in range(min(len(pred), len(gt))):
            counts[match_level(pred[i], gt[i])] += 1
        return counts[FULL], counts[PARTIAL], counts[FUNCTION_ONLY]
    if not pred or not gt:
        return 0, 0, 0
    from scipy.optimize import linear_sum_assignment  # scipy comes with POT; imported here to keep imports light

    levels = np.array([[match_level(p, g) for g in gt] for p in pred])  # [P, G] int
    # Every assignment has m = min(P, G) pairs. With weights base**level and base > m, a pairing's total is the
    # base-``base`` number with digits (#full, #partial, #function-only, #no-match), each at most m < base, so
    # maximising it ranks pairings lexicographically by (#full, #partial, #function-only).
    base = len(pred) + len(gt)
    rows, cols = linear_sum_assignment(base**levels, maximize=True)
    counts.update(levels[rows, cols].tolist())
    return counts[FULL], counts[PARTIAL], counts[FUNCTION_ONLY]


def sequence_score(
    pred: Sequence[FunctionStep],
    gt: Sequence[FunctionStep],
    alpha: float = 0.5,
    beta: float = 0.25,
    ordered: bool = False,
) -> float:
    """``(full + alpha * partial + beta * function_only) / max(len(pred), len(gt))`` (0 when both are empty).

    >>> from app.rewards.parsing import parse_steps
    >>> gt = parse_steps("change_color(1, red), change_size(2, small)")
    >>> sequence_score(parse_steps("change_color(1, red), change_size(3, large)"), gt)
    0.625
    """
    n = max(len(pred), len(gt))
    if n == 0:
        return 0.0
    full, partial, function_only = step_match_counts(pred, gt, ordered)
    return (full + alpha * partial + beta * function_only) / n


def _check_weights(alpha: float, beta: float) -> tuple[float, float]:
    alpha, beta = float(alpha), float(beta)
    for label, value in (("alpha", alpha), ("beta", beta)):
        if not (math.isfinite(value) and -1.0 <= value <= 1.0):
            raise ValueError(f"{label} must be in [-1, 1] (a partial match counts at most a full one), got {value}")
    return alpha, beta


def function_sequence_reward(
    completions: Sequence[str],
    answers: Sequence[str],
    alpha: float = 0.5,
    beta: float = 0.25,
    ordered: bool = False,
) -> Tensor:
    """``[N]`` float32 in ``[min(alpha, beta, 0), 1]``: the Reason-RFT function-sequence score (module docstring) of
    the steps in the first ``<answer>`` block against the steps of ``answers[i]``.

    A completion without an answer block or with malformed steps scores 0. A label that is ``None`` or not a step
    list raises ``ValueError`` (the data is misconfigured).

    Args:
        completions: N completions.
        answers: N labels in the same step syntax.
        alpha: credit of a step with the right function and the right object or value.
        beta: credit of a step with only the right function.
        ordered: compare step ``i`` with label step ``i`` only, instead of the best one-to-one pairing.

    >>> gt = "change_color(obj_1, red), change_size(obj_2, small)"
    >>> function_sequence_reward(["<answer>change_size(obj_2, small); change_color(obj_1, red)</answer>",
    ...                           "<answer>change_color(obj_1, blue)</answer>", "<answer>paint it red</answer>"],
    ...                          [gt] * 3)
    tensor([1.0000, 0.2500, 0.0000])
    """
    alpha, beta = _check_weights(alpha, beta)
    score = partial(sequence_score, alpha=alpha, beta=beta, ordered=ordered)
    label_kind = "a step list such as 'change_color(obj_1, red), ...'"
    return parsed_answer_scores("function_sequence_reward", completions, answers, parse_steps, score, label_kind)


class FunctionSequenceReward(RewardComponent):
    """Reason-RFT function-sequence accuracy against ``sample.answer`` (see :func:`function_sequence_reward`); name
    ``"function_sequence"``.

    ``value_range`` is ``(min(alpha, beta, 0), 1)`` for the instance (the class declares ``(-1, 1)``, the range over
    all allowed ``alpha`` and ``beta``).

    Args:
        alpha: credit of a partial match (function plus object or value); paper: 0, 0.5 or -0.25.
        beta: credit of a function-only match; paper: 0, 0.25 or -0.5.
        ordered: require the same position instead of the best one-to-one pairing.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"function_sequence"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> from app.types import VisualSample
        >>> sample = VisualSample(images=[], question="What changed?", task="transformation",
        ...                       answer="change_color(obj_1, red), change_shape(obj_3, cube)")
        >>> reward = FunctionSequenceReward(alpha=-0.25, beta=-0.5)
        >>> reward.value_range
        (-0.5, 1.0)
        >>> reward.score(["<answer>change_shape(obj_3, cube), change_color(obj_2, blue)</answer>"], [sample])
        tensor([0.2500])
    """

    completion_kinds = ("text",)

    value_range = (-1.0, 1.0)

    def __init__(
        self,
        alpha: float = 0.5,
        beta: float = 0.25,
        ordered: bool = False,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.alpha, self.beta = _check_weights(alpha, beta)
        self.ordered = bool(ordered)
        self.value_range = (min(self.alpha, self.beta, 0.0), 1.0)

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        answers = require_answers(self, samples)
        return function_sequence_reward(completions, answers, self.alpha, self.beta, self.ordered)

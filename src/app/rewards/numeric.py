"""Reason-RFT numeric accuracy ("mathematical type"): full reward inside a relative tolerance band, a cosine ramp
down to 0 outside it.

With ``d = |pred - gt|`` and ``s = |gt|``::

    r = 1                                                        if d <= eps1 * s
    r = 0                                                        if d >= eps2 * s
    r = 0.5 * (cos(pi * (d - eps1 * s) / ((eps2 - eps1) * s)) + 1)   otherwise

The paper's band is relative, so it is empty when ``gt == 0`` (any error would score 0, and the ramp divides by 0).
Here ``s = zero_scale`` (default 1.0) when ``gt == 0``: the band becomes absolute, ``|pred| <= eps1 * zero_scale``
scores 1 and ``|pred| >= eps2 * zero_scale`` scores 0. Set ``zero_scale`` to the typical size of the quantity.
See docs/algorithms.md#numeric-tolerance; Reason-RFT is listed in docs/algorithms.md#papers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

from torch import Tensor

from app.rewards.accuracy import parsed_answer_scores, require_answers
from app.rewards.base import RewardComponent
from app.rewards.parsing import parse_number
from app.types import VisualSample


def _check_band(eps1: float, eps2: float, zero_scale: float) -> tuple[float, float, float]:
    eps1, eps2, zero_scale = float(eps1), float(eps2), float(zero_scale)
    if not (math.isfinite(eps1) and math.isfinite(eps2) and 0.0 <= eps1 < eps2):
        raise ValueError(f"need finite 0 <= eps1 < eps2, got eps1={eps1}, eps2={eps2}")
    if not (math.isfinite(zero_scale) and zero_scale > 0.0):
        raise ValueError(f"zero_scale must be finite and > 0, got {zero_scale}")
    return eps1, eps2, zero_scale


def tolerance_score(pred: float, gt: float, eps1: float = 0.05, eps2: float = 0.20, zero_scale: float = 1.0) -> float:
    """The tolerance band of the module docstring for one finite ``pred`` and ``gt``.

    >>> [round(tolerance_score(pred, 100.0), 6) for pred in (104.0, 112.5, 130.0)]
    [1.0, 0.5, 0.0]
    """
    scale = abs(gt) if gt != 0 else zero_scale
    d = abs(pred - gt)
    low, high = eps1 * scale, eps2 * scale
    if d <= low:
        return 1.0
    if d >= high:  # also d = inf, when pred and gt are huge with opposite signs
        return 0.0
    return 0.5 * (math.cos(math.pi * (d - low) / (high - low)) + 1.0)


def numeric_tolerance_reward(
    completions: Sequence[str],
    answers: Sequence[str],
    eps1: float = 0.05,
    eps2: float = 0.20,
    zero_scale: float = 1.0,
) -> Tensor:
    """``[N]`` float32 in [0, 1]: the Reason-RFT tolerance band (module docstring) between the number in the first
    ``<answer>`` block and ``answers[i]``.

    Both are read with :func:`~app.rewards.parsing.parse_number` (decimals, fractions, percentages, units, simple
    LaTeX). A completion without an answer block or with no number in it scores 0. A label that is ``None`` or not a
    number raises ``ValueError`` (the data is misconfigured).

    Args:
        completions: N completions.
        answers: N labels.
        eps1: relative error that still scores 1.
        eps2: relative error from which on the score is 0.
        zero_scale: the scale that replaces ``|gt|`` when ``gt == 0`` (the band becomes absolute).

    >>> numeric_tolerance_reward(["<answer>10.4</answer>", "<answer>11.25 m</answer>", "<answer>13</answer>"],
    ...                          ["10", "10", "10"])
    tensor([1.0000, 0.5000, 0.0000])
    >>> numeric_tolerance_reward(["<answer>0.04</answer>", "<answer>\\\\frac{1}{2}</answer>"], ["0", "0"])
    tensor([1., 0.])
    """
    eps1, eps2, zero_scale = _check_band(eps1, eps2, zero_scale)
    score = partial(tolerance_score, eps1=eps1, eps2=eps2, zero_scale=zero_scale)
    return parsed_answer_scores(
        "numeric_tolerance_reward", completions, answers, parse_number, score, "a number parse_number understands"
    )


class NumericToleranceReward(RewardComponent):
    """Reason-RFT numeric accuracy against ``sample.answer`` (see :func:`numeric_tolerance_reward`); name
    ``"numeric_tolerance"``.

    Args:
        eps1: relative error that still scores 1 (paper: 0.05).
        eps2: relative error from which on the score is 0 (paper: 0.20).
        zero_scale: replaces ``|gt|`` when ``gt == 0``, so the band is ``eps1 * zero_scale`` .. ``eps2 * zero_scale``
            in absolute terms.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"numeric_tolerance"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> from app.types import VisualSample
        >>> sample = VisualSample(images=[], question="How long is AB?", task="geometry", answer="\\\\frac{3}{2}")
        >>> reward = NumericToleranceReward()
        >>> reward.score(["<answer>1.5 cm</answer>", "<answer>1.6</answer>", "<answer>two</answer>"], [sample] * 3)
        tensor([1.0000, 0.9698, 0.0000])
    """

    completion_kinds = ("text",)

    def __init__(
        self,
        eps1: float = 0.05,
        eps2: float = 0.20,
        zero_scale: float = 1.0,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.eps1, self.eps2, self.zero_scale = _check_band(eps1, eps2, zero_scale)

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        answers = require_answers(self, samples)
        return numeric_tolerance_reward(completions, answers, self.eps1, self.eps2, self.zero_scale)

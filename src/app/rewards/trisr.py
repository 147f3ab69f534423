"""TriSR reward classes (CoRe, docs/algorithms.md#trisr-rewards): one TorchMetrics component per term, the weighted
total, and the triplet evaluation metrics (accuracies, cycle rate, order accuracy, attribute accuracy). The math, the
ground-truth schema and the answer types are documented in :mod:`app.rewards.trisr_scores`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor

from app.rewards.base import RewardComponent
from app.rewards.trisr_scores import (
    DEFAULT_EPS,
    TripletScores,
    TripletTarget,
    _check_rule,
    _tensor,
    _total,
    tri_sr_value_range,
    triplet_scores,
)
from app.types import VisualSample


# ------------------------------------------------------------------------------------------------ components
class _TripletReward(RewardComponent):
    """Shared plumbing: validate each sample's meta once per call, parse each completion once.

    Only the terms that read a tolerance take it as an argument (``eps``: attribute grounding; ``interval_tolerance``:
    triplet consistency; both: the TriSR total) and set it with :meth:`_set_tolerances`; the others score with the
    defaults, which their values do not depend on.
    """

    completion_kinds = ("text",)

    scope = "triplet"
    needs_attributes = False
    needs_answers = True
    consistency_rule = "paper"
    eps: float = DEFAULT_EPS
    interval_tolerance: float = 0.0

    def _set_tolerances(self, eps: float | None = None, interval_tolerance: float | None = None) -> None:
        if eps is not None:
            if not eps > 0:
                raise ValueError(f"{type(self).__name__}: eps must be > 0, got {eps}")
            self.eps = float(eps)
        if interval_tolerance is not None:
            if not interval_tolerance >= 0:
                raise ValueError(f"{type(self).__name__}: interval_tolerance must be >= 0, got {interval_tolerance}")
            self.interval_tolerance = float(interval_tolerance)

    def _target(self, sample: VisualSample) -> TripletTarget:
        try:
            return TripletTarget.from_meta(sample.meta, self.needs_attributes, self.needs_answers)
        except ValueError as error:
            raise ValueError(f"{type(self).__name__} ({self.name!r}), task {sample.task!r}: {error}") from None

    def _scores(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> list[TripletScores]:
        targets: dict[int, TripletTarget] = {}  # the K completions of a prompt share one sample object
        scores = []
        for completion, sample in zip(completions, samples, strict=True):
            if id(sample) not in targets:
                targets[id(sample)] = self._target(sample)
            target = targets[id(sample)]
            scores.append(triplet_scores(completion, target, self.eps, self.interval_tolerance, self.consistency_rule))
        return scores

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        return _tensor([self._value(s) for s in self._scores(completions, samples)], self.value_range)

    def _value(self, scores: TripletScores) -> float:
        raise NotImplementedError


class AttributeGroundingReward(_TripletReward):
    """``R_ag`` (see :func:`attribute_grounding_reward`); needs ``meta["attributes"]``; name ``"attribute_grounding"``.

    Args:
        eps: floor of the relative error's denominator ``max(|v_k|, eps)``, > 0.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"attribute_grounding"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> sample = VisualSample(images=[], question="q", task="count", meta={"attributes": [4, 10, 9]})
        >>> AttributeGroundingReward().score(["<think>Image 1: 4\\nImage 2: 8</think>"], [sample])
        tensor([0.6062])
    """

    needs_attributes, needs_answers = True, False

    def __init__(self, eps: float = DEFAULT_EPS, weight: float = 1.0, name: str | None = None, **kwargs) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self._set_tolerances(eps=eps)

    def _value(self, scores: TripletScores) -> float:
        return scores.grounding


class JudgmentAlignmentReward(_TripletReward):
    """``R_ja`` (see :func:`judgment_alignment_reward`); needs ``meta["pair_answers"]``; name ``"judgment_alignment"``.

    Args:
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"judgment_alignment"``.

    Example:
        >>> meta = {"pair_answers": {"1-2": "2", "1-3": "1", "2-3": "2"}}
        >>> sample = VisualSample(images=[], question="q", task="count", meta=meta)
        >>> JudgmentAlignmentReward().score(["<think>Compare 1-2: 2</think><answer>1-2: 2</answer>"], [sample])
        tensor([0.3333])
    """

    def _value(self, scores: TripletScores) -> float:
        return scores.alignment


class TripletConsistencyReward(_TripletReward):
    """``R_tc`` in {-1, 0, 1} (see :func:`triplet_consistency_reward`); label-free: reads only
    ``meta["answer_type"]`` (default ordinal); name ``"triplet_consistency"``.

    Args:
        interval_tolerance: quantisation tolerance of the interval check.
        rule: the ordinal rule. ``"paper"`` (default): the paper's, applied literally: ``s_12`` and ``s_23`` must imply
            ``s_13``, so it scores 0 whenever image 2 is ranked first or last -- only ``1 > 2 > 3`` and ``3 > 2 > 1``
            can score +1, an ordering prior that an image-blind fixed answer can exploit. ``"transitive"``: the
            symmetric rule: +1 for any three answers that some values realise (no cycle, ties transitive), whichever
            image is in the middle; -1 for a cycle; 0 when an answer is missing. Interval and categorical answers
            score the same under both.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"triplet_consistency"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> sample = VisualSample(images=[], question="q", task="count")
        >>> TripletConsistencyReward().score(["<answer>1-2: same; 2-3: 3; 1-3: 1</answer>"], [sample])
        tensor([-1.])
        >>> middle_first = "<answer>1-2: 2; 1-3: 1; 2-3: 2</answer>"  # 2 > 1 > 3
        >>> TripletConsistencyReward().score([middle_first], [sample])
        tensor([0.])
        >>> TripletConsistencyReward(rule="transitive").score([middle_first], [sample])
        tensor([1.])
    """

    value_range = (-1.0, 1.0)
    needs_answers = False

    def __init__(
        self,
        interval_tolerance: float = 0.0,
        rule: str = "paper",
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self._set_tolerances(interval_tolerance=interval_tolerance)
        self.consistency_rule = _check_rule(rule)

    def _value(self, scores: TripletScores) -> float:
        return scores.consistency


class TripletTaskReward(_TripletReward):
    """``R_task`` (see :func:`triplet_task_reward`); needs ``meta["pair_answers"]``; name ``"triplet_task"``.

    Args:
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"triplet_task"``.

    Example:
        >>> meta = {"pair_answers": {"1-2": "2", "1-3": "1", "2-3": "2"}}
        >>> sample = VisualSample(images=[], question="q", task="count", meta=meta)
        >>> TripletTaskReward().score(["<answer>1-2: 2; 1-3: 1; 2-3: same</answer>"], [sample])
        tensor([0.6667])
    """

    def _value(self, scores: TripletScores) -> float:
        return scores.task


class TripletPartialAccuracy(TripletTaskReward):
    """Partial accuracy (Par.), an evaluation metric: the fraction of right sub-answers (the values of ``R_task``);
    name ``"triplet_partial_accuracy"``. Use it in ``eval_rewards``."""


class TripletOverallAccuracy(TripletTaskReward):
    """Overall accuracy (Ov.), an evaluation metric: 1 iff all three sub-answers are right; name
    ``"triplet_overall_accuracy"``. Use it in ``eval_rewards``, or as the correctness of
    :class:`~app.rewards.stabilizers.CosineLengthReward` on triplets."""

    def _value(self, scores: TripletScores) -> float:
        return float(scores.task == 1.0)


class TripletCycleRate(_TripletReward):
    """Cycle rate, an evaluation metric: 1 iff the three final answers are intransitive -- a cycle (``1 > 2``,
    ``2 > 3``, ``3 > 1``) or an intransitive tie -- else 0 (a missing answer is no cycle; see
    :func:`~app.rewards.trisr_scores.triplet_cycle_rate`); lower is better; label-free; name ``"triplet_cycle_rate"``.
    Use it in ``eval_rewards``.

    Args:
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"triplet_cycle_rate"``.

    Example:
        >>> sample = VisualSample(images=[], question="q", task="count")
        >>> answers = ["<answer>1-2: 1; 1-3: 3; 2-3: 2</answer>", "<answer>1-2: 1</answer>"]
        >>> TripletCycleRate().score(answers, [sample] * 2)
        tensor([1., 0.])
    """

    needs_answers = False

    def _value(self, scores: TripletScores) -> float:
        return scores.cycle


class TripletOrderAccuracy(_TripletReward):
    """Order accuracy, an evaluation metric: 1 iff the final answers determine one ranking of the three images (a weak
    order) and it is the true one, else 0 (a cycle, or answers that leave the ranking open, score 0; see
    :func:`~app.rewards.trisr_scores.triplet_order_accuracy`); needs ``meta["pair_answers"]``; name
    ``"triplet_order_accuracy"``. On complete ordinal answers it equals overall accuracy; it also credits a missing
    answer that the other two imply. An image-blind fixed ranking scores 1/6 on distinct values in random order.

    Args:
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None:
            ``"triplet_order_accuracy"``.

    Example:
        >>> meta = {"pair_answers": {"1-2": "2", "1-3": "1", "2-3": "2"}}  # 2 > 1 > 3
        >>> sample = VisualSample(images=[], question="q", task="count", meta=meta)
        >>> answers = ["<answer>1-2: 2; 1-3: 1</answer>", "<answer>1-2: 2; 2-3: 2</answer>"]
        >>> TripletOrderAccuracy().score(answers, [sample] * 2)
        tensor([1., 0.])
    """

    def _value(self, scores: TripletScores) -> float:
        return scores.order


class TripletAttributeAccuracy(_TripletReward):
    """Attribute accuracy, an evaluation metric: the fraction of the three ``Image k: <number>`` estimates equal to
    ``meta["attributes"][k]`` (for dots: per-image count accuracy); name ``"triplet_attribute_accuracy"``.

    Args:
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None:
            ``"triplet_attribute_accuracy"``.

    Example:
        >>> sample = VisualSample(images=[], question="q", task="count", meta={"attributes": [4, 10, 9]})
        >>> TripletAttributeAccuracy().score(["<think>Image 1: 4\\nImage 2: 8\\nImage 3: 9</think>"], [sample])
        tensor([0.6667])
    """

    needs_attributes, needs_answers = True, False

    def _value(self, scores: TripletScores) -> float:
        return scores.attribute_accuracy


class TriSRReward(_TripletReward):
    """The TriSR total ``R = R_task + ag_weight R_ag + ja_weight R_ja + tc_weight R_tc``; name ``"tri_sr"``.

    Needs ``meta["pair_answers"]`` and, unless ``ag_weight == 0``, ``meta["attributes"]``. ``value_range`` follows the
    weights: (-0.3, 1.7) for the paper's 0.2 / 0.2 / 0.3.

    To log each term as well, list the components beside it with weight 0 (they add nothing to the total), or use the
    components alone with the TriSR weights (:meth:`components`): the weighted sum is the same.

    Args:
        ag_weight: lambda_ag, the weight of attribute grounding ``R_ag`` (paper: 0.2); finite; 0 also drops the need
            for ``meta["attributes"]``.
        ja_weight: lambda_ja, the weight of judgment alignment ``R_ja`` (paper: 0.2); finite.
        tc_weight: lambda_tc, the weight of triplet consistency ``R_tc`` (paper: 0.3); finite.
        consistency_rule: the ordinal rule of ``R_tc`` (:class:`TripletConsistencyReward`'s ``rule``): ``"paper"``
            (default; rewards only the orders with image 2 in the middle) or ``"transitive"`` (symmetric: any order).
        eps: floor of the grounding denominator.
        interval_tolerance: quantisation tolerance of the interval consistency check.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"tri_sr"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> meta = {"attributes": [7, 4, 2], "pair_answers": {"1-2": "1", "1-3": "1", "2-3": "2"}}
        >>> sample = VisualSample(images=[], question="q", task="dots_count_triplets", meta=meta)
        >>> reward = TriSRReward()
        >>> reward.name, reward.value_range
        ('tri_sr', (-0.3, 1.7))
        >>> completion = "<think>Image 1: 7\\nImage 2: 4\\nImage 3: 2</think><answer>1-2: 1; 1-3: 1; 2-3: 2</answer>"
        >>> reward.score([completion], [sample])  # 1 + 0.2 * 1 + 0.2 * 0 + 0.3 * 1
        tensor([1.5000])
    """

    value_range = tri_sr_value_range()

    def __init__(
        self,
        ag_weight: float = 0.2,
        ja_weight: float = 0.2,
        tc_weight: float = 0.3,
        consistency_rule: str = "paper",
        eps: float = DEFAULT_EPS,
        interval_tolerance: float = 0.0,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self._set_tolerances(eps=eps, interval_tolerance=interval_tolerance)
        self.consistency_rule = _check_rule(consistency_rule)
        weights = (float(ag_weight), float(ja_weight), float(tc_weight))
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"TriSRReward: weights must be finite, got {weights}")
        self.ag_weight, self.ja_weight, self.tc_weight = weights
        self.needs_attributes = self.ag_weight != 0
        self.value_range = tri_sr_value_range(*weights)

    def _value(self, scores: TripletScores) -> float:
        return _total(scores, self.ag_weight, self.ja_weight, self.tc_weight)

    def components(self) -> list[RewardComponent]:
        """The four terms as separate components weighted like this total (times its ``weight``), for a
        :class:`~app.rewards.WeightedReward` that logs each one under ``train/reward/<name>``."""
        w = self.weight
        return [
            TripletTaskReward(weight=w),
            AttributeGroundingReward(eps=self.eps, weight=w * self.ag_weight),
            JudgmentAlignmentReward(weight=w * self.ja_weight),
            TripletConsistencyReward(
                rule=self.consistency_rule, interval_tolerance=self.interval_tolerance, weight=w * self.tc_weight
            ),
        ]

"""TriSR math (CoRe, docs/algorithms.md#trisr-rewards): the four terms, the total and their functional twins.

The reward classes are in :mod:`app.rewards.trisr`.

One sample holds three images and one comparison question per pair ``(1,2), (1,3), (2,3)``; a completion answers in
the format of :mod:`app.rewards.triplet_parsing` (attribute estimates ``v_hat_k`` and judgments ``y~_ij`` in the
reasoning, final answers ``y_hat_ij`` in ``<answer>``). With ground truth ``v_k`` and ``y*_ij``:

- attribute grounding ``R_ag = 1/3 sum_k exp(-|v_hat_k - v_k| / max(|v_k|, eps))`` (a missing estimate scores 0),
- judgment alignment ``R_ja = 1/(2|P|) sum_ij (1[y~_ij == y*_ij] + 1[y~_ij == y_hat_ij])``,
- triplet consistency ``R_tc = tau(y_hat_12, y_hat_13, y_hat_23)`` in {-1, 0, 1} (below),
- task accuracy ``R_task = 1/|P| sum_ij 1[y_hat_ij == y*_ij]``,
- total ``R = R_task + 0.2 R_ag + 0.2 R_ja + 0.3 R_tc`` (:class:`TriSRReward`, weights configurable).

Ground truth lives in ``sample.meta``::

    meta = {
        "attributes": [7, 4, 2],                                  # v_1, v_2, v_3 (numbers); needed by R_ag only
        "pair_answers": {"1-2": "1", "1-3": "1", "2-3": "2"},     # y*_ij; needed by all but R_tc
        "answer_type": "ordinal",                                 # optional: ordinal (default) | interval | categorical
    }

Answers are compared in canonical form (:func:`~app.rewards.triplet_parsing.canonical_answer`), by answer type; a
missing or unreadable answer equals nothing, not even another missing one:

- ``ordinal``: the answer names the image that wins the comparison the question asks for (more dots, closer, ...):
  ``2``, ``Image 2``, ``B`` (images 1/2/3 are also A/B/C), ``first``/``second`` (of the pair) or ``>``/``<``; ``same``,
  ``equal``, ``tie`` or ``=`` for a tie. Canonical form: the sign ``s_ij`` = +1 (image i wins), -1 (image j wins),
  0 (tie). An image outside the pair is unreadable.
- ``interval``: a range of the difference ``Delta_ij = v_i - v_j``: ``[lo, hi]``, ``(lo, hi)``, ``lo to hi`` or a single
  number (``lo == hi``). Canonical form: ``(lo, hi)`` with ``lo <= hi``.
- ``categorical``: a label (a spatial relation, say). Canonical form: the normalised text.

Triplet consistency ``tau``:

- ordinal: ``s_12`` and ``s_23`` imply ``s_13`` when they have the same sign (``s_13`` must be that sign; both 0
  imply 0) or when one of them is 0 (``s_13`` must be the other one). +1 if the predicted ``s_13`` is the implied sign,
  -1 if not; 0 when they point opposite ways (nothing implied) or when any of the three answers is missing.
- interval (the paper's "composed interval ``Delta_12 + Delta_23`` compatible with ``Delta_13`` up to quantisation
  tolerance"): ``v_1 - v_3 = Delta_12 + Delta_23``, so the composed range is ``[lo_12 + lo_23, hi_12 + hi_23]``; +1 if
  it overlaps ``[lo_13 - tol, hi_13 + tol]``, -1 if not, 0 when any answer is missing. The difference may as well be
  ``v_j - v_i`` throughout: the composition is the same.
- categorical: 0 (no task-independent rule composes labels; the paper's spatial checks are task-specific).

``R_tc`` reads only the model's own answers: :class:`TripletConsistencyReward` needs no labels.

The ordinal rule above is the paper's, applied literally (``rule="paper"``): it decides only when image 2 is not
ranked first or last, so of the six strict orders of three images only ``1 > 2 > 3`` and ``3 > 2 > 1`` can score +1;
the other four score 0 even when every answer is right, and an image-blind fixed answer ``1 > 2 > 3`` scores +1 on
every sample. ``rule="transitive"`` is the symmetric rule: +1 for any three answers that some values ``v_1, v_2, v_3``
realise (a weak order: no cycle, ties transitive), -1 for three that none does, 0 when any is missing; it scores the
same as the paper's rule except that the opposite-direction case (image 2 first or last) gets +1 instead of 0.
Interval and categorical answers score the same under both rules (the interval composition already is symmetric).

Diagnostics on the signs ``s_ij`` of the final answers (an ordinal answer is its sign; an interval ``(lo, hi)`` has sign
+1 if ``lo > 0``, -1 if ``hi < 0``, 0 if it is ``(0, 0)``, none if it straddles 0; a categorical answer has none):

- the compatible orders of an answer: the weak orders of the three images (13: 6 strict, 6 with one tie, all equal)
  that agree with every sign it gives (a missing or unreadable answer constrains nothing);
- cycle ``= 1`` iff no weak order is compatible: the three signs form a cycle (``1 > 2``, ``2 > 3``, ``3 > 1``) or an
  intransitive tie (``1 = 2``, ``2 = 3``, ``1 > 3``); fewer than three signs never do, so a missing answer is no cycle;
- order ``= 1`` iff exactly one weak order is compatible (the answers determine the ranking of the three images) and it
  is the true one (the signs of the ground-truth answers). Three right answers always score 1; an answer left out but
  implied by the other two (``1 > 2``, ``2 > 3``, ``1-3`` missing) scores 1 too; a cycle, two signs that leave the
  order open (``1 > 2``, ``3 > 2``) and a ground truth without signs (categorical) score 0. On complete ordinal answers
  order accuracy equals overall accuracy (three signs determine the order and the order determines them); it differs
  from it only where answers are missing or interval answers have the right signs but wrong ranges;
- attribute accuracy: the fraction of the three estimates ``v_hat_k`` equal to ``v_k`` (a count read right).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

from app.rewards.ranges import scores_in_range
from app.rewards.triplet_parsing import (
    ANSWER_TYPES,
    PAIRS,
    Canonical,
    TripletResponse,
    canonical_answer,
    parse_triplet_response,
)

DEFAULT_EPS = 1e-6
CONSISTENCY_RULES = ("paper", "transitive")
"""Ordinal triplet-consistency rules (module doc): the paper's, applied literally, and the symmetric one."""


def _sign(a: float, b: float) -> int:
    return (a > b) - (a < b)


WEAK_ORDERS: frozenset[tuple[int, int, int]] = frozenset(
    (_sign(v1, v2), _sign(v1, v3), _sign(v2, v3)) for v1, v2, v3 in itertools.product(range(3), repeat=3)
)
"""The 13 weak orders of three images as sign triples ``(s_12, s_13, s_23)``: the signs some values realise."""


# ------------------------------------------------------------------------------------------------ the four terms
def grounding_score(estimates: Sequence[float | None], targets: Sequence[float], eps: float = DEFAULT_EPS) -> float:
    """``R_ag``: mean over the three images of ``exp(-|v_hat_k - v_k| / max(|v_k|, eps))``; a missing estimate is 0."""
    total = 0.0
    for estimate, target in zip(estimates, targets, strict=True):
        if estimate is not None:
            error = abs(estimate - target) / max(abs(target), eps)
            total += math.exp(-error) if math.isfinite(error) else 0.0
    return total / 3


def alignment_score(
    judgments: Mapping[str, Canonical | None], answers: Mapping[str, Canonical | None], truth: Mapping[str, Canonical]
) -> float:
    """``R_ja``: ``1/(2|P|) sum_ij (1[y~_ij == y*_ij] + 1[y~_ij == y_hat_ij])`` on canonical answers."""
    hits = 0
    for pair in PAIRS:
        judgment = judgments[pair]
        if judgment is not None:
            hits += (judgment == truth[pair]) + (judgment == answers[pair])
    return hits / (2 * len(PAIRS))


def consistency_score(
    answers: Mapping[str, Canonical | None], answer_type: str = "ordinal", tolerance: float = 0.0, rule: str = "paper"
) -> float:
    """``R_tc = tau(y_hat_12, y_hat_13, y_hat_23)`` in {-1, 0, 1} on canonical answers (rules in the module doc).

    ``rule="paper"``: the paper's ordinal rule (0 when image 2 is first or last); ``"transitive"``: +1 for any three
    answers some values realise, -1 otherwise. Both give 0 when an answer is missing.
    """
    a12, a13, a23 = (answers[pair] for pair in PAIRS)
    if a12 is None or a13 is None or a23 is None or answer_type == "categorical":
        return 0.0
    if answer_type == "ordinal":
        if rule == "transitive":
            return 1.0 if (a12, a13, a23) in WEAK_ORDERS else -1.0
        if a12 * a23 < 0:
            return 0.0  # opposite directions: s_13 could be anything
        implied = a12 if a23 == 0 else a23
        return 1.0 if a13 == implied else -1.0
    lo, hi = a12[0] + a23[0], a12[1] + a23[1]
    return 1.0 if lo <= a13[1] + tolerance and a13[0] - tolerance <= hi else -1.0


def accuracy_score(answers: Mapping[str, Canonical | None], truth: Mapping[str, Canonical]) -> float:
    """``R_task``: fraction of the three final answers equal to the ground truth."""
    return sum(answers[pair] is not None and answers[pair] == truth[pair] for pair in PAIRS) / len(PAIRS)


# ------------------------------------------------------------------------------------------------ diagnostics
def answer_sign(answer: Canonical | None, answer_type: str = "ordinal") -> int | None:
    """The sign ``s_ij`` of a canonical answer (module doc); ``None`` when it has none."""
    if answer is None or answer_type == "categorical":
        return None
    if answer_type == "ordinal":
        return answer
    lo, hi = answer
    return 1 if lo > 0 else -1 if hi < 0 else 0 if lo == hi == 0 else None


def compatible_orders(signs: Mapping[str, int | None]) -> list[tuple[int, int, int]]:
    """The weak orders (sign triples ``(s_12, s_13, s_23)``) that agree with every sign given (``None``: no constraint).

    >>> len(compatible_orders({"1-2": 1, "1-3": None, "2-3": 1}))  # 1 > 2 > 3 implies 1 > 3
    1
    >>> len(compatible_orders({"1-2": 1, "1-3": None, "2-3": -1}))  # 1 > 2 < 3: 1 vs 3 open
    3
    >>> compatible_orders({"1-2": 1, "1-3": -1, "2-3": 1})  # a cycle
    []
    """
    given = [signs[pair] for pair in PAIRS]
    return sorted(o for o in WEAK_ORDERS if all(g is None or g == s for g, s in zip(given, o, strict=True)))


def cycle_score(signs: Mapping[str, int | None]) -> float:
    """1 iff no weak order is compatible with the signs (a cycle or an intransitive tie), else 0."""
    return 0.0 if compatible_orders(signs) else 1.0


def order_score(signs: Mapping[str, int | None], truth: Mapping[str, int | None]) -> float:
    """1 iff the signs determine one weak order of the three images (exactly one is compatible) and it is the true
    one, else 0; a ground truth without a sign for some pair scores 0."""
    orders = compatible_orders(signs)
    true = tuple(truth[pair] for pair in PAIRS)
    return 1.0 if len(orders) == 1 and orders[0] == true else 0.0


def attribute_accuracy_score(estimates: Sequence[float | None], targets: Sequence[float]) -> float:
    """The fraction of the three estimates equal to their target (a missing estimate is wrong)."""
    return sum(e is not None and e == t for e, t in zip(estimates, targets, strict=True)) / 3


# ------------------------------------------------------------------------------------------------ targets
@dataclass(frozen=True)
class TripletTarget:
    """Validated ground truth of one triplet sample (from ``sample.meta``, schema in the module doc)."""

    attributes: tuple[float, float, float] | None
    pair_answers: dict[str, Canonical] | None
    answer_type: str = "ordinal"

    @classmethod
    def from_meta(cls, meta: Mapping, need_attributes: bool = False, need_answers: bool = False) -> TripletTarget:
        """Read and check ``meta``; raises ``ValueError`` on a misconfigured sample (this is not model output)."""
        answer_type = meta.get("answer_type", "ordinal")
        if answer_type not in ANSWER_TYPES:
            raise ValueError(f"meta['answer_type'] must be one of {ANSWER_TYPES}, got {answer_type!r}")
        return cls(
            _check_attributes(meta.get("attributes"), need_attributes),
            _check_answers(meta.get("pair_answers"), answer_type, need_answers),
            answer_type,
        )


def _check_attributes(attributes, required: bool) -> tuple[float, float, float] | None:
    if attributes is None:
        if required:
            raise ValueError("a triplet sample needs meta['attributes'] = [v1, v2, v3] for attribute grounding")
        return None
    if not isinstance(attributes, Sequence) or isinstance(attributes, str | bytes) or len(attributes) != 3:
        raise ValueError(f"meta['attributes'] must hold three numbers, got {attributes!r}")
    try:
        values = tuple(float(v) for v in attributes)
    except (TypeError, ValueError):
        values = (math.nan,)
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"meta['attributes'] must be finite, got {attributes!r}")
    return values


def _check_answers(pair_answers, answer_type: str, required: bool) -> dict[str, Canonical] | None:
    if pair_answers is None:
        if required:
            raise ValueError(f"a triplet sample needs meta['pair_answers'] = {{pair: answer}} for pairs {PAIRS}")
        return None
    if not isinstance(pair_answers, Mapping) or set(pair_answers) != set(PAIRS):
        raise ValueError(f"meta['pair_answers'] must map exactly the pairs {PAIRS} to answers, got {pair_answers!r}")
    truth = {pair: canonical_answer(_as_text(pair_answers[pair]), pair, answer_type) for pair in PAIRS}
    bad = {pair: pair_answers[pair] for pair, value in truth.items() if value is None}
    if bad:
        raise ValueError(f"meta['pair_answers'] has answers that are not valid {answer_type} answers: {bad!r}")
    return truth


def _as_text(label: object) -> object:
    """Ground truth from JSON may be a number (``2``) or, for intervals, a pair ``[lo, hi]``."""
    if isinstance(label, bool):
        return label
    if isinstance(label, int | float):
        return str(label)
    if isinstance(label, Sequence) and not isinstance(label, str) and len(label) == 2:
        return f"[{label[0]}, {label[1]}]"
    return label


@dataclass(frozen=True)
class TripletScores:
    """The four TriSR terms of one completion."""

    task: float
    grounding: float
    alignment: float
    consistency: float
    cycle: float = 0.0
    order: float = 0.0
    attribute_accuracy: float = 0.0


def triplet_scores(
    completion: object,
    target: TripletTarget,
    eps: float = DEFAULT_EPS,
    interval_tolerance: float = 0.0,
    consistency_rule: str = "paper",
) -> TripletScores:
    """Parse ``completion`` once and compute every term and diagnostic the target allows (the others are 0)."""
    response: TripletResponse = parse_triplet_response(completion)
    kind = target.answer_type
    answers = {pair: canonical_answer(response.answers[pair], pair, kind) for pair in PAIRS}
    judgments = {pair: canonical_answer(response.judgments[pair], pair, kind) for pair in PAIRS}
    signs = {pair: answer_sign(answers[pair], kind) for pair in PAIRS}
    truth = target.pair_answers
    attributes = target.attributes
    return TripletScores(
        task=accuracy_score(answers, truth) if truth is not None else 0.0,
        grounding=grounding_score(response.attributes, attributes, eps) if attributes else 0.0,
        alignment=alignment_score(judgments, answers, truth) if truth is not None else 0.0,
        consistency=consistency_score(answers, kind, interval_tolerance, consistency_rule),
        cycle=cycle_score(signs),
        order=order_score(signs, {p: answer_sign(truth[p], kind) for p in PAIRS}) if truth is not None else 0.0,
        attribute_accuracy=attribute_accuracy_score(response.attributes, attributes) if attributes else 0.0,
    )


def _types(answer_types: str | Sequence[str], n: int) -> list[str]:
    if isinstance(answer_types, str):
        return [answer_types] * n
    if len(answer_types) != n:
        raise ValueError(f"got {n} completions but {len(answer_types)} answer types")
    return list(answer_types)


def _targets(
    n: int,
    attributes: Sequence[Sequence[float]] | None = None,
    pair_answers: Sequence[Mapping[str, str]] | None = None,
    answer_types: str | Sequence[str] = "ordinal",
) -> list[TripletTarget]:
    for name, values in (("attributes", attributes), ("pair_answers", pair_answers)):
        if values is not None and len(values) != n:
            raise ValueError(f"got {n} completions but {len(values)} {name}")
    metas = [{"answer_type": t} for t in _types(answer_types, n)]
    for i, meta in enumerate(metas):
        if attributes is not None:
            meta["attributes"] = attributes[i]
        if pair_answers is not None:
            meta["pair_answers"] = pair_answers[i]
    need_attributes, need_answers = attributes is not None, pair_answers is not None
    return [TripletTarget.from_meta(meta, need_attributes, need_answers) for meta in metas]


def _check_rule(rule: str) -> str:
    if rule not in CONSISTENCY_RULES:
        raise ValueError(f"consistency rule must be one of {CONSISTENCY_RULES}, got {rule!r}")
    return rule


def _tensor(values: list[float], value_range: tuple[float, float] = (0.0, 1.0)) -> Tensor:
    return scores_in_range(values, value_range)


# ------------------------------------------------------------------------------------------------ functional twins
def attribute_grounding_reward(
    completions: Sequence[str], attributes: Sequence[Sequence[float]], eps: float = DEFAULT_EPS
) -> Tensor:
    """``[N]`` ``R_ag`` in [0, 1]: how close the ``Image k: <number>`` estimates are to ``attributes[i]``.

    >>> completion = "<think>Image 1: 4\\nImage 2: 8\\nImage 3: nine</think><answer>...</answer>"
    >>> attribute_grounding_reward([completion], [[4, 10, 9]])  # (1 + exp(-0.2) + 0) / 3
    tensor([0.6062])
    """
    targets = _targets(len(completions), attributes=attributes)
    return _tensor([triplet_scores(c, t, eps).grounding for c, t in zip(completions, targets, strict=True)])


def judgment_alignment_reward(
    completions: Sequence[str], pair_answers: Sequence[Mapping[str, str]], answer_types: str | Sequence[str] = "ordinal"
) -> Tensor:
    """``[N]`` ``R_ja`` in [0, 1]: judgments (``Compare i-j: ...``) that match the truth and the final answers.

    >>> truth = {"1-2": "2", "1-3": "1", "2-3": "2"}
    >>> completion = "<think>Compare 1-2: 2\\nCompare 1-3: 3\\nCompare 2-3: 2</think><answer>1-2: 2; 1-3: 3</answer>"
    >>> judgment_alignment_reward([completion], [truth])  # (2 + 1 + 1) / 6
    tensor([0.6667])
    """
    targets = _targets(len(completions), pair_answers=pair_answers, answer_types=answer_types)
    return _tensor([triplet_scores(c, t).alignment for c, t in zip(completions, targets, strict=True)])


def triplet_consistency_reward(
    completions: Sequence[str],
    answer_types: str | Sequence[str] = "ordinal",
    interval_tolerance: float = 0.0,
    rule: str = "paper",
) -> Tensor:
    """``[N]`` ``R_tc`` in {-1, 0, 1}: are the three final answers logically compatible? Needs no labels. ``rule``:
    ``"paper"`` (the paper's ordinal rule) or ``"transitive"`` (the symmetric one; module doc).

    >>> texts = [
    ...     "<answer>1-2: 1; 2-3: 2; 1-3: 1</answer>",  # 1 > 2 > 3 and 1 > 3: consistent
    ...     "<answer>1-2: 1; 2-3: 2; 1-3: 3</answer>",  # 1 > 2 > 3 but 3 > 1: contradiction
    ...     "<answer>1-2: 1; 2-3: 3; 1-3: 3</answer>",  # 1 > 2 < 3: nothing implied (paper); 3 > 1 > 2 (transitive)
    ... ]
    >>> triplet_consistency_reward(texts)
    tensor([ 1., -1.,  0.])
    >>> triplet_consistency_reward(texts, rule="transitive")
    tensor([ 1., -1.,  1.])
    """
    _check_rule(rule)
    targets = _targets(len(completions), answer_types=answer_types)
    scores = [
        triplet_scores(c, t, DEFAULT_EPS, interval_tolerance, rule) for c, t in zip(completions, targets, strict=True)
    ]
    return _tensor([s.consistency for s in scores], (-1.0, 1.0))


def triplet_cycle_rate(completions: Sequence[str], answer_types: str | Sequence[str] = "ordinal") -> Tensor:
    """``[N]`` in {0, 1}: 1 iff the final answers' signs form a cycle or an intransitive tie (no weak order of the
    three images realises them; module doc). A missing answer is no cycle. Needs no labels.

    >>> triplet_cycle_rate([
    ...     "<answer>1-2: 1; 1-3: 3; 2-3: 2</answer>",  # 1 > 2 > 3 > 1
    ...     "<answer>1-2: same; 1-3: 1; 2-3: same</answer>",  # 1 = 2 = 3 but 1 > 3
    ...     "<answer>1-2: 1; 1-3: 3; 2-3: 3</answer>",  # 3 > 1 > 2
    ...     "<answer>1-2: 1; 2-3: 2</answer>",  # 1-3 missing
    ... ])
    tensor([1., 1., 0., 0.])
    """
    targets = _targets(len(completions), answer_types=answer_types)
    return _tensor([triplet_scores(c, t).cycle for c, t in zip(completions, targets, strict=True)])


def triplet_order_accuracy(
    completions: Sequence[str], pair_answers: Sequence[Mapping[str, str]], answer_types: str | Sequence[str] = "ordinal"
) -> Tensor:
    """``[N]`` in {0, 1}: 1 iff the final answers determine one ranking of the three images and it is the true one
    (module doc): all three right, or two right that imply the third when it is missing.

    >>> truth = {"1-2": "1", "1-3": "1", "2-3": "2"}  # 1 > 2 > 3
    >>> triplet_order_accuracy([
    ...     "<answer>1-2: 1; 1-3: 1; 2-3: 2</answer>",
    ...     "<answer>1-2: 1; 2-3: 2</answer>",  # 1-3 implied
    ...     "<answer>1-2: 1; 1-3: 1</answer>",  # 2 vs 3 open
    ...     "<answer>1-2: 1; 1-3: 3; 2-3: 2</answer>",  # a cycle
    ... ], [truth] * 4)
    tensor([1., 1., 0., 0.])
    """
    targets = _targets(len(completions), pair_answers=pair_answers, answer_types=answer_types)
    return _tensor([triplet_scores(c, t).order for c, t in zip(completions, targets, strict=True)])


def triplet_attribute_accuracy(completions: Sequence[str], attributes: Sequence[Sequence[float]]) -> Tensor:
    """``[N]`` in {0, 1/3, 2/3, 1}: the fraction of the ``Image k: <number>`` estimates equal to ``attributes[i][k]``.

    >>> triplet_attribute_accuracy(["<think>Image 1: 4\\nImage 2: 8\\nImage 3: 9</think>"], [[4, 10, 9]])
    tensor([0.6667])
    """
    targets = _targets(len(completions), attributes=attributes)
    return _tensor([triplet_scores(c, t).attribute_accuracy for c, t in zip(completions, targets, strict=True)])


def triplet_task_reward(
    completions: Sequence[str], pair_answers: Sequence[Mapping[str, str]], answer_types: str | Sequence[str] = "ordinal"
) -> Tensor:
    """``[N]`` ``R_task`` in [0, 1]: fraction of the three final answers that are right.

    >>> triplet_task_reward(["<answer>1-2: Image 2; 1-3: 1; 2-3: 3</answer>"], [{"1-2": "2", "1-3": "1", "2-3": "2"}])
    tensor([0.6667])
    """
    targets = _targets(len(completions), pair_answers=pair_answers, answer_types=answer_types)
    return _tensor([triplet_scores(c, t).task for c, t in zip(completions, targets, strict=True)])


def triplet_partial_accuracy(
    completions: Sequence[str], pair_answers: Sequence[Mapping[str, str]], answer_types: str | Sequence[str] = "ordinal"
) -> Tensor:
    """``[N]`` partial accuracy (the paper's Par.): fraction of sub-answers right; the same values as ``R_task``.

    >>> triplet_partial_accuracy(["<answer>1-2: 2; 1-3: 3; 2-3: 2</answer>"], [{"1-2": "2", "1-3": "1", "2-3": "2"}])
    tensor([0.6667])
    """
    return triplet_task_reward(completions, pair_answers, answer_types)


def triplet_overall_accuracy(
    completions: Sequence[str], pair_answers: Sequence[Mapping[str, str]], answer_types: str | Sequence[str] = "ordinal"
) -> Tensor:
    """``[N]`` overall accuracy (the paper's Ov.): 1 iff all three sub-answers are right.

    >>> truth = {"1-2": "2", "1-3": "1", "2-3": "2"}
    >>> triplet_overall_accuracy(["<answer>1-2: 2; 1-3: 1; 2-3: 2</answer>", "<answer>1-2: 2</answer>"], [truth] * 2)
    tensor([1., 0.])
    """
    return (triplet_task_reward(completions, pair_answers, answer_types) == 1.0).float()


def tri_sr_reward(
    completions: Sequence[str],
    attributes: Sequence[Sequence[float]],
    pair_answers: Sequence[Mapping[str, str]],
    answer_types: str | Sequence[str] = "ordinal",
    ag_weight: float = 0.2,
    ja_weight: float = 0.2,
    tc_weight: float = 0.3,
    eps: float = DEFAULT_EPS,
    interval_tolerance: float = 0.0,
    consistency_rule: str = "paper",
) -> Tensor:
    """``[N]`` ``R = R_task + ag_weight R_ag + ja_weight R_ja + tc_weight R_tc``, ``R_tc`` by ``consistency_rule``.

    >>> completion = (
    ...     "<think>Image 1: 7\\nImage 2: 4\\nImage 3: 2\\nCompare 1-2: 1\\nCompare 1-3: 1\\nCompare 2-3: 2</think>"
    ...     "<answer>1-2: 1; 1-3: 1; 2-3: 2</answer>"
    ... )
    >>> tri_sr_reward([completion], [[7, 4, 2]], [{"1-2": "1", "1-3": "1", "2-3": "2"}])  # 1 + 0.2 + 0.2 + 0.3
    tensor([1.7000])
    """
    _check_rule(consistency_rule)
    targets = _targets(len(completions), attributes, pair_answers, answer_types)
    scores = [
        triplet_scores(c, t, eps, interval_tolerance, consistency_rule)
        for c, t in zip(completions, targets, strict=True)
    ]
    value_range = tri_sr_value_range(ag_weight, ja_weight, tc_weight)
    return _tensor([_total(s, ag_weight, ja_weight, tc_weight) for s in scores], value_range)


def _total(s: TripletScores, ag_weight: float, ja_weight: float, tc_weight: float) -> float:
    return s.task + ag_weight * s.grounding + ja_weight * s.alignment + tc_weight * s.consistency


def tri_sr_value_range(ag_weight: float = 0.2, ja_weight: float = 0.2, tc_weight: float = 0.3) -> tuple[float, float]:
    """Bounds of the TriSR total: ``R_task, R_ag, R_ja`` lie in [0, 1] and ``R_tc`` in [-1, 1].

    >>> tri_sr_value_range()
    (-0.3, 1.7)
    """
    terms = [(1.0, 0.0, 1.0), (ag_weight, 0.0, 1.0), (ja_weight, 0.0, 1.0), (tc_weight, -1.0, 1.0)]
    low = sum(min(w * lo, w * hi) for w, lo, hi in terms)
    high = sum(max(w * lo, w * hi) for w, lo, hi in terms)
    return round(low, 12), round(high, 12)

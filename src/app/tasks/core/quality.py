"""Quality Control Expert ``phi_m(v_1, v_2, v_3) -> {0, 1}`` of CoRe (CoRe section 3.2, eqs. 6-7,
docs/algorithms.md#papers).

A triplet is kept only if every pairwise difference ``delta_ij = d_m(v_i, v_j)`` lies in the task's admissible set
``T_m``. The paper gives the form but not the numbers; the defaults here (:data:`DEFAULT_RULES`) are:

- counting: absolute gaps in ``[1, 6]``: counts differ (procedural points are exact, so one is not noise), and no pair
  is so far apart that a glance settles it;
- depth and distance: *relative* gaps ``|v_i - v_j| / min(v_i, v_j)`` in ``[0.15, 2.0]``: the farther value is at
  least 15 % and at most 3x the nearer one. Relative, not absolute, because the error of metric depth grows with
  depth (a fixed 0.5 m gap is noise at 40 m and obvious at 1 m);
- spatial (categorical): every relation defined (the expert returned a label, not ``None``), labels from the known set,
  and at least two distinct labels among the three images, so the pairwise answers do not collapse to one label.

:class:`QualityStats` counts accepted and rejected triplets per task and reason.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.tasks.core.metrics import RELATIONS

PAIR_INDICES = ((0, 1), (0, 2), (1, 2))
"""Index pairs of the image pairs ``1-2``, ``1-3``, ``2-3``."""


@dataclass(frozen=True)
class Verdict:
    """``phi_m``: ``accepted``, and when not, a short ``reason`` (``"undefined"``, ``"too_close"``, ...)."""

    accepted: bool
    reason: str | None = None


@dataclass(frozen=True)
class NumericRule:
    """``T_m = [min_gap, max_gap]`` on ``delta_ij = |v_i - v_j|``, or on ``|v_i - v_j| / min(|v_i|, |v_j|)`` when
    ``relative``."""

    min_gap: float
    max_gap: float = math.inf
    relative: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.min_gap <= self.max_gap:
            # min_gap > 0: a tie has no correct option among the two images
            raise ValueError(f"NumericRule needs 0 < min_gap <= max_gap, got {self.min_gap} and {self.max_gap}")

    def gap(self, a: float, b: float) -> float:
        """``d_m(a, b)``."""
        diff = abs(a - b)
        if not self.relative:
            return diff
        base = min(abs(a), abs(b))
        return diff / base if base > 0 else (0.0 if diff == 0 else math.inf)

    def check(self, values: Sequence[float | None]) -> Verdict:
        if any(v is None or isinstance(v, str) or not math.isfinite(v) for v in values):
            return Verdict(False, "undefined")
        gaps = [self.gap(values[i], values[j]) for i, j in PAIR_INDICES]
        if min(gaps) < self.min_gap:
            return Verdict(False, "too_close")
        if max(gaps) > self.max_gap:
            return Verdict(False, "too_far")
        return Verdict(True)


@dataclass(frozen=True)
class CategoricalRule:
    """Validity and diversity of categorical values: each one of ``labels``, at least ``min_distinct`` distinct."""

    labels: tuple[str, ...] = RELATIONS
    min_distinct: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.min_distinct <= 3:
            raise ValueError(f"CategoricalRule.min_distinct must be in [1, 3], got {self.min_distinct}")

    def check(self, values: Sequence[str | None]) -> Verdict:
        if any(v is None for v in values):
            return Verdict(False, "undefined")
        if any(v not in self.labels for v in values):
            return Verdict(False, "unknown_label")
        if len(set(values)) < self.min_distinct:
            return Verdict(False, "not_diverse")
        return Verdict(True)


Rule = NumericRule | CategoricalRule

DEFAULT_RULES: dict[str, Rule] = {
    "counting": NumericRule(1, 6),
    "depth": NumericRule(0.15, 2.0, relative=True),
    "distance": NumericRule(0.15, 2.0, relative=True),
    "spatial": CategoricalRule(),
}
"""The admissible sets ``T_m`` used unless a data set is given others (see the module docstring)."""


def quality_check(values: Sequence[float | str | None], rule: Rule) -> Verdict:
    """``phi_m(v_1, v_2, v_3)`` under ``rule``."""
    if len(values) != 3:
        raise ValueError(f"quality control takes a triplet of values, got {len(values)}")
    return rule.check(values)


@dataclass
class QualityStats:
    """Accepted and rejected triplets per task, the rejections by reason."""

    accepted: Counter = field(default_factory=Counter)
    rejected: dict[str, Counter] = field(default_factory=dict)

    def record(self, task: str, verdict: Verdict) -> None:
        if verdict.accepted:
            self.accepted[task] += 1
        else:
            self.rejected.setdefault(task, Counter())[verdict.reason] += 1

    def num_rejected(self, task: str | None = None) -> int:
        tasks = self.rejected if task is None else [task]
        return sum(sum(self.rejected.get(t, Counter()).values()) for t in tasks)

    def rejection_rate(self, task: str | None = None) -> float:
        """Rejected / drawn triplets (0 when nothing was drawn)."""
        accepted = sum(self.accepted.values()) if task is None else self.accepted[task]
        rejected = self.num_rejected(task)
        return rejected / (accepted + rejected) if accepted + rejected else 0.0

    def summary(self) -> dict[str, dict[str, object]]:
        """Per task: accepted, rejected, rejection rate and rejections by reason (plain JSON)."""
        tasks = sorted(set(self.accepted) | set(self.rejected))
        return {
            t: {
                "accepted": self.accepted[t],
                "rejected": self.num_rejected(t),
                "rejection_rate": round(self.rejection_rate(t), 4),
                "reasons": dict(sorted(self.rejected.get(t, Counter()).items())),
            }
            for t in tasks
        }

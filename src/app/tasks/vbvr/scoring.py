"""Combining a scorer's checks into one deterministic score with a breakdown of what failed."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Check:
    """One task-specific check.

    Attributes:
        name: what was checked, e.g. ``"path_connects_start_to_goal"``.
        value: degree of success in [0, 1] (1 passed; soft checks may be fractional).
        weight: weight among the soft checks (ignored for hard ones).
        hard: a hard constraint multiplies the score instead of adding to it.
        detail: a short human-readable explanation (measured vs expected).
    """

    name: str
    value: float
    weight: float = 1.0
    hard: bool = False
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.value >= 1.0 - 1e-9


@dataclass(frozen=True)
class ScoreResult:
    """The score in [0, 1] and every check that produced it."""

    score: float
    checks: tuple[Check, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> list[str]:
        """Names (with details) of the checks that did not fully pass."""
        return [f"{c.name}: {c.detail}" if c.detail else c.name for c in self.checks if not c.passed]


def combine(checks: list[Check]) -> ScoreResult:
    """Soft checks: weighted mean of their values; hard checks: product of their values; score = soft * hard.

    >>> combine([Check("count", 1.0, hard=True), Check("colour", 0.5), Check("position", 1.0, weight=3)]).score
    0.875
    >>> combine([Check("count", 0.0, hard=True), Check("colour", 1.0)]).score
    0.0
    """
    clipped = [Check(c.name, min(1.0, max(0.0, float(c.value))), c.weight, c.hard, c.detail) for c in checks]
    soft = [c for c in clipped if not c.hard]
    total_weight = sum(c.weight for c in soft)
    soft_score = sum(c.weight * c.value for c in soft) / total_weight if total_weight > 0 else 1.0
    hard_score = 1.0
    for c in clipped:
        if c.hard:
            hard_score *= c.value
    return ScoreResult(round(soft_score * hard_score, 9), tuple(clipped))

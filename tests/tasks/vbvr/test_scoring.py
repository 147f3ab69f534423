"""Scorer checks combined into one score (app.tasks.vbvr.scoring) against hand-computed values."""

import pytest

from app.tasks.vbvr.scoring import Check, ScoreResult, combine


def test_soft_checks_average_by_weight_and_hard_checks_multiply():
    result = combine(
        [Check("a", 0.5, weight=3), Check("count", 0.8, hard=True), Check("b", 1.0), Check("c", 0.5, hard=True)]
    )
    assert result.score == pytest.approx((3 * 0.5 + 1.0) / 4 * 0.8 * 0.5, abs=1e-12)


@pytest.mark.parametrize(
    ("checks", "score"),
    [
        ([], 1.0),  # nothing to fail
        ([Check("count", 0.5, hard=True)], 0.5),  # hard checks only: the soft part is 1
        ([Check("count", 0.5, hard=True), Check("ignored", 0.2, weight=0.0)], 0.5),  # soft weights summing to 0
    ],
)
def test_without_soft_weight_the_soft_part_is_one(checks, score):
    assert combine(checks).score == score


def test_values_are_clipped_to_the_unit_interval_and_the_score_rounded_to_nine_decimals():
    result = combine([Check("over", 1.7), Check("under", -0.4, hard=False), Check("third", 1 / 3)])
    assert [c.value for c in result.checks] == [1.0, 0.0, 1 / 3]
    assert result.score == 0.444444444  # (1 + 0 + 1/3) / 3, rounded
    assert combine([Check("third", 1 / 3)]).score == 0.333333333


def test_failed_names_the_checks_below_one_with_their_details():
    result = combine([Check("ok", 1.0 - 1e-10), Check("close", 0.999, detail="0.999 of the path"), Check("bad", 0.0)])
    assert result.failed == ["close: 0.999 of the path", "bad"]
    assert Check("edge", 1.0 - 1e-9).passed and not Check("below", 1.0 - 2e-9).passed
    assert ScoreResult(1.0).checks == () and ScoreResult(1.0).failed == []

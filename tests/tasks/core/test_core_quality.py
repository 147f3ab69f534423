"""CoRe quality control: admissible-set boundaries, categorical validity and diversity, rejection statistics."""

import math

import pytest

from app.tasks.core import DEFAULT_RULES, CategoricalRule, NumericRule, QualityStats, quality_check


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ([3, 4, 9], None),  # gaps 1, 6, 5: both bounds reached, still inside
        ([3, 3, 8], "too_close"),
        ([2, 9, 5], "too_far"),  # 7 > 6
        ([2, None, 5], "undefined"),
    ],
)
def test_counting_absolute_gaps(values, reason):
    verdict = quality_check(values, DEFAULT_RULES["counting"])
    assert verdict.accepted is (reason is None) and verdict.reason == reason


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ([10.0, 11.5, 30.0], None),  # relative gaps 0.15, 2.0, 1.61: the bounds are inclusive
        ([10.0, 11.49, 20.0], "too_close"),
        ([10.0, 15.0, 30.01], "too_far"),
        ([1.0, 1.2, 1.5], None),  # scale-free: the same ratios at any distance
        ([10.0, 12.0, math.nan], "undefined"),
    ],
)
def test_depth_relative_gaps(values, reason):
    assert quality_check(values, DEFAULT_RULES["depth"]).reason == reason
    assert quality_check(values, DEFAULT_RULES["distance"]).reason == reason


def test_relative_gap_is_symmetric_and_handles_zero():
    rule = NumericRule(0.1, 1.0, relative=True)
    assert rule.gap(2.0, 3.0) == rule.gap(3.0, 2.0) == 0.5
    assert rule.gap(0.0, 1.0) == math.inf and rule.gap(0.0, 0.0) == 0.0


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        (["left", "left", "above"], None),
        (["left", "right", "below"], None),
        (["left", "left", "left"], "not_diverse"),
        (["left", None, "above"], "undefined"),
        (["left", "behind", "above"], "unknown_label"),
    ],
)
def test_spatial_validity_and_diversity(values, reason):
    assert quality_check(values, DEFAULT_RULES["spatial"]).reason == reason


def test_rules_reject_bad_settings_and_wrong_arity():
    with pytest.raises(ValueError, match="0 < min_gap <= max_gap"):
        NumericRule(0.0, 1.0)
    with pytest.raises(ValueError, match="0 < min_gap <= max_gap"):
        NumericRule(2.0, 1.0)
    with pytest.raises(ValueError, match="min_distinct"):
        CategoricalRule(min_distinct=4)
    with pytest.raises(ValueError, match="triplet"):
        quality_check([1, 2], DEFAULT_RULES["counting"])


def test_stats_count_by_task_and_reason():
    stats = QualityStats()
    for values in ([3, 4, 9], [3, 3, 8], [3, 3, 9], [2, 9, 5]):
        stats.record("counting", quality_check(values, DEFAULT_RULES["counting"]))
    stats.record("spatial", quality_check(["left", "right", "left"], DEFAULT_RULES["spatial"]))
    assert stats.num_rejected("counting") == 3 and stats.num_rejected() == 3
    assert stats.rejection_rate("counting") == 0.75 and stats.rejection_rate("spatial") == 0.0
    assert stats.summary()["counting"] == {
        "accepted": 1,
        "rejected": 3,
        "rejection_rate": 0.75,
        "reasons": {"too_close": 2, "too_far": 1},
    }

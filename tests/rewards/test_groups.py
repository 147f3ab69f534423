"""Groups are runs of the same sample object; pairs are consecutive groups sharing a pair id; bad layouts raise."""

from types import SimpleNamespace

import pytest

from app.rewards.groups import pair_groups, split_groups
from app.types import VisualSample


def sample(pair_id=None, relation=None, question="q") -> VisualSample:
    meta = {} if pair_id is None else {"pair_id": pair_id}
    if relation is not None:
        meta["relation"] = relation
    return VisualSample(images=[], question=question, task="t", meta=meta)


def test_split_groups_uses_identity_not_equality():
    a, b = sample(1), sample(1)
    assert a == b and a is not b  # equal dataclasses, still two prompts
    assert split_groups([a, a, a, b, b, b, a]) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert split_groups([]) == []
    assert split_groups([a]) == [slice(0, 1)]


def test_split_groups_with_group_size_cuts_runs_of_k_rows_whatever_the_objects():
    a, b, c = sample(1), sample(2), sample(3)
    # One object over two groups, and a group of distinct objects: only the row count decides.
    assert split_groups([a, a, a, a, b, c], group_size=2) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert split_groups([a, a, a, b, b, b], group_size=3) == [slice(0, 3), slice(3, 6)]
    assert split_groups([a, b, c], group_size=1) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # K = 1 is valid
    assert split_groups([], group_size=2) == []


@pytest.mark.parametrize(
    "rows, group_size", [(5, 2), (4, 3), (3, 0), (0, 0), (4, -2)], ids=["5_by_2", "4_by_3", "zero", "empty_zero", "neg"]
)
def test_split_groups_rejects_a_group_size_that_does_not_divide_the_rows(rows, group_size):
    with pytest.raises(ValueError, match=rf"^{rows} rows do not split into groups of group_size={group_size}$"):
        split_groups([sample(1)] * rows, group_size=group_size)


def test_pair_groups_pairs_consecutive_groups():
    x0, t0 = sample(0), sample(0, "negation")
    x1, t1 = sample("b"), sample("b", "identity")
    rows = [x0] * 3 + [t0] * 3 + [x1] * 3 + [t1] * 3
    assert pair_groups(rows) == [
        (slice(0, 3), slice(3, 6), "negation"),
        (slice(6, 9), slice(9, 12), "identity"),
    ]
    assert pair_groups([]) == []


def test_pair_groups_takes_the_groups_from_group_size():
    # The trainer's rows may hold copies of a prompt (distinct objects) or one object for a prompt and its twin.
    x, x_copy, twin, twin_copy = sample(1), sample(1), sample(1, "negation"), sample(1, "negation")
    assert pair_groups([x, x_copy, twin, twin_copy], group_size=2) == [(slice(0, 2), slice(2, 4), "negation")]
    both = sample(2, "identity")
    assert pair_groups([both] * 6, group_size=3) == [(slice(0, 3), slice(3, 6), "identity")]
    with pytest.raises(ValueError, match=r"unknown relation None .*\(rows 1:2 "):
        pair_groups([x, x_copy, twin, twin_copy])  # without it, four groups of one row: x_copy taken for x's twin


@pytest.mark.parametrize(
    "layout, message",
    [
        ("x x t t u u", r"3 groups.*rows 4:6.*unpaired"),
        ("x x u u", r"pair ids differ \(1 != 2\)"),
        ("x x t", r"same size, got 2 rows.*and 1"),
        ("n n t t", r"pair_id'\] is missing"),
    ],
    ids=["odd_number_of_groups", "different_pair_ids", "different_sizes", "missing_pair_id"],
)
def test_layout_errors_name_the_problem(layout, message):
    named = {"x": sample(1), "t": sample(1, "negation"), "u": sample(2, "identity"), "n": sample()}
    with pytest.raises(ValueError, match=message):
        pair_groups([named[key] for key in layout.split()])


@pytest.mark.parametrize("relation", [None, "opposite", "Negation"])
def test_unknown_or_missing_relation(relation):
    x, twin = sample(5), sample(5, relation)
    with pytest.raises(ValueError, match=r"unknown relation .* pair 5's twin"):
        pair_groups([x, x, twin, twin])


def test_layout_errors_name_the_rows_and_task_of_each_group():
    x = VisualSample(images=[], question="q", task="dots", meta={"pair_id": 1})
    twin = VisualSample(images=[], question="q", task="dots_twin", meta={"pair_id": 2, "relation": "identity"})
    with pytest.raises(ValueError, match=r"groups rows 0:2 \(task 'dots'\) and rows 2:4 \(task 'dots_twin'\) should"):
        pair_groups([x, x, twin, twin])
    # Any object with a ``meta`` dict groups; one without a ``task`` is described with '?'.
    untasked = SimpleNamespace(meta={"pair_id": 3})
    with pytest.raises(ValueError, match=r"the last one, rows 0:3 \(task '\?'\), is unpaired"):
        pair_groups([untasked] * 3)


def test_layout_error_messages_report_each_side_and_the_sizes():
    with pytest.raises(
        ValueError, match=r"Use a paired task \(e\.g\. dots_left_of_pairs\) so the collate function keeps"
    ):
        pair_groups([sample(1)] * 2)
    x, bare, twin = sample(1), sample(), sample(1, "identity")
    with pytest.raises(ValueError, match=r"meta\['pair_id'\] is missing \(1, None\)"):
        pair_groups([x, x, bare, bare])
    with pytest.raises(ValueError, match=r"meta\['pair_id'\] is missing \(None, 1\)"):
        pair_groups([bare, bare, twin, twin])
    # The second pair starts at row 4: its sizes are counted from there.
    x0, t0, x1, t1 = sample("a"), sample("a", "identity"), sample("b"), sample("b", "negation")
    with pytest.raises(ValueError, match=r"same size, got 3 rows for pair 'b''s original and 2 for its twin"):
        pair_groups([x0, x0, t0, t0, x1, x1, x1, t1, t1])
    with pytest.raises(
        ValueError, match=r"unknown relation 'opposite' in meta\['relation'\] of pair 'b''s twin \(rows 6:8"
    ):
        pair_groups([x0, x0, t0, t0, x1, x1] + [sample("b", "opposite")] * 2)


def test_samples_without_meta_have_no_pair_id():
    a, b = SimpleNamespace(task="t"), SimpleNamespace(task="t")
    with pytest.raises(ValueError, match=r"meta\['pair_id'\] is missing \(None, None\)"):
        pair_groups([a, a, b, b])

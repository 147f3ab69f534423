import math

import pytest
import torch

from app.algorithms import TokenTally


def test_parts_add_up_to_the_mean_over_all_their_tokens_per_group():
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0], [7.0, float("inf"), 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [1, 0, 1]])
    groups = ["a", "b", "a"]
    whole = TokenTally.of(values, mask, groups)
    parts = TokenTally.of(values[:1], mask[:1], groups[:1]) + TokenTally.of(values[1:], mask[1:], groups[1:])
    want = {"a": (1 + 2 + 7 + 9) / 4, "b": (4 + 6) / 2}
    for tally in (whole, parts):
        assert list(tally.means()) == ["a", "b"]
        assert {k: float(v) for k, v in tally.means().items()} == pytest.approx(want)
        assert float(tally.mean()) == pytest.approx((1 + 2 + 7 + 9 + 4 + 6) / 6)  # padding never leaks


def test_a_group_without_tokens_is_left_out_and_no_token_is_nan():
    tally = TokenTally.of(torch.ones(2, 3), torch.tensor([[0, 0, 0], [1, 1, 0]]), ["empty", "full"])
    assert list(tally.means()) == ["full"] and float(tally.means()["full"]) == 1.0
    assert math.isnan(float(TokenTally.of(torch.ones(1, 2), torch.zeros(1, 2), ["x"]).mean()))


def test_values_are_detached_and_shapes_must_line_up():
    values = torch.ones(2, 2, requires_grad=True)
    assert not TokenTally.of(values, torch.ones(2, 2), ["a", "a"]).sums["a"].requires_grad
    with pytest.raises(ValueError, match=r"must line up as \[n, L\], \[n, L\] and n"):
        TokenTally.of(values, torch.ones(2, 2), ["a"])

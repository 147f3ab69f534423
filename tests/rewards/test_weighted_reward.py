import random

import pytest
import torch

from app.rewards import AccuracyReward, FormatReward, RewardComponent, WeightedReward
from app.types import RewardOutput, VisualSample


class Constant(RewardComponent):
    def __init__(self, values, **kwargs):
        super().__init__(**kwargs)
        self.values = torch.as_tensor(values, dtype=torch.float32)

    def score(self, completions, samples):
        return self.values.clone()


def samples(n, answer="yes"):
    return [VisualSample(images=[], question="q", task="t", answer=answer)] * n


@pytest.mark.parametrize("seed", range(5))
def test_total_is_weighted_sum_random_weights(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 8)
    components = [
        Constant(
            torch.rand(n, generator=torch.Generator().manual_seed(seed * 10 + i)),
            weight=rng.uniform(-2, 2),
            name=f"c{i}",
        )
        for i in range(rng.randint(1, 4))
    ] + [FormatReward(weight=rng.uniform(0, 1)), AccuracyReward(weight=rng.uniform(0, 1))]
    choices = ["<think>a</think><answer>yes</answer>", "<answer>no</answer>", "junk"]
    completions = [rng.choice(choices) for _ in range(n)]
    out = WeightedReward(components)(completions, samples(n))

    assert isinstance(out, RewardOutput)
    manual = sum(c.weight * c.score(completions, samples(n)) for c in components)
    torch.testing.assert_close(out.total, manual)
    assert list(out.components) == [c.name for c in components]
    for c in components:
        torch.testing.assert_close(out.components[c.name], c.score(completions, samples(n)))  # unweighted
    assert out.total.shape == (n,) and out.total.dtype == torch.float32


def test_nonfinite_replaced_counted_and_warned():
    rewards = WeightedReward([Constant([float("nan"), 1.0, float("inf")], name="flaky", weight=2.0), FormatReward()])
    completions = ["<think>a</think><answer>b</answer>"] * 3
    with pytest.warns(RuntimeWarning, match=r"'flaky' returned 2 non-finite"):
        out = rewards(completions, samples(3))
    assert out.total.tolist() == [1.0, 3.0, 1.0]
    assert out.components["flaky"].tolist() == [0.0, 1.0, 0.0]
    assert out.num_nonfinite == 2 and rewards.num_nonfinite == 2
    assert WeightedReward([FormatReward()])(completions, samples(3)).num_nonfinite == 0  # a finite batch counts none
    with pytest.warns(RuntimeWarning):
        rewards(completions, samples(3))
    assert rewards.num_nonfinite == 4 and rewards.nonfinite_counts == {"flaky": 4, "format": 0}


def test_update_compute_reset():
    rewards = WeightedReward([FormatReward(), AccuracyReward(weight=3.0)])
    rewards.update(["<think>a</think><answer>yes</answer>", "<answer>yes</answer>"], samples(2))
    rewards.update(["<think>a</think><answer>no</answer>"], samples(1))
    result = rewards.compute()
    torch.testing.assert_close(result["format"], torch.tensor(2 / 3))
    torch.testing.assert_close(result["accuracy"], torch.tensor(2 / 3))
    rewards.reset()
    assert all(c.count.item() == 0 for c in rewards.components)


def test_accumulate_during_call_matches_update():
    completions = ["<think>a</think><answer>yes</answer>", "<answer>yes</answer>", "x"]
    a = WeightedReward([FormatReward(), AccuracyReward()])
    b = WeightedReward([FormatReward(), AccuracyReward()])
    a(completions, samples(3), accumulate=True)
    b.update(completions, samples(3))
    assert a.compute() == b.compute()


def test_weights_and_names():
    rewards = WeightedReward([FormatReward(weight=0.5), AccuracyReward()])
    assert rewards.names == ["format", "accuracy"]
    assert rewards.weights == {"format": 0.5, "accuracy": 1.0}


def test_duplicate_names_rejected():
    with pytest.raises(ValueError, match=r"duplicated: \['format'\]"):
        WeightedReward([FormatReward(), FormatReward(allowed_answers=["yes"])])
    WeightedReward([FormatReward(), FormatReward(allowed_answers=["yes"], name="format_yes_no")])


def test_empty_and_wrong_types_rejected():
    with pytest.raises(ValueError, match="at least one"):
        WeightedReward([])
    with pytest.raises(TypeError, match="RewardComponent"):
        WeightedReward([lambda c, s: torch.zeros(len(c))])


def test_wrong_shape_and_length_mismatch():
    with pytest.raises(ValueError, match=r"'c'.*shape \[2\]"):
        WeightedReward([Constant([1.0, 2.0, 3.0], name="c")])(["a", "b"], samples(2))
    with pytest.raises(ValueError, match="2 completions but 3 samples"):
        WeightedReward([FormatReward()])(["a", "b"], samples(3))


def test_components_are_submodules():
    rewards = WeightedReward([FormatReward(), AccuracyReward()])
    holder = torch.nn.Module()
    holder.rewards = rewards
    assert {type(m).__name__ for m in holder.modules()} >= {"FormatReward", "AccuracyReward"}


@pytest.mark.skipif(
    hasattr(WeightedReward.forward, "__wrapped__"), reason="forward is wrapped (mutation testing): extra stack frames"
)
def test_nonfinite_warning_points_at_the_caller_of_the_module():
    rewards = WeightedReward([Constant([float("nan")], name="flaky")])
    with pytest.warns(RuntimeWarning, match="'flaky' returned 1 non-finite") as record:
        rewards(["a"], samples(1))
    assert [w.filename for w in record] == [__file__]


def test_construction_errors_explain_the_fix():
    with pytest.raises(ValueError, match="^WeightedReward needs at least one reward component$"):
        WeightedReward([])
    with pytest.raises(TypeError, match="^reward components must be RewardComponent instances, got function$"):
        WeightedReward([FormatReward(), lambda c, s: torch.zeros(len(c))])
    with pytest.raises(ValueError, match=r"duplicated: \['format'\]\. Pass name=\.\.\. to tell them apart$"):
        WeightedReward([FormatReward(), FormatReward()])


def test_a_call_accumulates_only_when_asked_and_scores_once():
    class Counting(Constant):
        calls = 0

        def score(self, completions, samples):
            type(self).calls += 1
            return super().score(completions, samples)

    component = Counting([0.25, 0.75], name="counting")
    rewards = WeightedReward([component])
    rewards(["a", "b"], samples(2))
    assert component.count.item() == 0 and Counting.calls == 1  # scoring alone leaves the metric state alone
    rewards(["a", "b"], samples(2), accumulate=True)
    assert Counting.calls == 2  # the accumulated values are the ones just computed, not a second scoring
    assert (component.count.item(), component.total.item()) == (2, 1.0)


def test_total_is_float32_under_a_float64_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = WeightedReward([Constant([0.5, 1.0], name="c", weight=2.0)])(["a", "b"], samples(2))
    finally:
        torch.set_default_dtype(previous)
    assert out.total.dtype == torch.float32 and out.total.tolist() == [1.0, 2.0]

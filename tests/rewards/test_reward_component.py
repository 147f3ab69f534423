import warnings

import pytest
import torch

from app.rewards import AccuracyReward, FormatReward, RewardComponent, WeightedReward
from app.rewards.base import default_name
from app.types import VisualSample

SAMPLE = VisualSample(images=[], question="Is the cube red?", task="color", answer="yes")


def test_writing_and_composing_a_new_reward():
    """The README example: a new reward is a subclass with `score`, composed with weights."""

    class ShortReward(RewardComponent):  # name "short"
        def score(self, completions, samples):
            return torch.tensor([float(len(c) < 200) for c in completions])

    rewards = WeightedReward([FormatReward(), ShortReward(weight=0.5)])
    out = rewards(["<think>It is.</think><answer>yes</answer>", "x" * 300], [SAMPLE, SAMPLE])

    assert out.total.tolist() == [1.5, 0.0]
    assert out.components["short"].tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    ("class_name", "expected"),
    [
        ("FormatReward", "format"),
        ("AccuracyReward", "accuracy"),
        ("NumericToleranceReward", "numeric_tolerance"),
        ("OTConsistencyReward", "ot_consistency"),
        ("TriSRReward", "tri_sr"),
        ("Reward", "reward"),
        ("Length", "length"),
    ],
)
def test_default_name(class_name, expected):
    assert default_name(type(class_name, (), {})) == expected


def test_attributes_and_name_override():
    reward = FormatReward(weight=0.25, name="strict_format")
    assert (reward.name, reward.weight) == ("strict_format", 0.25)
    assert reward.higher_is_better is True and reward.full_state_update is False
    assert reward.is_differentiable is False
    assert reward.scope == "completion" and reward.value_range == (0.0, 1.0)
    with pytest.raises(ValueError, match="name"):
        FormatReward(name="")
    with pytest.raises(ValueError, match="weight"):
        FormatReward(weight=float("nan"))


def test_invalid_scope_rejected_at_class_definition():
    with pytest.raises(TypeError, match="scope"):

        class _Bad(RewardComponent):
            scope = "group"

            def score(self, completions, samples):
                return torch.zeros(len(completions))


def test_abstract_score():
    with pytest.raises(TypeError):
        RewardComponent()


def test_update_compute_accumulate_mean_of_scores():
    torch.manual_seed(0)
    batches = [torch.rand(n) for n in (3, 5, 1)]

    class Replay(RewardComponent):
        def __init__(self):
            super().__init__()
            self.queue = list(batches)

        def score(self, completions, samples):
            return self.queue.pop(0)

    reward = Replay()
    for values in batches:
        reward.update(["c"] * len(values), [SAMPLE] * len(values))
    expected = torch.cat(batches).mean()
    torch.testing.assert_close(reward.compute(), expected)
    reward.reset()
    assert reward.count.item() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics warns about compute before update
        assert reward.compute().item() == 0.0


def test_real_rewards_accumulate_score_mean():
    completions = [
        "<think>a</think><answer>yes</answer>",
        "<answer>yes</answer>",
        "<think>a</think><answer>no</answer>",
    ]
    samples = [SAMPLE] * 3
    for reward in (FormatReward(), AccuracyReward()):
        reward.update(completions, samples)
        reward.update(completions[:1], samples[:1])
        scores = torch.cat([reward.score(completions, samples), reward.score(completions[:1], samples[:1])])
        torch.testing.assert_close(reward.compute(), scores.mean())


def test_forward_returns_batch_mean_and_accumulates():
    reward = FormatReward()
    assert reward(["<think>a</think><answer>b</answer>", "b"], [SAMPLE, SAMPLE]).item() == 0.5
    assert reward(["<think>a</think><answer>b</answer>"], [SAMPLE]).item() == 1.0
    torch.testing.assert_close(reward.compute(), torch.tensor(2 / 3))


def test_length_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="2 completions but 1 samples"):
        FormatReward().update(["a", "b"], [SAMPLE])


def test_wrong_score_shape_is_an_error():
    class Bad(RewardComponent):
        def score(self, completions, samples):
            return torch.zeros(len(completions), 2)

    with pytest.raises(ValueError, match=r"'bad'.*shape \[3\]"):
        Bad().update(["a"] * 3, [SAMPLE] * 3)


def test_update_replaces_nonfinite_with_warning():
    class Nan(RewardComponent):
        def score(self, completions, samples):
            return torch.tensor([float("nan"), 1.0])

    reward = Nan()
    with pytest.warns(RuntimeWarning, match=r"'nan' returned 1 non-finite"):
        reward.update(["a", "b"], [SAMPLE, SAMPLE])
    assert reward.compute().item() == 0.5


def test_value_range_may_be_a_single_value_but_not_inverted():
    class Constant(RewardComponent):
        value_range = (1.0, 1.0)

        def score(self, completions, samples):
            return torch.ones(len(completions))

    assert Constant().value_range == (1.0, 1.0)
    with pytest.raises(
        TypeError, match=r"^_Inverted\.value_range must be \(low, high\) with low <= high, got \(1\.0, 0\.0\)"
    ):

        class _Inverted(RewardComponent):
            value_range = (1.0, 0.0)

            def score(self, completions, samples):
                return torch.zeros(len(completions))


def test_update_rejects_precomputed_scores_of_the_wrong_shape():
    reward = FormatReward()
    with pytest.raises(ValueError, match=r"'format': scores must have shape \[3\], got torch.Size\(\[2\]\)"):
        reward.update(["a"] * 3, [SAMPLE] * 3, scores=torch.zeros(2))
    assert reward.count.item() == 0


def test_update_accumulates_each_batch_sum_in_the_state_dtype():
    # A float64 batch sum is rounded to the float32 state before it is added: 1 + float32(2**-24 + 2**-50) is the
    # float32 tie 1 + 2**-24, which rounds to even (1.0); adding in float64 first would give 1 + 2**-23.
    reward = FormatReward()
    reward.update(["a"], [SAMPLE], scores=torch.tensor([1.0]))
    small = torch.tensor([2.0**-24 + 2.0**-50], dtype=torch.float64)
    reward.update(["a"], [SAMPLE], scores=small)
    expected = torch.tensor(1.0) + small.sum().float()
    assert reward.total.dtype == torch.float32
    assert reward.total.item() == expected.item() == 1.0
    assert reward.count.item() == 2


@pytest.mark.skipif(
    hasattr(RewardComponent.update, "__wrapped__"), reason="update is wrapped (mutation testing): extra stack frames"
)
def test_nonfinite_warning_points_at_the_caller_of_update():
    class Nan(RewardComponent):
        def score(self, completions, samples):
            return torch.tensor([float("nan")])

    with pytest.warns(RuntimeWarning, match="non-finite") as record:
        Nan().update(["a"], [SAMPLE])
    assert [w.filename for w in record] == [__file__]


def test_argument_and_length_errors_name_the_reward():
    with pytest.raises(ValueError, match=r"^FormatReward: weight must be finite, got nan$"):
        FormatReward(weight=float("nan"))
    with pytest.raises(ValueError, match=r"^FormatReward: name must be a non-empty string, got ' '$"):
        FormatReward(name=" ")
    with pytest.raises(
        ValueError,
        match=r"^reward 'format': got 2 completions but 1 samples; "
        r"pass one sample per completion \(repeat each prompt's sample K times\)$",
    ):
        FormatReward().checked_score(["a", "b"], [SAMPLE])


def test_checked_score_returns_float32_whatever_score_returns():
    class Double(RewardComponent):
        def score(self, completions, samples):
            return torch.tensor([0.1, float("inf")], dtype=torch.float64)

    values, num_nonfinite = Double().checked_score(["a", "b"], [SAMPLE, SAMPLE])
    assert values.dtype == torch.float32 and num_nonfinite == 1
    assert values.tolist() == [torch.tensor(0.1, dtype=torch.float32).item(), 0.0]

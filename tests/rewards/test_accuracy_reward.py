import pytest
import torch

from app.rewards import AccuracyReward
from app.rewards.functional import accuracy_reward
from app.types import VisualSample


def sample(answer, task="spatial"):
    return VisualSample(images=[], question="q", task=task, answer=answer)


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("<think>t</think><answer>yes</answer>", "yes", 1.0),
        ("<answer>YES</answer>", "yes", 1.0),
        ("<answer>  Yes. </answer>", "yes", 1.0),
        ("<answer>the  red\ncube</answer>", "The red cube", 1.0),
        ("<answer>(A)</answer>", "A", 1.0),
        ("<answer>a.</answer>", "(A)", 1.0),
        ("<answer>B)</answer>", "b", 1.0),
        ("<answer>3</answer>", "3", 1.0),
        ("<answer>no</answer>", "yes", 0.0),
        ("<answer>yes!!! no</answer>", "yes", 0.0),
        ("<answer>(A) cup</answer>", "A", 0.0),
        ("yes", "yes", 0.0),  # no answer block
        ("<answer>yes", "yes", 0.0),  # unclosed
        ("<answer></answer>", "", 0.0),  # empty never matches
        ("<answer>yes</answer><answer>no</answer>", "yes", 1.0),  # first block counts (format reward catches repeats)
    ],
)
def test_exact_match(completion, answer, expected):
    assert accuracy_reward([completion], [answer]).tolist() == [expected]
    assert AccuracyReward().score([completion], [sample(answer)]).tolist() == [expected]


def test_batch_shape_dtype_and_name():
    reward = AccuracyReward()
    out = reward.score(["<answer>a</answer>", "<answer>b</answer>", "x"], [sample("a"), sample("a"), sample("a")])
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 0.0, 0.0]
    assert reward.name == "accuracy"


def test_unlabeled_sample_error_names_task():
    reward = AccuracyReward()
    with pytest.raises(ValueError, match=r"labeled samples.*'counting'.*consistency reward"):
        reward.score(["<answer>3</answer>", "<answer>3</answer>"], [sample("3"), sample(None, task="counting")])
    with pytest.raises(ValueError, match="label"):
        accuracy_reward(["<answer>3</answer>"], [None])


def test_length_mismatch():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        accuracy_reward(["a", "b"], ["a"])


def test_missing_label_errors_name_the_reward_and_the_function():
    with pytest.raises(ValueError, match=r"^AccuracyReward \('exact'\) needs labeled samples, but a sample of task 'c"):
        AccuracyReward(name="exact").score(["<answer>3</answer>"], [sample(None, task="counting")])
    with pytest.raises(ValueError, match=r"^accuracy_reward needs a label for every completion; answers\[1\] is None"):
        accuracy_reward(["<answer>3</answer>"] * 2, ["3", None])


@pytest.mark.parametrize("answer", ["", " ", ".", "?!"])
def test_a_label_that_normalises_to_nothing_matches_nothing(answer):
    completions = ["<answer>yes</answer>", "<answer>0</answer>", "<answer>A</answer>", f"<answer>{answer}</answer>"]
    assert accuracy_reward(completions, [answer] * 4).tolist() == [0.0] * 4


def test_scores_are_float32_under_a_float64_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = accuracy_reward(["<answer>a</answer>", "<answer>b</answer>"], ["a", "a"])
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 0.0]

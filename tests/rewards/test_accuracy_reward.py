import pytest
import torch

from app.rewards import AccuracyReward
from app.rewards.accuracy import parsed_answer_scores
from app.rewards.function_sequence import function_sequence_reward
from app.rewards.functional import accuracy_reward
from app.rewards.numeric import numeric_tolerance_reward
from app.rewards.parsing import parse_number
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


def test_parsed_answer_scores_parses_the_label_and_the_answer_block_with_one_parser():
    def halves(pred: float, gt: float) -> float:
        return pred / gt

    completions = ["<answer>3</answer>", "<answer>three</answer>", "3", "<answer>3", None]
    out = parsed_answer_scores("halves", completions, ["6"] * 5, parse_number, halves, "a number")
    assert out.dtype == torch.float32 and out.tolist() == [0.5, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"^answers\[1\] = 'six' is not a number$"):
        parsed_answer_scores("halves", ["no block"] * 2, ["6", "six"], parse_number, halves, "a number")
    with pytest.raises(ValueError, match=r"^halves needs a label for every completion; answers\[0\] is None$"):
        parsed_answer_scores("halves", ["<answer>3</answer>"], [None], parse_number, halves, "a number")


GT_STEPS = "change_color(obj_1, red), change_size(obj_2, small)"
UNREADABLE = [
    None,
    7,
    b"<answer>7</answer>",
    "<answer></answer>",
    "<answer>7",
    "7",
    "<answer>" + "1" * 200_000 + "</answer>",
]


@pytest.mark.parametrize("completion", UNREADABLE)
def test_the_parsed_answer_rewards_score_the_same_unreadable_completion_zero(completion):
    assert numeric_tolerance_reward([completion], ["7"]).tolist() == [0.0]
    for alpha, beta in [(0.5, 0.25), (-0.25, -0.5)]:  # a penalty for near misses is not one for no answer
        assert function_sequence_reward([completion], [GT_STEPS], alpha, beta).tolist() == [0.0]


def test_the_parsed_answer_rewards_check_every_label_before_reading_any_completion():
    with pytest.raises(ValueError, match=r"^answers\[1\] = 'x' is not a number parse_number understands$"):
        numeric_tolerance_reward(["no block"] * 2, ["7", "x"])
    with pytest.raises(ValueError, match=r"^answers\[1\] = 'x' is not a step list such as 'change_color\(obj_1, red"):
        function_sequence_reward(["no block"] * 2, [GT_STEPS, "x"])

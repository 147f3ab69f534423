"""FunctionSequenceReward against docs/algorithms.md: paper settings, one-to-one pairing, duplicates, order."""

import itertools
import random

import pytest
import torch

from app.rewards.function_sequence import (
    FunctionSequenceReward,
    function_sequence_reward,
    sequence_score,
    step_match_counts,
)
from app.rewards.parsing import FunctionStep, parse_steps
from app.types import VisualSample

PAPER_SETTINGS = [(0.0, 0.0), (0.5, 0.25), (-0.25, -0.5)]
GT = "change_color(obj_1, red), change_size(obj_2, small), change_shape(obj_3, cube)"


def wrap(steps):
    return f"<think>t</think><answer>{steps}</answer>"


def sample(answer):
    return VisualSample(images=[], question="What changed?", task="transformation", answer=answer)


def brute_force(pred, gt, alpha, beta):
    """Independent reference: try every one-to-one pairing, keep the best (#full, #partial, #function-only)."""

    def level(p, g):
        if p.function != g.function:
            return 0
        return 3 if (p.obj, p.value) == (g.obj, g.value) else 2 if p.obj == g.obj or p.value == g.value else 1

    best = (0, 0, 0)
    slots = list(range(len(gt))) + [None] * len(pred)
    for choice in set(itertools.permutations(slots, len(pred))):
        counts = [0, 0, 0, 0]
        for i, j in enumerate(choice):
            if j is not None:
                counts[level(pred[i], gt[j])] += 1
        best = max(best, (counts[3], counts[2], counts[1]))
    n = max(len(pred), len(gt))
    return (best[0] + alpha * best[1] + beta * best[2]) / n if n else 0.0


# (prediction, expected score under each paper setting); gt = color(1, red), size(2, small), shape(3, cube)
TABLE = [
    (GT, (1.0, 1.0, 1.0)),
    ("change_shape(obj_3, cube); change_color(obj_1, red); change_size(obj_2, small)", (1.0, 1.0, 1.0)),  # reordered
    ("change_color(obj_1, red), change_size(obj_2, small)", (2 / 3, 2 / 3, 2 / 3)),  # one step missing
    ("change_color(obj_1, blue), change_size(obj_2, small), change_shape(obj_3, cube)", (2 / 3, 2.5 / 3, 1.75 / 3)),
    ("change_color(obj_9, red), change_size(obj_2, small), change_shape(obj_3, cube)", (2 / 3, 2.5 / 3, 1.75 / 3)),
    ("change_color(obj_9, blue), change_size(obj_2, small), change_shape(obj_3, cube)", (2 / 3, 2.25 / 3, 1.5 / 3)),
    ("change_material(obj_1, red), change_size(obj_2, small), change_shape(obj_3, cube)", (2 / 3, 2 / 3, 2 / 3)),
    (GT + ", change_position(obj_4, front)", (3 / 4, 3 / 4, 3 / 4)),  # an extra step
    ("change_color(obj_2, small)", (0.0, 0.25 / 3, -0.5 / 3)),  # right function only
    ("change_material(obj_1, metal)", (0.0, 0.0, 0.0)),
]


@pytest.mark.parametrize(("pred", "expected"), TABLE, ids=range(len(TABLE)))
def test_paper_settings(pred, expected):
    for (alpha, beta), value in zip(PAPER_SETTINGS, expected, strict=True):
        out = function_sequence_reward([wrap(pred)], [GT], alpha=alpha, beta=beta)
        assert out.item() == pytest.approx(value, abs=1e-6), (alpha, beta)


def test_duplicates_count_once_and_fill_the_denominator():
    a = "change_color(obj_1, red)"
    b = "change_color(obj_2, blue)"
    assert function_sequence_reward([wrap(f"{a}, {a}")], [a]).item() == pytest.approx(0.5)
    assert function_sequence_reward([wrap(f"{a}, {a}")], [f"{a}, {a}"]).item() == pytest.approx(1.0)
    assert function_sequence_reward([wrap(a)], [f"{a}, {a}"]).item() == pytest.approx(0.5)
    # the copy pairs with the other label step as a function-only match (obj_1 != obj_2, red != blue)
    for alpha, beta in PAPER_SETTINGS:
        out = function_sequence_reward([wrap(f"{a}, {a}")], [f"{a}, {b}"], alpha=alpha, beta=beta)
        assert out.item() == pytest.approx((1 + beta) / 2)
    # ten copies of one right step against a three-step label
    assert function_sequence_reward([wrap(", ".join([a] * 10))], [GT], 0.0, 0.0).item() == pytest.approx(0.1)


def test_order_is_ignored_unless_ordered():
    pred = "change_size(obj_2, small), change_shape(obj_3, cube), change_color(obj_1, red)"
    assert function_sequence_reward([wrap(pred)], [GT]).item() == 1.0
    assert function_sequence_reward([wrap(pred)], [GT], ordered=True).item() == 0.0
    assert function_sequence_reward([wrap(GT)], [GT], ordered=True).item() == 1.0
    shifted = "change_color(obj_1, red), change_shape(obj_3, cube)"  # second step compared with change_size
    assert function_sequence_reward([wrap(shifted)], [GT], ordered=True).item() == pytest.approx(1 / 3)
    reward = FunctionSequenceReward(ordered=True)
    assert reward.score([wrap(pred)], [sample(GT)]).item() == 0.0


def test_matching_prefers_full_matches_then_partial():
    # A greedy pairing that took (pred0, gt0) first as function-only would lose the full match pred0-gt1.
    gt = [FunctionStep("change_color", "1", "red"), FunctionStep("change_color", "2", "blue")]
    pred = [FunctionStep("change_color", "2", "blue"), FunctionStep("change_color", "1", "green")]
    assert step_match_counts(pred, gt) == (1, 1, 0)
    assert sequence_score(pred, gt, alpha=-0.25, beta=-0.5) == pytest.approx((1 - 0.25) / 2)
    # the pairing does not depend on alpha, beta: a near miss is still paired (and penalised) when alpha < 0
    assert step_match_counts([pred[1]], gt) == (0, 1, 0)
    assert sequence_score([pred[1]], gt, alpha=-0.25, beta=-0.5) == pytest.approx(-0.25 / 2)


def random_steps(rng, n):
    return [
        FunctionStep(rng.choice(["change_color", "change_size", "change_shape"]), rng.choice("123"), rng.choice("xyz"))
        for _ in range(n)
    ]


def test_fresh_random_sequences_match_brute_force(random_seed):  # fresh values: another APP_TEST_SEED
    seed = random_seed
    rng = random.Random(seed)
    for _ in range(300):
        pred, gt = random_steps(rng, rng.randint(1, 5)), random_steps(rng, rng.randint(1, 5))
        alpha, beta = rng.choice(PAPER_SETTINGS + [(rng.uniform(-1, 1), rng.uniform(-1, 1))])
        text = ", ".join(f"{s.function}({s.obj}, {s.value})" for s in pred)
        label = "; ".join(f"{s.function}({s.obj}, {s.value})" for s in gt)
        got = function_sequence_reward([wrap(text)], [label], alpha=alpha, beta=beta).item()
        assert got == pytest.approx(brute_force(pred, gt, alpha, beta), abs=1e-6), f"seed {seed}: {text} | {label}"
        assert min(alpha, beta, 0.0) - 1e-6 <= got <= 1.0 + 1e-6


def test_max_size_sequences_are_fast_and_exact(random_seed):
    rng = random.Random(random_seed)
    pred, gt = random_steps(rng, 64), random_steps(rng, 64)
    assert sequence_score(gt, gt) == 1.0
    score = sequence_score(pred, gt, 0.5, 0.25)
    assert 0.0 <= score <= 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "change_color(obj_1, red)",  # no answer block
        wrap("change_color(obj_1)"),
        wrap("change_colour(obj_1, red)"),
        wrap("paint obj_1 red"),
        wrap(""),
        wrap("__import__('os').system('touch PWNED')"),
        "<answer>change_color(obj_1, red)",
    ],
)
def test_malformed_predictions_score_no_match(completion):
    for alpha, beta in PAPER_SETTINGS:
        assert function_sequence_reward([completion], [GT], alpha, beta).tolist() == [0.0]


def test_value_range_follows_alpha_beta():
    assert FunctionSequenceReward().value_range == (0.0, 1.0)
    assert FunctionSequenceReward(alpha=-0.25, beta=-0.5).value_range == (-0.5, 1.0)
    assert FunctionSequenceReward(alpha=-0.25, beta=0.1).value_range == (-0.25, 1.0)
    assert FunctionSequenceReward.value_range == (-1.0, 1.0)
    for alpha, beta in [(1.5, 0), (0, -2), (float("nan"), 0)]:
        with pytest.raises(ValueError, match="must be in"):
            FunctionSequenceReward(alpha=alpha, beta=beta)
        with pytest.raises(ValueError, match="must be in"):
            function_sequence_reward([wrap(GT)], [GT], alpha, beta)


def test_class_matches_functional_and_labels_are_checked():
    reward = FunctionSequenceReward(alpha=-0.25, beta=-0.5, weight=2.0)
    assert reward.name == "function_sequence" and reward.weight == 2.0
    preds = [wrap(p) for p, _ in TABLE] + ["junk"]
    torch.testing.assert_close(
        reward.score(preds, [sample(GT)] * len(preds)), function_sequence_reward(preds, [GT] * len(preds), -0.25, -0.5)
    )
    with pytest.raises(ValueError, match="labeled samples"):
        reward.score([wrap(GT)], [sample(None)])
    with pytest.raises(ValueError, match="not a step list"):
        function_sequence_reward([wrap(GT)], ["red cube"])
    with pytest.raises(ValueError, match="1 completions but 2 answers"):
        function_sequence_reward([wrap(GT)], [GT, GT])


def test_parsed_label_round_trip():
    assert [s.function for s in parse_steps(GT)] == ["change_color", "change_size", "change_shape"]


def test_an_empty_side_has_no_matches():
    gt = parse_steps(GT)
    for ordered in (False, True):
        assert step_match_counts([], gt, ordered) == (0, 0, 0)
        assert step_match_counts(gt, [], ordered) == (0, 0, 0)
        assert sequence_score([], gt, ordered=ordered) == 0.0
        assert sequence_score([], [], ordered=ordered) == 0.0


def test_matching_keeps_two_full_matches_over_more_partial_ones():
    # Pairing by the sum of match levels could trade a full match for partial ones (1 full + 2 partial = 7 = 2 full
    # + 1 function-only); the lexicographic pairing keeps both full matches.
    pred = [FunctionStep("change_color", obj, value) for obj, value in (("1", "x"), ("1", "y"), ("2", "y"))]
    gt = [FunctionStep("change_color", obj, value) for obj, value in (("1", "y"), ("2", "y"), ("2", "y"))]
    assert step_match_counts(pred, gt) == (2, 0, 1)
    assert step_match_counts(gt, pred) == (2, 0, 1)


def test_default_credits_are_a_half_and_a_quarter():
    gt = parse_steps("change_color(obj_1, red), change_size(obj_2, small)")
    pred = parse_steps("change_color(obj_1, blue), change_size(obj_3, large)")  # one partial, one function-only
    assert step_match_counts(pred, gt) == (0, 1, 1)
    assert sequence_score(pred, gt) == pytest.approx((0.5 + 0.25) / 2)
    reward = FunctionSequenceReward()
    assert (reward.alpha, reward.beta, reward.ordered, reward.name, reward.weight) == (
        0.5,
        0.25,
        False,
        "function_sequence",
        1.0,
    )
    custom = FunctionSequenceReward(name="steps", dist_sync_on_step=True)
    assert (custom.name, custom.weight, custom.dist_sync_on_step) == ("steps", 1.0, True)


def test_credits_may_reach_the_bounds_and_errors_name_the_bad_one():
    reward = FunctionSequenceReward(alpha=-1.0, beta=1.0)
    assert (reward.alpha, reward.beta, reward.value_range) == (-1.0, 1.0, (-1.0, 1.0))
    with pytest.raises(
        ValueError, match=r"^alpha must be in \[-1, 1\] \(a partial match counts at most a full one\), "
    ):
        FunctionSequenceReward(alpha=1.5)
    with pytest.raises(ValueError, match=r"^beta must be in \[-1, 1\] .*, got -2.0$"):
        FunctionSequenceReward(beta=-2)


def test_label_errors_name_the_function_and_the_row():
    with pytest.raises(ValueError, match=r"^function_sequence_reward needs a label for every completion; answers\[1\]"):
        function_sequence_reward([wrap(GT)] * 2, [GT, None])
    with pytest.raises(ValueError, match=r"^answers\[1\] = 'red cube' is not a step list"):
        function_sequence_reward([wrap(GT)] * 2, [GT, "red cube"])
    long_label = "red cube " + "x" * 100  # the message quotes the label's first 80 characters
    with pytest.raises(ValueError, match=r"^answers\[0\] = 'red cube x{71}' is not a step list"):
        function_sequence_reward([wrap(GT)], [long_label])


def test_scores_are_float32_under_a_float64_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = function_sequence_reward([wrap(GT), "no block"], [GT, GT])
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 0.0]

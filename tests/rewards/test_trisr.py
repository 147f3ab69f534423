"""TriSR rewards against the docs/algorithms.md formulas (independent reference computations on fresh random triplets),
hand-worked triplets, the evaluation metrics, and untrusted completions."""

import itertools
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reward_contract import assert_well_behaved

from app.rewards import FormatReward, WeightedReward
from app.rewards.trisr import (
    AttributeGroundingReward,
    JudgmentAlignmentReward,
    TripletConsistencyReward,
    TripletOverallAccuracy,
    TripletPartialAccuracy,
    TripletTaskReward,
    TriSRReward,
)
from app.rewards.trisr_scores import (
    attribute_grounding_reward,
    judgment_alignment_reward,
    tri_sr_reward,
    tri_sr_value_range,
    triplet_consistency_reward,
    triplet_overall_accuracy,
    triplet_partial_accuracy,
    triplet_task_reward,
)
from app.types import VisualSample

PAIRS = ("1-2", "1-3", "2-3")
EPS = 1e-6


def sample(attributes=(7, 4, 2), pair_answers=None, answer_type=None, task="count"):
    meta = {}
    if attributes is not None:
        meta["attributes"] = list(attributes)
    if pair_answers is not None:
        meta["pair_answers"] = dict(pair_answers)
    if answer_type is not None:
        meta["answer_type"] = answer_type
    return VisualSample(images=[], question="q", task=task, meta=meta)


def response(attributes=(None, None, None), judgments=None, answers=None) -> str:
    lines = [f"Image {k}: {v}" for k, v in enumerate(attributes, start=1) if v is not None]
    lines += [f"Compare {p}: {v}" for p, v in (judgments or {}).items() if v is not None]
    answer = "; ".join(f"{p}: {v}" for p, v in (answers or {}).items() if v is not None)
    return "<think>\n" + "\n".join(lines) + "\n</think>\n<answer>" + answer + "</answer>"


# ------------------------------------------------------------------------------------------ reference (independent)
def spell_sign(rng, pair, sign):
    """A random spelling of an ordinal answer with sign ``sign`` (None: garbage or missing)."""
    i, j = pair[0], pair[2]
    letters = {"1": "A", "2": "B", "3": "C"}
    if sign is None:
        return rng.choice([None, "maybe", "4", "Image 0", next(k for k in "123" if k not in pair)])
    if sign == 0:
        return rng.choice(["same", "Same.", "equal", "tie", "="])
    winner = i if sign == 1 else j
    return rng.choice(
        [
            winner,
            f"Image {winner}",
            f"image {winner}.",
            letters[winner],
            f"({letters[winner]})",
            "first" if sign == 1 else "second",
            ">" if sign == 1 else "<",
        ]
    )


def ref_implied_s13(s12, s23):
    """The s13 values possible for real v1, v2, v3 with these signs (brute force over a grid): implied iff one."""
    possible = set()
    for v1, v2, v3 in itertools.product(range(4), repeat=3):
        sign = lambda a, b: (a > b) - (a < b)  # noqa: E731
        if sign(v1, v2) == s12 and sign(v2, v3) == s23:
            possible.add(sign(v1, v3))
    return possible.pop() if len(possible) == 1 else None


def ref_tc_ordinal(s):
    if any(s[p] is None for p in PAIRS):
        return 0.0
    implied = ref_implied_s13(s["1-2"], s["2-3"])
    if implied is None:
        return 0.0
    return 1.0 if s["1-3"] == implied else -1.0


def ref_ag(estimates, targets, eps=EPS):
    return (
        sum(
            0.0 if e is None else math.exp(-abs(e - v) / max(abs(v), eps))
            for e, v in zip(estimates, targets, strict=True)
        )
        / 3
    )


def ref_ja(judged, answered, truth):
    return sum(
        (judged[p] is not None and judged[p] == truth[p]) + (judged[p] is not None and judged[p] == answered[p])
        for p in PAIRS
    ) / (2 * len(PAIRS))


def ref_task(answered, truth):
    return sum(answered[p] is not None and answered[p] == truth[p] for p in PAIRS) / len(PAIRS)


def random_triplet(rng):
    """A random ordinal triplet: truth from attributes, and a response with random (partly wrong, missing) parts."""
    targets = [rng.choice([0, rng.randint(1, 20), round(rng.uniform(-50, 50), 3)]) for _ in range(3)]
    sign = lambda a, b: (a > b) - (a < b)  # noqa: E731
    truth = {p: sign(targets[int(p[0]) - 1], targets[int(p[2]) - 1]) for p in PAIRS}
    estimates = [rng.choice([None, t, t + rng.uniform(-5, 5), round(rng.uniform(-100, 100), 2)]) for t in targets]
    signs = [-1, 0, 1, None]
    answered = {p: rng.choice([truth[p], *signs]) for p in PAIRS}
    judged = {p: rng.choice([truth[p], answered[p], *signs]) for p in PAIRS}
    text = response(
        [None if e is None else repr(float(e)) for e in estimates],
        {p: spell_sign(rng, p, judged[p]) for p in PAIRS},
        {p: spell_sign(rng, p, answered[p]) for p in PAIRS},
    )
    # what was actually written (a garbage spelling is None, like a missing one)
    truth_text = {p: {1: p[0], -1: p[2], 0: "same"}[truth[p]] for p in PAIRS}
    return text, targets, truth, truth_text, estimates, judged, answered


@pytest.mark.parametrize("seed", range(300))
def test_rewards_match_the_reference_formulas_on_random_triplets(seed):
    rng = random.Random(seed)
    text, targets, truth, truth_text, estimates, judged, answered = random_triplet(rng)
    weights = dict(ag_weight=rng.uniform(-1, 1), ja_weight=rng.uniform(-1, 1), tc_weight=rng.uniform(-1, 1))
    ag, ja = ref_ag(estimates, targets), ref_ja(judged, answered, truth)
    tc, task = ref_tc_ordinal(answered), ref_task(answered, truth)
    total = task + weights["ag_weight"] * ag + weights["ja_weight"] * ja + weights["tc_weight"] * tc

    s = sample(targets, truth_text)
    for reward, fn, expected in [
        (AttributeGroundingReward(), lambda: attribute_grounding_reward([text], [targets]), ag),
        (JudgmentAlignmentReward(), lambda: judgment_alignment_reward([text], [truth_text]), ja),
        (TripletConsistencyReward(), lambda: triplet_consistency_reward([text]), tc),
        (TripletTaskReward(), lambda: triplet_task_reward([text], [truth_text]), task),
        (TripletPartialAccuracy(), lambda: triplet_partial_accuracy([text], [truth_text]), task),
        (TripletOverallAccuracy(), lambda: triplet_overall_accuracy([text], [truth_text]), float(task == 1)),
        (TriSRReward(**weights), lambda: tri_sr_reward([text], [targets], [truth_text], **weights), total),
    ]:
        value = reward.score([text], [s])
        assert value.dtype == torch.float32 and value.shape == (1,)
        assert value.item() == pytest.approx(expected, abs=1e-5), (reward.name, text)
        assert fn().item() == pytest.approx(expected, abs=1e-5), reward.name
        low, high = reward.value_range  # the unclamped reference is inside the range: the clamp hides nothing
        assert low - 1e-9 <= expected <= high + 1e-9, (reward.name, expected)


def test_reference_implication_table():
    """The docs/algorithms.md rule, spelled out: same sign, or one 0 and the other decides; opposite signs imply
    nothing."""
    for s12, s23 in itertools.product((-1, 0, 1), repeat=2):
        rule = None if s12 * s23 < 0 else (s12 if s23 == 0 else s23)
        assert ref_implied_s13(s12, s23) == rule


# ------------------------------------------------------------------------------------------ hand-worked triplets
TRUTH = {"1-2": "1", "1-3": "1", "2-3": "2"}  # counts 7 > 4 > 2


@pytest.mark.parametrize(
    "answers, expected",
    [
        ("1-2: 1; 1-3: 1; 2-3: 2", 1.0),  # 1 > 2 > 3, 1 > 3: consistent
        ("1-2: 1; 1-3: 3; 2-3: 2", -1.0),  # 1 > 2 > 3, 3 > 1: contradiction
        ("1-2: 2; 1-3: 1; 2-3: 3", -1.0),  # 2 > 1, 3 > 2 imply 3 > 1; says 1 > 3
        ("1-2: 2; 1-3: 3; 2-3: 3", 1.0),
        ("1-2: 1; 1-3: 1; 2-3: 3", 0.0),  # 1 > 2 < 3: nothing implied
        ("1-2: 2; 1-3: 1; 2-3: 2", 0.0),  # 2 > 1, 2 > 3: nothing implied
        ("1-2: same; 1-3: 1; 2-3: 2", 1.0),  # 1 = 2 > 3 implies 1 > 3
        ("1-2: same; 1-3: same; 2-3: 2", -1.0),
        ("1-2: 1; 1-3: 1; 2-3: same", 1.0),  # 1 > 2 = 3 implies 1 > 3
        ("1-2: 1; 1-3: 3; 2-3: same", -1.0),
        ("1-2: same; 1-3: same; 2-3: same", 1.0),  # all equal: consistent
        ("1-2: same; 1-3: 1; 2-3: same", -1.0),  # 1 = 2 = 3 but 1 > 3
        ("1-2: 1; 2-3: 2", 0.0),  # s13 missing
        ("1-2: 1; 1-3: 1", 0.0),  # s23 missing
        ("1-2: 3; 1-3: 1; 2-3: 2", 0.0),  # s12 unreadable (image 3 is not in the pair)
        ("1-2: first; 1-3: A; 2-3: Image 2", 1.0),  # other spellings
        ("1-2: >; 1-3: <; 2-3: >", -1.0),
    ],
)
def test_triplet_consistency_hand_worked(answers, expected):
    text = f"<think>x</think><answer>{answers}</answer>"
    assert triplet_consistency_reward([text]).item() == expected
    assert TripletConsistencyReward().score([text], [sample(None, None)]).item() == expected


def test_consistency_is_label_free_and_ignores_the_truth():
    unlabeled = VisualSample(images=[], question="q", task="t")
    texts = ["<answer>1-2: 1; 1-3: 3; 2-3: 2</answer>", "<answer>1-2: 1; 1-3: 1; 2-3: 2</answer>"]
    assert TripletConsistencyReward().score(texts, [unlabeled] * 2).tolist() == [-1.0, 1.0]


def test_hand_worked_total():
    """Counts (7, 4, 2), truth 1-2: 1, 1-3: 1, 2-3: 2."""
    text = response(
        attributes=(7, 5, "two"),  # exact, |5-4|/4 off, unreadable
        judgments={"1-2": "1", "1-3": "3", "2-3": "2"},  # right+agrees, wrong+disagrees, right+disagrees
        answers={"1-2": "1", "1-3": "1", "2-3": "3"},  # right, right, wrong; 1 > 2 < 3: nothing implied
    )
    s = sample((7, 4, 2), TRUTH)
    ag = (1 + math.exp(-0.25) + 0) / 3
    ja = (2 + 0 + 1) / 6
    task = 2 / 3
    assert AttributeGroundingReward().score([text], [s]).item() == pytest.approx(ag, abs=1e-6)
    assert JudgmentAlignmentReward().score([text], [s]).item() == pytest.approx(ja, abs=1e-6)
    assert TripletTaskReward().score([text], [s]).item() == pytest.approx(task, abs=1e-6)
    assert TripletConsistencyReward().score([text], [s]).item() == 0.0
    assert TriSRReward().score([text], [s]).item() == pytest.approx(task + 0.2 * ag + 0.2 * ja, abs=1e-6)


def test_perfect_and_empty_responses_hit_the_ends_of_the_range():
    perfect = response((7, 4, 2), TRUTH, TRUTH)
    contradicting = response((None, None, None), None, {"1-2": "2", "1-3": "1", "2-3": "3"})  # 2>1, 3>2 but 1>3
    s = sample((7, 4, 2), TRUTH)
    reward = TriSRReward()
    assert reward.value_range == (-0.3, 1.7)
    perfect_value, empty_value, contradiction_value = reward.score([perfect, "", contradicting], [s] * 3).tolist()
    assert perfect_value == pytest.approx(1.7) and perfect_value <= 1.7
    assert empty_value == 0.0
    # 1-3 right (1/3), nothing else; R_tc = -1
    assert contradiction_value == pytest.approx(1 / 3 - 0.3, abs=1e-6)


def test_missing_estimates_score_zero_and_zero_targets_use_eps():
    s = sample((0, 10, -4), TRUTH)
    text = "<think>Image 1: 0\nImage 2: 10\nImage 3: -4</think>"
    assert AttributeGroundingReward().score([text], [s]).item() == pytest.approx(1.0)
    off = "<think>Image 1: 0.5\nImage 3: -2</think>"  # |0.5 - 0| / eps is huge: exp(-5e5) = 0
    assert AttributeGroundingReward().score([off], [s]).item() == pytest.approx(math.exp(-0.5) / 3, abs=1e-6)
    assert AttributeGroundingReward(eps=1.0).score([off], [s]).item() == pytest.approx(
        (math.exp(-0.5) + math.exp(-0.5)) / 3, abs=1e-6
    )


def test_ties_in_the_ground_truth():
    truth = {"1-2": "same", "1-3": "1", "2-3": "2"}  # counts (5, 5, 2)
    s = sample((5, 5, 2), truth)
    text = response((5, 5, 2), {"1-2": "equal", "1-3": "1", "2-3": "2"}, {"1-2": "tie", "1-3": "A", "2-3": "B"})
    assert TriSRReward().score([text], [s]).item() == pytest.approx(1.7)
    assert TripletTaskReward().score([response(answers={"1-2": "1", "1-3": "1", "2-3": "2"})], [s]).item() == (
        pytest.approx(2 / 3)
    )


# ------------------------------------------------------------------------------------------ interval answers
INTERVAL_TRUTH = {"1-2": "[2, 4]", "1-3": "[5, 7]", "2-3": "[1, 3]"}  # v1 - v2, v1 - v3, v2 - v3


@pytest.mark.parametrize(
    "answers, tolerance, expected",
    [
        ("1-2: [2, 4]; 1-3: [5, 7]; 2-3: [1, 3]", 0.0, 1.0),  # [3, 7] overlaps [5, 7]
        ("1-2: 3; 1-3: 5; 2-3: 2", 0.0, 1.0),  # exact values: 3 + 2 = 5
        ("1-2: 3; 1-3: 6; 2-3: 2", 0.0, -1.0),  # 3 + 2 != 6
        ("1-2: 3; 1-3: 6; 2-3: 2", 1.0, 1.0),  # ... within the quantisation tolerance
        ("1-2: 3 to 4; 1-3: 8 to 9; 2-3: 1..2", 0.0, -1.0),  # [4, 6] vs [8, 9]
        ("1-2: 3 to 4; 1-3: 8 to 9; 2-3: 1..2", 2.0, 1.0),
        ("1-2: (-4, -2); 1-3: [-1, 0]; 2-3: [1, 3]", 0.0, 1.0),  # [-3, 1] overlaps [-1, 0]
        ("1-2: [4, 2]; 1-3: 5; 2-3: 2", 0.0, 0.0),  # reversed range is unreadable: nothing checked
        ("1-2: 3; 2-3: 2", 0.0, 0.0),  # missing
        ("1-2: three; 1-3: 5; 2-3: 2", 0.0, 0.0),
    ],
)
def test_interval_consistency(answers, tolerance, expected):
    text = f"<answer>{answers}</answer>"
    assert triplet_consistency_reward([text], "interval", interval_tolerance=tolerance).item() == expected
    s = sample(None, None, answer_type="interval")
    assert TripletConsistencyReward(interval_tolerance=tolerance).score([text], [s]).item() == expected


@pytest.mark.parametrize("seed", range(100))
def test_interval_consistency_matches_a_brute_force_reference(seed):
    """Integer ranges: consistent iff some d12 in D12, d23 in D23 have d12 + d23 within D13 widened by tol."""
    rng = random.Random(seed)
    ranges = {}
    for p in PAIRS:
        lo = rng.randint(-6, 6)
        ranges[p] = (lo, lo + rng.randint(0, 3))
    tol = rng.randint(0, 2)
    lo13, hi13 = ranges["1-3"]
    ok = any(
        lo13 - tol <= d12 + d23 <= hi13 + tol
        for d12 in range(ranges["1-2"][0], ranges["1-2"][1] + 1)
        for d23 in range(ranges["2-3"][0], ranges["2-3"][1] + 1)
    )
    text = "<answer>" + "; ".join(f"{p}: [{lo}, {hi}]" for p, (lo, hi) in ranges.items()) + "</answer>"
    assert triplet_consistency_reward([text], "interval", tol).item() == (1.0 if ok else -1.0)


def test_interval_task_and_alignment_compare_ranges_not_spellings():
    s = sample((9, 6, 3), INTERVAL_TRUTH, answer_type="interval")
    text = response(
        judgments={"1-2": "2 to 4", "1-3": "[5,7]", "2-3": "[0, 3]"},
        answers={"1-2": "(2, 4)", "1-3": "5..7", "2-3": "[0, 3]"},
    )
    assert TripletTaskReward().score([text], [s]).item() == pytest.approx(2 / 3)
    assert JudgmentAlignmentReward().score([text], [s]).item() == pytest.approx((2 + 2 + 1) / 6)
    # ground truth may come from JSON as [lo, hi] lists
    s2 = sample((9, 6, 3), {p: [int(v[1]), int(v[-2])] for p, v in INTERVAL_TRUTH.items()}, answer_type="interval")
    assert TripletTaskReward().score([text], [s2]).item() == pytest.approx(2 / 3)


def test_categorical_answers():
    truth = {"1-2": "left of", "1-3": "above", "2-3": "behind"}
    s = sample(None, truth, answer_type="categorical")
    text = response(
        judgments={"1-2": "Left of.", "1-3": "below"}, answers={"1-2": "LEFT  of", "1-3": "above", "2-3": "x"}
    )
    assert TripletTaskReward().score([text], [s]).item() == pytest.approx(2 / 3)
    assert JudgmentAlignmentReward().score([text], [s]).item() == pytest.approx(2 / 6)
    assert TripletConsistencyReward().score([text], [s]).item() == 0.0
    # without attributes, TriSR needs ag_weight = 0
    with pytest.raises(ValueError, match="attributes"):
        TriSRReward().score([text], [s])
    assert TriSRReward(ag_weight=0.0).score([text], [s]).item() == pytest.approx(2 / 3 + 0.2 * 2 / 6)


# ------------------------------------------------------------------------------------------ composition, metrics
def test_value_range_follows_the_weights():
    assert tri_sr_value_range() == (-0.3, 1.7)
    assert TriSRReward(ag_weight=0.5, ja_weight=-0.1, tc_weight=-0.2).value_range == pytest.approx((-0.3, 1.7))
    assert TriSRReward(ag_weight=0, ja_weight=0, tc_weight=1.0).value_range == (-1.0, 2.0)
    assert TripletConsistencyReward().value_range == (-1.0, 1.0)
    assert TriSRReward.value_range == (-0.3, 1.7)


@pytest.mark.parametrize("seed", range(20))
def test_components_sum_to_the_total_and_are_logged(seed):
    rng = random.Random(seed)
    rows = [random_triplet(rng) for _ in range(4)]
    texts = [r[0] for r in rows]
    samples = [sample(r[1], r[3]) for r in rows]
    total = TriSRReward(weight=2.0)
    parts = WeightedReward(total.components())
    out = parts(texts, samples)
    assert parts.names == ["triplet_task", "attribute_grounding", "judgment_alignment", "triplet_consistency"]
    assert torch.allclose(out.total, total.weight * total.score(texts, samples), atol=1e-5)
    logged = WeightedReward([TriSRReward(), FormatReward(weight=0.5), *[c for c in TriSRReward().components()]])
    for c in logged.components[2:]:
        c.weight = 0.0
    out = logged(texts, samples, accumulate=True)
    assert set(out.components) == {"tri_sr", "format", *parts.names}
    assert torch.allclose(out.total, out.components["tri_sr"] + 0.5 * out.components["format"])


def test_evaluation_metrics():
    truth = TRUTH
    texts = [
        "<answer>1-2: 1; 1-3: 1; 2-3: 2</answer>",  # 3/3
        "<answer>1-2: 1; 1-3: 1; 2-3: 3</answer>",  # 2/3
        "<answer>1-2: 2</answer>",  # 0/3
        "no answer",
    ]
    samples = [sample(None, truth)] * 4
    overall, partial = TripletOverallAccuracy(), TripletPartialAccuracy()
    assert overall.name == "triplet_overall_accuracy" and partial.name == "triplet_partial_accuracy"
    assert overall.score(texts, samples).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert partial.score(texts, samples).tolist() == pytest.approx([1.0, 2 / 3, 0.0, 0.0])
    overall.update(texts, samples)
    partial.update(texts, samples)
    assert overall.compute().item() == pytest.approx(0.25)
    assert partial.compute().item() == pytest.approx((1 + 2 / 3) / 4)
    assert triplet_overall_accuracy(texts, [truth] * 4).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_names_scopes_and_doc():
    rewards = [
        AttributeGroundingReward(),
        JudgmentAlignmentReward(),
        TripletConsistencyReward(),
        TripletTaskReward(),
        TripletOverallAccuracy(),
        TripletPartialAccuracy(),
        TriSRReward(),
    ]
    assert [r.name for r in rewards] == [
        "attribute_grounding",
        "judgment_alignment",
        "triplet_consistency",
        "triplet_task",
        "triplet_overall_accuracy",
        "triplet_partial_accuracy",
        "tri_sr",
    ]
    assert all(r.scope == "triplet" for r in rewards)


@pytest.mark.parametrize(
    "meta, match",
    [
        ({"attributes": [1, 2, 3]}, "pair_answers"),
        ({"attributes": [1, 2, 3], "pair_answers": {"1-2": "1", "1-3": "1"}}, "exactly the pairs"),
        ({"attributes": [1, 2, 3], "pair_answers": {"1-2": "3", "1-3": "1", "2-3": "2"}}, "not valid ordinal"),
        ({"attributes": [1, 2], "pair_answers": TRUTH}, "three numbers"),
        ({"attributes": [1, 2, "x"], "pair_answers": TRUTH}, "finite"),
        ({"attributes": [1, 2, float("nan")], "pair_answers": TRUTH}, "finite"),
        ({"pair_answers": TRUTH}, "attributes"),
        ({"attributes": [1, 2, 3], "pair_answers": TRUTH, "answer_type": "fuzzy"}, "answer_type"),
    ],
)
def test_misconfigured_samples_raise(meta, match):
    s = VisualSample(images=[], question="q", task="t", meta=meta)
    with pytest.raises(ValueError, match=match):
        TriSRReward().score(["<answer>1-2: 1</answer>"], [s])


def test_constructor_checks():
    with pytest.raises(ValueError, match="eps"):
        AttributeGroundingReward(eps=0.0)
    with pytest.raises(ValueError, match="interval_tolerance"):
        TripletConsistencyReward(interval_tolerance=-1.0)
    with pytest.raises(ValueError, match="finite"):
        TriSRReward(tc_weight=float("inf"))


def test_a_term_takes_only_the_tolerances_it_reads():
    """A tolerance a term ignores is refused (a config setting it would change nothing), not silently accepted."""
    with pytest.raises(TypeError, match="interval_tolerance"):
        AttributeGroundingReward(interval_tolerance=0.5)
    with pytest.raises(TypeError, match="eps"):
        TripletConsistencyReward(eps=0.5)
    with pytest.raises(TypeError, match="eps"):
        JudgmentAlignmentReward(eps=0.5)
    grounding, consistency = TriSRReward(eps=0.5, interval_tolerance=0.25).components()[1::2]
    assert (grounding.eps, consistency.interval_tolerance) == (0.5, 0.25)


# ------------------------------------------------------------------------------------------ untrusted completions
REWARDS = [
    AttributeGroundingReward(),
    JudgmentAlignmentReward(),
    TripletConsistencyReward(),
    TripletTaskReward(),
    TripletOverallAccuracy(),
    TripletPartialAccuracy(),
    TriSRReward(),
    TriSRReward(ag_weight=1.0, ja_weight=-0.5, tc_weight=2.0, name="tri_sr_custom"),
]
SAMPLES = [
    sample((7, 4, 2), TRUTH),
    sample((0, -1e308, 1e308), {"1-2": "same", "1-3": "3", "2-3": "2"}),
    sample((9, 6, 3), INTERVAL_TRUTH, answer_type="interval"),
]
CODE = "__import__('os').system('touch PWNED')"
SPECIAL = ["nan", "1e309", "-1e309", "-0", "inf", "1" * 100_000, CODE, "9" * 40]


def assert_terms_well_behaved(completions):
    """Finite float32 values made of the terms as documented. Scores are clamped to ``value_range``, so the contract's
    range check could not catch a wrong term; also: R_task in {0, 1/3, 2/3, 1}, R_ja a multiple of 1/6 in [0, 1], R_tc
    in {-1, 0, 1}, the overall accuracy 1 exactly when R_task is, and each TriSR total the weighted sum of its terms."""
    for s in SAMPLES:
        values = []
        for reward in REWARDS:
            values.append(assert_well_behaved(reward, completions, [s] * len(completions)).double())
        ag, ja, tc, task, overall, partial, total, custom = values
        assert torch.equal(partial, task) and torch.equal(overall, (task == 1).double()), completions
        assert task.tolist() == pytest.approx((3 * task).round().div(3).tolist(), abs=1e-6) and (task <= 1).all()
        assert ja.tolist() == pytest.approx((6 * ja).round().div(6).tolist(), abs=1e-6) and (ja <= 1).all()
        assert set(tc.tolist()) <= {-1.0, 0.0, 1.0}
        assert total.tolist() == pytest.approx((task + 0.2 * ag + 0.2 * ja + 0.3 * tc).tolist(), abs=1e-5)
        assert custom.tolist() == pytest.approx((task + ag - 0.5 * ja + 2.0 * tc).tolist(), abs=1e-5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=3))
def test_arbitrary_unicode(completions):
    assert_terms_well_behaved(completions)


_PIECES = st.one_of(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
            "Image 1: ",
            "Image 3: ",
            "Compare 1-2: ",
            "Compare 2-3: ",
            "1-2: ",
            "1-3: ",
            "2-3: ",
            "; ",
            "\n",
            "same",
            "1",
            "2",
            "3",
            "[2, 4]",
            "(A)",
            *SPECIAL[:5],
        ]
    ),
    st.text(max_size=8),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_tag_soup(text):
    assert_terms_well_behaved([text])


@pytest.mark.parametrize("value", SPECIAL)
def test_special_values_everywhere(value):
    text = response((value, value, value), dict.fromkeys(PAIRS, value), dict.fromkeys(PAIRS, value))
    assert_terms_well_behaved([text, f"<answer>{value}</answer>", f"<think>Image 1: {value}</think>"])


ONE_MB = [
    "<answer>" * 125_000,
    "<think>" + "Image 1: 3\nCompare 1-2: 1\n" * 40_000 + "</think><answer>" + "1-2: 1; " * 1000 + "</answer>",
    "<think>" + "a" * 1_000_000 + "</think><answer>1-2: 1; 1-3: 1; 2-3: 2</answer>",
    "<answer>1-2: " + "(" * 1_000_000 + "</answer>",
    "<answer>" + "1-2: [" + "1, " * 300_000 + "</answer>",
    "\ud800" * 1_000_000,
    "<think><think></think>" * 50_000 + "<answer><answer>1-2: 1</answer></answer>",
]


@pytest.mark.parametrize("text", ONE_MB, ids=range(len(ONE_MB)))
def test_one_megabyte_scores(text):
    """Well-behaved on megabyte inputs (their timing: benchmarks/untrusted_inputs.py)."""
    assert_terms_well_behaved([text])


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=16))
def test_one_megabyte_strings(unit):
    assert_terms_well_behaved([unit * (1_000_000 // len(unit) + 1)])


def test_code_is_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    texts = [
        CODE,
        f"<answer>{CODE}</answer>",
        response((CODE, CODE, CODE), dict.fromkeys(PAIRS, CODE), dict.fromkeys(PAIRS, CODE)),
        f"<think>Image 1: {CODE}</think><answer>1-2: {CODE}; 1-3: eval('1'); 2-3: exec('x')</answer>",
    ]
    categorical = sample((1, 2, 3), dict.fromkeys(PAIRS, CODE), answer_type="categorical")
    rewards = WeightedReward(REWARDS[:6] + [TriSRReward(ag_weight=0.0, name="tri_sr_no_ag")])
    for s in (SAMPLES[0], categorical):
        out = rewards(texts, [s] * len(texts), accumulate=True)
        assert all(math.isfinite(v) for v in out.total.tolist())
    rewards.compute()
    assert list(tmp_path.iterdir()) == []


def test_non_string_completions_score_the_low_end_or_zero():
    completions = [None, b"<answer>1-2: 1</answer>", 3, ["<answer>1-2: 1</answer>"]]
    for reward in REWARDS:
        assert reward.score(completions, [SAMPLES[0]] * 4).tolist() == [0.0] * 4

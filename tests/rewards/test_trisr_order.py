"""The triplet diagnostics (cycle rate, order accuracy, attribute accuracy) and the symmetric consistency rule, against
brute-force references over integer values and on hand-built completions."""

import itertools
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.rewards import (
    TripletAttributeAccuracy,
    TripletConsistencyReward,
    TripletCycleRate,
    TripletOrderAccuracy,
    TripletOverallAccuracy,
    TriSRReward,
    WeightedReward,
)
from app.rewards.functional import (
    triplet_attribute_accuracy,
    triplet_consistency_reward,
    triplet_cycle_rate,
    triplet_order_accuracy,
)
from app.rewards.trisr_scores import CONSISTENCY_RULES, WEAK_ORDERS, tri_sr_reward
from app.types import VisualSample

PAIRS = ("1-2", "1-3", "2-3")
SPELL = {1: lambda p: p[0], -1: lambda p: p[2], 0: lambda p: "same", None: lambda p: None}


def sample(attributes=None, pair_answers=None, answer_type=None):
    meta = {}
    if attributes is not None:
        meta["attributes"] = list(attributes)
    if pair_answers is not None:
        meta["pair_answers"] = dict(pair_answers)
    if answer_type is not None:
        meta["answer_type"] = answer_type
    return VisualSample(images=[], question="q", task="count", meta=meta)


def answer(signs) -> str:
    """An <answer> block giving ordinal sign ``signs[k]`` for ``PAIRS[k]`` (None: left out)."""
    items = [f"{p}: {SPELL[s](p)}" for p, s in zip(PAIRS, signs, strict=True) if s is not None]
    return "<think>x</think><answer>" + "; ".join(items) + "</answer>"


def truth_of(values) -> dict[str, str]:
    """Ground-truth ordinal answers ("which is larger?") of three values."""
    out = {}
    for p in PAIRS:
        a, b = values[int(p[0]) - 1], values[int(p[2]) - 1]
        out[p] = p[0] if a > b else p[2] if a < b else "same"
    return out


# ------------------------------------------------------------------------------------------ brute-force reference
def ref_realisations(signs):
    """The sign triples of every (v1, v2, v3) in 0..3 that agrees with the given signs (None: anything)."""
    sign = lambda a, b: (a > b) - (a < b)  # noqa: E731
    found = set()
    for v in itertools.product(range(4), repeat=3):
        triple = (sign(v[0], v[1]), sign(v[0], v[2]), sign(v[1], v[2]))
        if all(s is None or s == t for s, t in zip(signs, triple, strict=True)):
            found.add(triple)
    return found


SIGN_TRIPLES = list(itertools.product((1, 0, -1, None), repeat=3))
TRUE_VALUES = list(itertools.product(range(3), repeat=3))


def test_weak_orders_are_the_thirteen_realisable_sign_triples():
    assert WEAK_ORDERS == ref_realisations((None, None, None)) and len(WEAK_ORDERS) == 13


@pytest.mark.parametrize("signs", SIGN_TRIPLES, ids=str)
def test_cycle_rate_matches_the_reference(signs):
    expected = 0.0 if ref_realisations(signs) else 1.0
    text = answer(signs)
    assert triplet_cycle_rate([text]).item() == expected
    assert TripletCycleRate().score([text], [sample()]).item() == expected
    if None in signs:
        assert expected == 0.0  # two signs are always realisable: a missing answer is no cycle


@pytest.mark.parametrize("signs", SIGN_TRIPLES, ids=str)
def test_order_accuracy_matches_the_reference(signs):
    text = answer(signs)
    realised = ref_realisations(signs)
    for values in TRUE_VALUES:
        truth = truth_of(values)
        sign = lambda a, b: (a > b) - (a < b)  # noqa: E731
        true = (sign(values[0], values[1]), sign(values[0], values[2]), sign(values[1], values[2]))
        expected = float(realised == {true})
        assert triplet_order_accuracy([text], [truth]).item() == expected, (signs, values)
        assert TripletOrderAccuracy().score([text], [sample(None, truth)]).item() == expected


@pytest.mark.parametrize("signs", [s for s in SIGN_TRIPLES if None not in s], ids=str)
def test_order_accuracy_equals_overall_accuracy_on_complete_answers(signs):
    text = answer(signs)
    for values in TRUE_VALUES:
        s = sample(None, truth_of(values))
        assert TripletOrderAccuracy().score([text], [s]).item() == TripletOverallAccuracy().score([text], [s]).item()


@pytest.mark.parametrize("signs", SIGN_TRIPLES, ids=str)
def test_transitive_rule_matches_the_reference(signs):
    """+1 iff realisable, -1 iff not, 0 when an answer is missing; the paper's rule differs only where image 2 is
    ranked first or last (s_12 and s_23 of opposite signs), where it gives 0."""
    text = answer(signs)
    if None in signs:
        expected = 0.0
    else:
        expected = 1.0 if ref_realisations(signs) else -1.0
    assert triplet_consistency_reward([text], rule="transitive").item() == expected
    assert TripletConsistencyReward(rule="transitive").score([text], [sample()]).item() == expected
    paper = triplet_consistency_reward([text]).item()
    s12, _, s23 = signs
    if None not in signs and s12 * s23 < 0:
        assert (paper, expected) == (0.0, 1.0)
    else:
        assert paper == expected


# ------------------------------------------------------------------------------------------ the ordering prior
STRICT_ORDERS = list(itertools.permutations((1, 2, 3)))  # the six rankings of distinct counts


def test_the_paper_rule_rewards_a_fixed_answer_over_a_perfect_one():
    """Over the six strict rankings (distinct counts, as in the dot triplets): the image-blind answer 1 > 2 > 3 scores
    R_tc = 1 on every one under the paper's rule, a perfect answer only 1/3 (image 2 in the middle on two rankings of
    six); under the symmetric rule both score 1. Order accuracy separates them: 1/6 against 1."""
    fixed = answer((1, 1, 1))
    truths = [truth_of(v) for v in STRICT_ORDERS]
    perfect = ["<answer>" + "; ".join(f"{p}: {t[p]}" for p in PAIRS) + "</answer>" for t in truths]
    samples = [sample(v, t) for v, t in zip(STRICT_ORDERS, truths, strict=True)]

    def mean(reward, texts):
        return statistics.mean(reward.score(texts, samples).tolist())

    paper, symmetric, order = (
        TripletConsistencyReward(),
        TripletConsistencyReward(rule="transitive"),
        TripletOrderAccuracy(),
    )
    assert mean(paper, [fixed] * 6) == 1.0 and mean(paper, perfect) == pytest.approx(1 / 3)
    assert mean(symmetric, [fixed] * 6) == 1.0 and mean(symmetric, perfect) == 1.0
    assert mean(order, [fixed] * 6) == pytest.approx(1 / 6) and mean(order, perfect) == 1.0
    assert mean(TripletCycleRate(), [fixed] * 6) == mean(TripletCycleRate(), perfect) == 0.0
    # the TriSR totals without the reasoning terms: the fixed answer's deficit is 0.3 smaller under the paper's rule
    ag0 = dict(ag_weight=0.0, ja_weight=0.0)
    gap = {
        rule: mean(TriSRReward(consistency_rule=rule, **ag0), perfect)
        - mean(TriSRReward(consistency_rule=rule, **ag0), [fixed] * 6)
        for rule in CONSISTENCY_RULES
    }
    assert gap["paper"] == pytest.approx(0.5 + 0.3 * (1 / 3 - 1))  # 1.1 - 0.8
    assert gap["transitive"] == pytest.approx(0.5)  # 1.3 - 0.8


# ------------------------------------------------------------------------------------------ hand-built completions
TRUTH = {"1-2": "1", "1-3": "1", "2-3": "2"}  # counts 7 > 4 > 2


@pytest.mark.parametrize(
    "answers, cycle, order",
    [
        ("1-2: 1; 1-3: 1; 2-3: 2", 0.0, 1.0),  # right
        ("1-2: Image 1; 1-3: A; 2-3: first", 0.0, 1.0),  # other spellings
        ("1-2: 1; 2-3: 2", 0.0, 1.0),  # 1-3 missing but implied
        ("1-2: 1; 1-3: 1", 0.0, 0.0),  # 2 vs 3 open
        ("1-2: 1; 1-3: 1; 2-3: 3", 0.0, 0.0),  # 1 > 3 > 2: transitive, wrong
        ("1-2: 1; 1-3: 3; 2-3: 2", 1.0, 0.0),  # 1 > 2 > 3 > 1
        ("1-2: 2; 1-3: 1; 2-3: 3", 1.0, 0.0),  # 2 > 1 > 3 > 2
        ("1-2: same; 1-3: 1; 2-3: same", 1.0, 0.0),  # 1 = 2 = 3 but 1 > 3
        ("1-2: same; 1-3: same; 2-3: same", 0.0, 0.0),  # all equal: transitive, wrong
        ("1-2: 3; 1-3: 3; 2-3: 2", 0.0, 0.0),  # 1-2 unreadable (image 3 is not in the pair): 3 > 1, 2 > 3 imply 2 > 1
        ("", 0.0, 0.0),
    ],
)
def test_hand_built(answers, cycle, order):
    text = f"<think>Image 1: 7\nImage 2: 4\nImage 3: 2</think><answer>{answers}</answer>"
    s = sample((7, 4, 2), TRUTH)
    assert TripletCycleRate().score([text], [s]).item() == cycle
    assert TripletOrderAccuracy().score([text], [s]).item() == order


def test_interval_answers_have_signs():
    """Interval answers (ranges of v_i - v_j): the sign when the range excludes 0 (or is [0, 0]); a straddling range
    has none. Right signs with wrong ranges: order accuracy 1, overall accuracy 0."""
    truth = {"1-2": "[2, 4]", "1-3": "[5, 7]", "2-3": "[1, 3]"}
    s = sample((9, 6, 3), truth, answer_type="interval")
    right_signs = "<answer>1-2: 1; 1-3: 9; 2-3: [1, 2]</answer>"
    cycle = "<answer>1-2: 1; 1-3: -9; 2-3: 2</answer>"
    straddle = "<answer>1-2: [-1, 1]; 1-3: 5; 2-3: 2</answer>"  # 1-2 open: 1 vs 2 undecided
    texts = [right_signs, cycle, straddle]
    assert TripletOrderAccuracy().score(texts, [s] * 3).tolist() == [1.0, 0.0, 0.0]
    assert TripletOverallAccuracy().score(texts, [s] * 3).tolist() == [0.0, 0.0, 0.0]
    assert TripletCycleRate().score(texts, [s] * 3).tolist() == [0.0, 1.0, 0.0]
    assert triplet_cycle_rate(texts, "interval").tolist() == [0.0, 1.0, 0.0]


def test_categorical_answers_have_no_order():
    truth = {"1-2": "left of", "1-3": "above", "2-3": "behind"}
    s = sample(None, truth, answer_type="categorical")
    text = "<answer>1-2: left of; 1-3: above; 2-3: behind</answer>"
    assert TripletOrderAccuracy().score([text], [s]).item() == 0.0
    assert TripletCycleRate().score([text], [s]).item() == 0.0


def test_attribute_accuracy():
    s = sample((7, 4, 2), TRUTH)
    texts = [
        "<think>Image 1: 7\nImage 2: 4\nImage 3: 2</think>",
        "<think>Image 1: 7.0\nImage 2: 5\nImage 3: two</think>",
        "<answer>1-2: 1</answer>",
    ]
    expected = [1.0, 1 / 3, 0.0]
    assert TripletAttributeAccuracy().score(texts, [s] * 3).tolist() == pytest.approx(expected)
    assert triplet_attribute_accuracy(texts, [(7, 4, 2)] * 3).tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="attributes"):
        TripletAttributeAccuracy().score(texts[:1], [sample(None, TRUTH)])


def test_order_accuracy_needs_labels_and_cycle_rate_does_not():
    with pytest.raises(ValueError, match="pair_answers"):
        TripletOrderAccuracy().score(["<answer>1-2: 1</answer>"], [sample()])
    assert TripletCycleRate().score(
        ["<answer>1-2: 1</answer>"], [VisualSample(images=[], question="q", task="t")]
    ).tolist() == [0.0]


# ------------------------------------------------------------------------------------------ the symmetric TriSR arm
def test_trisr_with_the_transitive_rule():
    """2 > 1 > 3 answered right with every reasoning line: the paper's rule leaves R_tc at 0, the symmetric one gives
    +1, and the components follow the rule."""
    truth = {"1-2": "2", "1-3": "1", "2-3": "2"}
    s = sample((4, 7, 2), truth)
    text = (
        "<think>Image 1: 4\nImage 2: 7\nImage 3: 2\nCompare 1-2: 2\nCompare 1-3: 1\nCompare 2-3: 2</think>"
        "<answer>1-2: 2; 1-3: 1; 2-3: 2</answer>"
    )
    paper, symmetric = TriSRReward(), TriSRReward(consistency_rule="transitive")
    assert paper.score([text], [s]).item() == pytest.approx(1.4)
    assert symmetric.score([text], [s]).item() == pytest.approx(1.7)
    assert tri_sr_reward([text], [(4, 7, 2)], [truth], consistency_rule="transitive").item() == pytest.approx(1.7)
    parts = WeightedReward(symmetric.components())
    assert parts([text], [s]).total.item() == pytest.approx(1.7)
    assert parts.components[-1].consistency_rule == "transitive"
    assert symmetric.value_range == paper.value_range == (-0.3, 1.7)


def test_rule_is_checked():
    with pytest.raises(ValueError, match="consistency rule"):
        TripletConsistencyReward(rule="symmetric")
    with pytest.raises(ValueError, match="consistency rule"):
        TriSRReward(consistency_rule="")
    with pytest.raises(ValueError, match="consistency rule"):
        triplet_consistency_reward(["<answer></answer>"], rule="literal")


def test_names():
    rewards = [TripletCycleRate(), TripletOrderAccuracy(), TripletAttributeAccuracy()]
    assert [r.name for r in rewards] == ["triplet_cycle_rate", "triplet_order_accuracy", "triplet_attribute_accuracy"]
    assert all(r.scope == "triplet" and r.value_range == (0.0, 1.0) for r in rewards)
    assert TripletConsistencyReward(rule="transitive", name="triplet_consistency_transitive").name == (
        "triplet_consistency_transitive"
    )


def test_metrics_accumulate():
    texts = ["<answer>1-2: 1; 1-3: 1; 2-3: 2</answer>", "<answer>1-2: 1; 1-3: 3; 2-3: 2</answer>"]
    samples = [sample((7, 4, 2), TRUTH)] * 2
    cycle, order = TripletCycleRate(), TripletOrderAccuracy()
    for metric in (cycle, order):
        metric.update(texts, samples)
    assert cycle.compute().item() == pytest.approx(0.5) and order.compute().item() == pytest.approx(0.5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=3))
def test_arbitrary_text_scores_zero_or_one(completions):
    s = sample((7, 4, 2), TRUTH)
    for reward in (TripletCycleRate(), TripletOrderAccuracy(), TripletAttributeAccuracy()):
        v = reward.score(completions, [s] * len(completions))
        assert v.dtype == torch.float32 and torch.isfinite(v).all() and ((v >= 0) & (v <= 1)).all()
    v = TripletConsistencyReward(rule="transitive").score(completions, [s] * len(completions))
    assert set(v.tolist()) <= {-1.0, 0.0, 1.0}

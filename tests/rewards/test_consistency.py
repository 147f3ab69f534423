"""Consistency verifiers and pairing (docs/algorithms.md, "Consistency verifiers and pairing") on fresh random inputs:
minimal pairing against brute force and POT, unequal valid counts, negation, unparseable answers, and the reward
class."""

import copy
import itertools
import math

import numpy as np
import ot
import pytest
import torch

from app.rewards import FormatReward, WeightedReward
from app.rewards.consistency import (
    ConsistencyReward,
    answer_spec,
    batch_generator,
    bool_verifier,
    consistency_rewards,
    count_verifier,
    distance_verifier,
    minimal_coupling,
    minimal_pairing,
    northwest_corner_coupling,
    one_to_all_pairing,
    pair_rewards,
    parse_answers,
    parse_count,
    parse_distance,
    random_pairing,
    verification_matrix,
)
from app.types import VisualSample


def pair_batch(k: int, relation: str = "identity", pair_id=0) -> list[VisualSample]:
    x = VisualSample(images=[], question="Is the red dot left of the blue dot?", task="t", meta={"pair_id": pair_id})
    twin = VisualSample(
        images=[],
        question="Is the blue dot left of the red dot?",
        task="t",
        meta={"pair_id": pair_id, "relation": relation},
    )
    return [x] * k + [twin] * k


def answer(text: str) -> str:
    return f"<think>look</think><answer>{text}</answer>"


# ------------------------------------------------------------------------------------------------------- verifiers
def test_bool_verifier_negation_flips():
    for y, y2 in itertools.product([True, False], repeat=2):
        assert bool_verifier(y, y2, "identity") == float(y == y2)
        assert bool_verifier(y, y2, "negation") == float(y == (not y2))
    with pytest.raises(ValueError, match="relation"):
        bool_verifier(True, True, "swap")


def test_numeric_verifiers():
    assert count_verifier(3.0, 3.0, "identity") == 1.0 and count_verifier(3.0, 4.0, "identity") == 0.0
    assert distance_verifier(10.0, 11.0, "identity") == 1.0  # 1 <= 0.1 * 11
    assert distance_verifier(10.0, 11.2, "identity") == 0.0
    assert distance_verifier(10.0, 11.2, "identity", tolerance=0.2) == 1.0
    assert distance_verifier(0.0, 0.0, "identity") == 1.0 and distance_verifier(0.0, 1e-9, "identity") == 0.0
    assert distance_verifier(10.0, 11.0, "identity") == distance_verifier(11.0, 10.0, "identity")
    for verifier in (count_verifier, distance_verifier):
        with pytest.raises(ValueError, match="only support invariant"):
            verifier(1.0, 1.0, "negation")


def test_parse_answers_per_type():
    texts = [answer("Yes."), answer("FALSE"), answer("3"), answer("2.5"), answer("-1"), "yes", answer("nan"), None]
    assert parse_answers(texts, "bool") == [True, False, None, None, None, None, None, None]
    assert parse_answers(texts, "count") == [None, None, 3.0, None, None, None, None, None]
    assert parse_answers(texts, "distance") == [None, None, 3.0, 2.5, None, None, None, None]
    with pytest.raises(ValueError, match="answer_type"):
        parse_answers(texts, "ordinal")


def test_verification_matrix_matches_the_definition_on_random_answers():
    rng = np.random.default_rng(0)
    for _ in range(50):
        k0, k1 = rng.integers(1, 9, size=2)
        ys = [[None if rng.random() < 0.3 else bool(rng.random() < 0.5) for _ in range(k)] for k in (k0, k1)]
        for relation in ("identity", "negation"):
            V, valid_x, valid_x2 = verification_matrix(ys[0], ys[1], relation)
            assert V.shape == (k0, k1) and V.dtype == torch.float32
            assert valid_x.tolist() == [y is not None for y in ys[0]]
            assert valid_x2.tolist() == [y is not None for y in ys[1]]
            for i, j in itertools.product(range(k0), range(k1)):
                a, b = ys[0][i], ys[1][j]
                expected = 0.0 if a is None or b is None else float((a == b) == (relation == "identity"))
                assert V[i, j] == expected


# ------------------------------------------------------------------------------------------------ minimal pairing
def brute_force_minimum(V: np.ndarray) -> tuple[float, tuple[int, ...]]:
    k = V.shape[0]
    return min((sum(V[i, s[i]] for i in range(k)), s) for s in itertools.permutations(range(k)))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_minimal_pairing_equals_brute_force(k):
    rng = np.random.default_rng(k)
    for _ in range(20):
        # Continuous scores: the optimal permutation is unique, so the rewards themselves must match.
        V = rng.random((k, k))
        best, sigma = brute_force_minimum(V)
        r, r2 = minimal_pairing(torch.tensor(V))
        expected = [V[i, sigma[i]] for i in range(k)]
        assert r.tolist() == pytest.approx(expected, abs=1e-6)
        assert r2.tolist() == pytest.approx([V[sigma.index(j), j] for j in range(k)], abs=1e-6)
        # Binary scores (real verifier values): ties are common, so compare the optimal total.
        Vb = (rng.random((k, k)) < 0.5).astype(float)
        r, r2 = minimal_pairing(torch.tensor(Vb))
        assert float(r.sum()) == pytest.approx(brute_force_minimum(Vb)[0]) == pytest.approx(float(r2.sum()))
        assert set(r.tolist()) <= {0.0, 1.0}  # a permutation: each completion has one partner


def test_balanced_assignment_reaches_the_network_simplex_optimum():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 33))
        V = rng.random((n, n)) if rng.random() < 0.5 else (rng.random((n, n)) < 0.5).astype(float)
        gamma = minimal_coupling(V)
        uniform = np.full(n, 1.0 / n)
        assert np.allclose(gamma.sum(axis=1), uniform) and np.allclose(gamma.sum(axis=0), uniform)
        assert (gamma * V).sum() == pytest.approx(ot.emd2(uniform, uniform, V), abs=1e-9)


def direct_ot_rewards(V, valid_x, valid_x2):
    """Rewards written out from the paper's Definition B.1 with POT, independently of the package."""
    r, r2 = np.zeros(V.shape[0]), np.zeros(V.shape[1])
    sub = V[np.ix_(valid_x, valid_x2)]
    n0, n1 = sub.shape
    gamma = ot.emd(np.full(n0, 1 / n0), np.full(n1, 1 / n1), sub)
    r[valid_x] = (gamma * sub).sum(axis=1) / gamma.sum(axis=1)
    r2[valid_x2] = (gamma * sub).sum(axis=0) / gamma.sum(axis=0)
    return r, r2, ot.emd2(np.full(n0, 1 / n0), np.full(n1, 1 / n1), sub)


def test_unequal_valid_counts_match_a_direct_ot_computation():
    rng = np.random.default_rng(2)
    checked = 0
    while checked < 200:
        k = int(rng.integers(2, 17))
        valid_x, valid_x2 = rng.random(k) < 0.7, rng.random(k) < 0.7
        n0, n1 = valid_x.sum(), valid_x2.sum()
        if n0 == n1 or n0 == 0 or n1 == 0:
            continue
        checked += 1
        continuous = rng.random((k, k))
        r, r2 = minimal_pairing(torch.tensor(continuous), torch.tensor(valid_x), torch.tensor(valid_x2))
        expected_r, expected_r2, _ = direct_ot_rewards(continuous, valid_x, valid_x2)
        assert r.numpy() == pytest.approx(expected_r, abs=1e-6) and r2.numpy() == pytest.approx(expected_r2, abs=1e-6)
        binary = (rng.random((k, k)) < 0.5).astype(float)
        r, r2 = minimal_pairing(torch.tensor(binary), torch.tensor(valid_x), torch.tensor(valid_x2))
        _, _, cost = direct_ot_rewards(binary, valid_x, valid_x2)
        # Ties make the plan non-unique; its cost is not: each side's mean reward is the optimal transport cost.
        assert float(r[valid_x].mean()) == pytest.approx(cost, abs=1e-6)
        assert float(r2[valid_x2].mean()) == pytest.approx(cost, abs=1e-6)
        assert not r[~valid_x].any() and not r2[~valid_x2].any()
        assert ((r >= 0) & (r <= 1)).all() and ((r2 >= 0) & (r2 <= 1)).all()


def test_hand_worked_unequal_example():
    """x: 10.5, 9.5, 11.5 and one unparseable (n0 = 3); x': 10, 11 and two unparseable (n1 = 2); distances, 10%.

    V = [[1, 1], [1, 0], [0, 1]]: 10.5 agrees with both, 9.5 only with 10, 11.5 only with 11. Marginals 1/3 and 1/2.
    The unique optimal plan sends 9.5 -> 11 and 11.5 -> 10 (1/3 each, cost 0) and splits 10.5's 1/3 over both
    (1/6 each, cost 1): total 1/3. Rewards: r = (1, 0, 0, 0) (10.5 cannot avoid agreeing), r' = 2 * 1/6 = 1/3 for 10
    and 11, 0 for the unparseable ones.
    """
    x = [answer("10.5"), answer("9.5"), answer("11.5"), answer("ten")]
    twin = [answer("10"), "<answer>11", answer("11"), answer("-3")]
    rewards = consistency_rewards(x + twin, pair_batch(4), answer_type="distance")
    assert rewards.tolist() == pytest.approx([1, 0, 0, 0, 1 / 3, 0, 1 / 3, 0], abs=1e-6)


def test_negation_relation():
    yes, no = answer("yes"), answer("no")
    # Every answer of x is "yes" and every answer of the negated twin "no": consistent whatever the pairing.
    for pairing in ("minimal", "one_to_all", "random"):
        out = consistency_rewards([yes] * 4 + [no] * 4, pair_batch(4, "negation"), pairing=pairing)
        assert out.tolist() == [1.0] * 8
        out = consistency_rewards([yes] * 4 + [yes] * 4, pair_batch(4, "negation"), pairing=pairing)
        assert out.tolist() == [0.0] * 8
    # Mixed answers: minimal pairing matches each "yes" of x with a "yes" of the twin (inconsistent under negation).
    out = consistency_rewards([yes, yes, no, no] + [yes, no, yes, no], pair_batch(4, "negation"))
    assert out.tolist() == [0.0] * 8
    out = consistency_rewards([yes, yes, yes, no] + [yes, no, no, no], pair_batch(4, "negation"))
    assert out.sum() == 2 * 2  # x has 3 yes, the twin 1: two of x's yes must meet a twin no (consistent), each side


def test_unparseable_completions_get_zero_and_leave_the_matching():
    yes, no = answer("yes"), answer("no")
    batch = [yes, "<answer>maybe</answer>", no, "no tags"] + [no, yes, "<answer>", answer("")]
    for pairing in ("minimal", "one_to_all", "random"):
        out = consistency_rewards(batch, pair_batch(4), pairing=pairing)
        assert out[[1, 3, 6, 7]].tolist() == [0.0] * 4
    # Valid: x = (yes, no), twin = (no, yes): minimal pairing matches yes-no twice, all 0; one-to-all gives 1/2.
    assert consistency_rewards(batch, pair_batch(4)).tolist() == [0.0] * 8
    assert consistency_rewards(batch, pair_batch(4), pairing="one_to_all").tolist() == [0.5, 0, 0.5, 0, 0.5, 0.5, 0, 0]


@pytest.mark.parametrize("pairing", ["minimal", "one_to_all", "random"])
def test_no_valid_completion_on_one_side_gives_all_zero(pairing):
    valid = [answer("yes")] * 3
    for completions in (["junk"] * 3 + valid, valid + ["junk"] * 3, ["junk"] * 6):
        assert consistency_rewards(completions, pair_batch(3), pairing=pairing).tolist() == [0.0] * 6
    r, r2 = pair_rewards(torch.ones(3, 3), torch.zeros(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool), pairing)
    assert r.tolist() == [0.0] * 3 and r2.tolist() == [0.0] * 3


def test_one_to_all_is_the_row_mean_over_valid_partners():
    rng = np.random.default_rng(3)
    V = (rng.random((6, 5)) < 0.5).astype(float)
    valid_x2 = np.array([True, False, True, True, False])
    r, r2 = one_to_all_pairing(torch.tensor(V), None, torch.tensor(valid_x2))
    assert r.numpy() == pytest.approx(V[:, valid_x2].mean(axis=1))
    assert r2.numpy() == pytest.approx(np.where(valid_x2, V.mean(axis=0), 0.0))


def test_random_pairing_identity_without_generator_and_a_seeded_permutation_with_one():
    rng = np.random.default_rng(4)
    V = torch.tensor(rng.random((8, 8)))
    r, r2 = random_pairing(V)
    assert r.tolist() == pytest.approx(torch.diagonal(V).tolist()) and r2.tolist() == r.tolist()
    draws = []
    for seed in (0, 0, 1):
        r, r2 = random_pairing(V, generator=torch.Generator().manual_seed(seed))
        sigma = [int(np.argmin(np.abs(V[i].numpy() - float(r[i])))) for i in range(8)]
        assert sorted(sigma) == list(range(8))  # a permutation...
        assert r2.tolist() == pytest.approx([float(r[sigma.index(j)]) for j in range(8)])  # ...seen from both sides
        draws.append(sigma)
    assert draws[0] == draws[1] and draws[0] != draws[2]


def test_northwest_corner_coupling_has_the_right_marginals():
    for n0, n1 in itertools.product(range(1, 9), repeat=2):
        gamma = northwest_corner_coupling(n0, n1)
        assert np.allclose(gamma.sum(axis=1), 1 / n0) and np.allclose(gamma.sum(axis=0), 1 / n1)
    assert np.array_equal(northwest_corner_coupling(3, 3), np.eye(3) / 3)
    # by hand, in units of 1/6: row 0 holds 3, row 1 holds 3, each column 2, mass flowing in index order
    assert np.array_equal(northwest_corner_coupling(2, 3), np.array([[2, 1, 0], [0, 1, 2]]) / 6)
    assert np.array_equal(northwest_corner_coupling(3, 2), np.array([[2, 0], [1, 1], [0, 2]]) / 6)


def test_an_unbalanced_minimal_coupling_has_uniform_marginals_and_the_optimal_cost():
    rng = np.random.default_rng(2)
    for n0, n1 in [(2, 3), (5, 2), (4, 7)]:
        V = rng.random((n0, n1))
        gamma = minimal_coupling(V)
        assert np.allclose(gamma.sum(axis=1), 1 / n0) and np.allclose(gamma.sum(axis=0), 1 / n1)
        assert (gamma * V).sum() == pytest.approx(ot.emd2(np.full(n0, 1 / n0), np.full(n1, 1 / n1), V), abs=1e-12)


# ------------------------------------------------------------------------------------------------ the reward class
class LabelTrap(VisualSample):
    """A sample whose label cannot be read: any access raises."""

    @property
    def answer(self):
        raise AssertionError("a label-free reward read sample.answer")

    @answer.setter
    def answer(self, value):
        pass  # the dataclass __init__ assigns it


def test_consistency_reward_is_label_free_and_composes():
    x = LabelTrap(images=[], question="q", task="t", meta={"pair_id": 1})
    twin = LabelTrap(images=[], question="q2", task="t", meta={"pair_id": 1, "relation": "negation"})
    with pytest.raises(AssertionError):
        x.answer  # noqa: B018 - the trap works
    completions = [answer("yes"), answer("no"), answer("no"), answer("no")]
    reward = ConsistencyReward()
    assert (reward.name, reward.scope, reward.value_range) == ("consistency", "group_pair", (0.0, 1.0))
    assert reward.score(completions, [x, x, twin, twin]).tolist() == [1.0, 0.0, 1.0, 0.0]
    total = WeightedReward([reward, FormatReward(weight=0.5)])(completions, [x, x, twin, twin], accumulate=True)
    assert total.total.tolist() == [1.5, 0.5, 1.5, 0.5]
    assert float(reward.compute()) == 0.5


def test_consistency_reward_arguments():
    with pytest.raises(ValueError, match="answer_type"):
        ConsistencyReward(answer_type="ordinal")
    with pytest.raises(ValueError, match="pairing"):
        ConsistencyReward(pairing="maximal")
    with pytest.raises(ValueError, match="distance_tolerance"):
        ConsistencyReward(distance_tolerance=float("nan"))
    with pytest.raises(ValueError, match="supports relations"):
        ConsistencyReward(answer_type="count").score([answer("3")] * 2, pair_batch(1, "negation"))
    # a data-layout bug raises (not a silent 0): here the twin group is missing
    with pytest.raises(ValueError, match="unpaired"):
        ConsistencyReward().score([answer("yes")] * 2, pair_batch(2)[:2])
    seeded = [ConsistencyReward(pairing="random", seed=7) for _ in range(2)]
    rng = np.random.default_rng(5)
    completions = [answer(rng.choice(["yes", "no"])) for _ in range(16)]
    samples = pair_batch(8)
    assert seeded[0].score(completions, samples).tolist() == seeded[1].score(completions, samples).tolist()


def test_group_size_sets_the_groups_when_rows_hold_copies_of_a_prompt():
    # Rows that carry copies of the sample (distinct objects) still form groups of K = group_size rows.
    x, twin = pair_batch(1, "negation")
    samples = [copy.copy(x), copy.copy(x), copy.copy(twin), copy.copy(twin)]
    completions = [answer("yes"), answer("no"), answer("no"), answer("no")]
    expected = [1.0, 0.0, 1.0, 0.0]  # as for [x, x, twin, twin]: the lone "yes" is matched with a "no"
    assert consistency_rewards(completions, samples, group_size=2).tolist() == expected
    assert ConsistencyReward().score(completions, samples, group_size=2).tolist() == expected
    with pytest.raises(ValueError, match="unknown relation None"):
        ConsistencyReward().score(completions, samples)  # without it, groups of one row each: the pairs are wrong


def test_count_answers_and_multiple_pairs_in_one_batch():
    samples = pair_batch(2, pair_id="a") + pair_batch(2, pair_id="b")
    completions = [answer("3"), answer("4"), answer("4"), answer("3.5")] + [answer("2"), answer("2"), "x", answer("2")]
    out = consistency_rewards(completions, samples, answer_type="count")
    # pair a: x = (3, 4), twin = (4, unparseable): n0 = 2, n1 = 1; the twin's 4 splits 1/2-1/2 over 3 and 4.
    # pair b: x = (2, 2), twin = (unparseable, 2): every valid answer agrees.
    assert out.tolist() == pytest.approx([0, 1, 0.5, 0, 1, 1, 0, 1])
    assert math.isclose(float(out.mean()), 4.5 / 8)


def test_answer_type_from_meta_scores_each_pair_with_its_own_type():
    boolean, count = pair_batch(2, "negation", pair_id="b"), pair_batch(2, pair_id="c")
    for sample in {id(s): s for s in boolean}.values():
        sample.meta["answer_type"] = "bool"
    for sample in {id(s): s for s in count}.values():
        sample.meta["answer_type"] = "count"
    bool_texts = [answer("yes"), answer("no"), answer("no"), answer("no")]
    count_texts = [answer("3"), answer("4"), answer("4"), "x"]
    mixed = ConsistencyReward(answer_type="from_meta").score(bool_texts + count_texts, boolean + count)
    expected = torch.cat([consistency_rewards(bool_texts, boolean), consistency_rewards(count_texts, count, "count")])
    assert mixed.tolist() == expected.tolist()
    del count[0].meta["answer_type"]
    with pytest.raises(ValueError, match="needs meta\\['answer_type'\\].*rows 4:6 .*None"):
        consistency_rewards(bool_texts + count_texts, boolean + count, answer_type="from_meta")


def test_numeric_verifier_errors_name_the_answer_type():
    with pytest.raises(ValueError, match="^count answers only support invariant transforms .*'negation'"):
        count_verifier(1.0, 1.0, "negation")
    with pytest.raises(ValueError, match="^distance answers only support invariant transforms .*'negation'"):
        distance_verifier(1.0, 1.0, "negation")


def test_parse_distance_accepts_zero_and_fractions_below_one():
    assert [parse_distance(text) for text in ("0", "0.0", "0.5", "1", "-0.5")] == [0.0, 0.0, 0.5, 1.0, None]


def test_pair_rewards_defaults_to_minimal_pairing_and_accepts_any_tensor_dtype():
    V = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    minimal = pair_rewards(V, pairing="minimal")
    assert [t.tolist() for t in minimal] == [[0.0, 1.0], [1.0, 0.0]]  # differs from one_to_all and random here
    assert [t.tolist() for t in pair_rewards(V)] == [t.tolist() for t in minimal]
    assert [t.tolist() for t in minimal_pairing(V)] == [t.tolist() for t in minimal]
    for dtype in (torch.bfloat16, torch.float16, torch.bool, torch.int64):
        r, r2 = pair_rewards(V.to(dtype))
        assert (r.dtype, r2.dtype) == (torch.float32, torch.float32)
        assert [r.tolist(), r2.tolist()] == [t.tolist() for t in minimal], dtype


def test_random_and_one_to_all_pairing_use_both_validity_masks():
    rng = np.random.default_rng(6)
    V = rng.random((3, 3))
    valid_x, valid_x2 = np.array([True, False, True]), np.array([True, True, False])
    # Generation order over the valid completions: x's 0th and 2nd meet the twin's 0th and 1st.
    r, r2 = random_pairing(torch.tensor(V), torch.tensor(valid_x), torch.tensor(valid_x2))
    assert r.tolist() == pytest.approx([V[0, 0], 0.0, V[2, 1]])
    assert r2.tolist() == pytest.approx([V[0, 0], V[2, 1], 0.0])
    r, r2 = one_to_all_pairing(torch.tensor(V), torch.tensor(valid_x), torch.tensor(valid_x2))
    sub = V[np.ix_(valid_x, valid_x2)]
    assert r.tolist() == pytest.approx([sub[0].mean(), 0.0, sub[1].mean()])
    assert r2.tolist() == pytest.approx([sub[:, 0].mean(), sub[:, 1].mean(), 0.0])


def test_consistency_reward_defaults_and_base_arguments():
    reward = ConsistencyReward()
    assert (reward.answer_type, reward.pairing, reward.distance_tolerance, reward.seed) == (
        "bool",
        "minimal",
        0.1,
        None,
    )
    assert (reward.name, reward.weight) == ("consistency", 1.0)
    custom = ConsistencyReward(weight=0.5, name="ot_consistency", dist_sync_on_step=True)
    assert (custom.name, custom.weight, custom.dist_sync_on_step) == ("ot_consistency", 0.5, True)
    # The default distance tolerance is 10 %: 10 vs 10.5 agree (0.5 <= 1.05), 10 vs 11.5 do not (1.5 > 1.15).
    distance = ConsistencyReward(answer_type="distance")
    assert distance.score([answer("10"), answer("10.5")], pair_batch(1)).tolist() == [1.0, 1.0]
    assert distance.score([answer("10"), answer("11.5")], pair_batch(1)).tolist() == [0.0, 0.0]


def test_from_meta_validates_the_distance_tolerance_at_construction():
    assert ConsistencyReward(answer_type="from_meta", distance_tolerance=0.0).distance_tolerance == 0.0
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="distance_tolerance must be a finite number >= 0"):
            ConsistencyReward(answer_type="from_meta", distance_tolerance=bad)


def test_seeded_random_pairing_draws_its_permutations_from_the_seed():
    rng = np.random.default_rng(8)
    completions = [answer(rng.choice(["yes", "no"])) for _ in range(16)]
    samples = pair_batch(8)
    reward = ConsistencyReward(pairing="random", seed=3)
    assert reward.seed == 3
    expected = consistency_rewards(
        completions, samples, pairing="random", generator=batch_generator(3, completions, samples)
    )
    generation_order = consistency_rewards(completions, samples, pairing="random")
    assert expected.tolist() != generation_order.tolist()  # the seed matters for this batch
    assert reward.score(completions, samples).tolist() == expected.tolist()
    assert reward.score(completions, samples).tolist() == expected.tolist()  # again: no state carried between batches


def test_the_random_pairing_of_a_batch_depends_on_the_seed_and_the_batch_only():
    rng = np.random.default_rng(9)
    completions = [answer(rng.choice(["yes", "no"])) for _ in range(16)]
    samples = pair_batch(8)

    def permutation(seed, completions, samples):
        return tuple(torch.randperm(8, generator=batch_generator(seed, completions, samples)).tolist())

    assert permutation(0, completions, samples) == permutation(0, list(completions), [copy.copy(s) for s in samples])
    assert len({permutation(seed, completions, samples) for seed in range(6)}) > 1
    reordered = completions[1:] + completions[:1]
    assert any(permutation(s, completions, samples) != permutation(s, reordered, samples) for s in range(6))


def test_parse_count_accepts_zero():
    assert [parse_count(text) for text in ("0", "1", "2.0", "0.5", "-1")] == [0.0, 1.0, 2.0, None, None]


def test_answer_spec_tolerance_default_bounds_and_use():
    parse, verifier = answer_spec("distance")
    assert parse is parse_distance
    assert (verifier(10.0, 11.0, "identity"), verifier(10.0, 11.5, "identity")) == (1.0, 0.0)  # 10 % by default
    _, loose = answer_spec("distance", 0.5)
    assert loose(10.0, 14.0, "identity") == 1.0  # |4| <= 0.5 * 14
    _, exact = answer_spec("distance", 0.0)
    assert (exact(2.0, 2.0, "identity"), exact(2.0, 2.0000001, "identity")) == (1.0, 0.0)
    for bad in (float("inf"), -0.1, float("nan")):
        with pytest.raises(ValueError, match="distance_tolerance must be a finite number >= 0"):
            answer_spec("distance", bad)


def test_parse_answers_reads_booleans_by_default():
    assert parse_answers([answer("Yes"), answer("no."), answer("3"), "no block"]) == [True, False, None, None]


def test_verification_matrix_of_an_empty_group_is_empty_with_boolean_masks():
    for answers_x, answers_x2 in (([], [True, None]), ([True, None], [])):
        V, valid_x, valid_x2 = verification_matrix(answers_x, answers_x2, "identity")
        assert V.shape == (len(answers_x), len(answers_x2))
        assert (valid_x.dtype, valid_x2.dtype) == (torch.bool, torch.bool)
        assert valid_x.tolist() + valid_x2.tolist() == [True, False]


def test_rewards_stay_in_the_unit_interval_when_a_verifier_leaves_it():
    rows = torch.tensor([[3.0, 3.0], [-2.0, -2.0]])  # a custom verifier's scores outside [0, 1]
    r, r2 = pair_rewards(rows, pairing="one_to_all")
    assert (r.tolist(), r2.tolist()) == ([1.0, 0.0], [0.5, 0.5])
    r, r2 = pair_rewards(rows.T, pairing="one_to_all")
    assert (r.tolist(), r2.tolist()) == ([0.5, 0.5], [1.0, 0.0])


def test_consistency_rewards_checks_its_arguments_and_uses_the_distance_tolerance():
    with pytest.raises(ValueError, match=r"^got 3 completions but 2 samples$"):
        consistency_rewards([answer("yes")] * 3, pair_batch(1))
    with pytest.raises(ValueError, match="distance_tolerance must be a finite number >= 0"):
        consistency_rewards([], [], answer_type="distance", distance_tolerance=-1.0)  # even for an empty batch
    completions = [answer("10"), answer("14")]
    assert consistency_rewards(completions, pair_batch(1), "distance").tolist() == [0.0, 0.0]
    assert consistency_rewards(completions, pair_batch(1), "distance", distance_tolerance=0.5).tolist() == [1.0, 1.0]


def test_the_batch_seed_is_a_stable_digest_of_the_batch_whatever_the_completions_hold():
    """The seed of a batch is fixed by the seed and the batch (BLAKE2b-64 of the seed, then of each completion and
    question with a NUL after it, little-endian, low 63 bits): the same in every process, every run and every version,
    so a resumed run pairs its batches as before. Completions are untrusted: a lone surrogate or a non-string is
    digested too (by its repr) and never raises."""
    x = VisualSample(images=[], question="Is red left of blue?", task="t", meta={"pair_id": 0})
    twin = VisualSample(
        images=[], question="Is blue left of red?", task="t", meta={"pair_id": 0, "relation": "negation"}
    )
    completions = ["<answer>yes</answer>", "caf\u00e9 \ud800", None, 3]
    seeds = [batch_generator(seed, completions, [x, x, twin, twin]).initial_seed() for seed in range(6)]
    assert seeds == [
        4637805612230207227,
        8093916903413437386,
        2304161558234030090,
        8496413660320588047,
        2424032374229937830,  # the digest's bit 63 dropped (this one and the next)
        3015817121652291969,
    ]
    other = [batch_generator(0, [*completions[:3], 4], [x, x, twin, twin]).initial_seed()]  # another non-string
    assert other != seeds[:1]


def test_unseeded_random_pairing_pairs_in_generation_order():
    rng = np.random.default_rng(8)
    completions = [answer(rng.choice(["yes", "no"])) for _ in range(16)]
    samples = pair_batch(8)
    generation_order = consistency_rewards(completions, samples, pairing="random")
    assert ConsistencyReward(pairing="random").score(completions, samples).tolist() == generation_order.tolist()

"""NumericToleranceReward against docs/algorithms.md (Reason-RFT numeric accuracy), on fresh random inputs."""

import math
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from app.rewards.numeric import NumericToleranceReward, numeric_tolerance_reward, tolerance_score
from app.types import VisualSample


def reference(pred, gt, eps1=0.05, eps2=0.20, zero_scale=1.0):
    """docs/algorithms.md, written out again; |gt| replaced by zero_scale when gt == 0 (the documented choice)."""
    a = abs(gt) if gt != 0 else zero_scale
    d = abs(pred - gt)
    if d <= eps1 * a:
        return 1.0
    if d >= eps2 * a:
        return 0.0
    return 0.5 * (math.cos(math.pi * (d - eps1 * a) / ((eps2 - eps1) * a)) + 1)


def wrap(x):
    return f"<think>t</think><answer>{x}</answer>"


def sample(answer):
    return VisualSample(images=[], question="How long?", task="geometry", answer=answer)


def test_fresh_random_values_match_reference(random_seed):  # fresh values: another APP_TEST_SEED
    seed = random_seed
    rng = random.Random(seed)
    preds, gts, expected = [], [], []
    for _ in range(2000):
        gt = rng.choice([-1, 1]) * rng.uniform(0.01, 1000.0)
        pred = gt * (1 + rng.uniform(-0.3, 0.3)) if rng.random() < 0.9 else rng.uniform(-2000, 2000)
        preds.append(pred)
        gts.append(gt)
        expected.append(reference(pred, gt))
    out = numeric_tolerance_reward([wrap(repr(p)) for p in preds], [repr(g) for g in gts])
    assert out.dtype == torch.float32 and out.shape == (2000,)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float32), msg=f"seed {seed}")
    partial = [e for e in expected if 0 < e < 1]
    assert len(partial) > 100, f"seed {seed}: the ramp was hardly sampled"


def test_fresh_random_bands(random_seed):  # fresh values: another APP_TEST_SEED
    seed = random_seed
    rng = random.Random(seed)
    for _ in range(200):
        eps1 = rng.uniform(0, 0.5)
        eps2 = eps1 + rng.uniform(1e-3, 0.5)
        zero_scale = rng.uniform(0.1, 10)
        gt = rng.choice([0.0, rng.uniform(-50, 50)])
        pred = gt + rng.uniform(-1, 1) * (eps2 * (abs(gt) or zero_scale)) * 1.2
        got = numeric_tolerance_reward([wrap(repr(pred))], [repr(gt)], eps1, eps2, zero_scale).item()
        assert got == pytest.approx(reference(pred, gt, eps1, eps2, zero_scale), abs=1e-6), f"seed {seed}"


@pytest.mark.parametrize("sign", [1, -1])
def test_boundaries_exactly_at_eps1_and_eps2(sign, random_seed):
    # gt = 20: eps1 * 20 = 1.0 and eps2 * 20 = 4.0 exactly in binary floating point.
    gt = sign * 20.0
    preds = [gt + 1.0, gt - 1.0, gt + 4.0, gt - 4.0, gt + 2.5, gt]
    out = numeric_tolerance_reward([wrap(p) for p in preds], [str(gt)] * len(preds)).tolist()
    assert out[:4] == [1.0, 1.0, 0.0, 0.0]
    assert out[4] == pytest.approx(0.5)  # midpoint of the ramp
    assert out[5] == 1.0
    # dyadic band: every threshold exact
    rng = random.Random(random_seed)
    for _ in range(100):
        gt = rng.choice([-1, 1]) * rng.randint(1, 2**20) * 2.0 ** rng.randint(-10, 10)
        t1, t2 = 0.25 * abs(gt), 0.5 * abs(gt)
        preds = [gt + t1, gt - t1, gt + t2, gt - t2]
        out = numeric_tolerance_reward([wrap(repr(p)) for p in preds], [repr(gt)] * 4, eps1=0.25, eps2=0.5)
        assert out.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_ramp_is_monotone_and_continuous():
    gt = 10.0
    preds = [gt + k * 0.001 for k in range(0, 3001)]
    out = numeric_tolerance_reward([wrap(repr(p)) for p in preds], [repr(gt)] * len(preds))
    diffs = out[1:] - out[:-1]
    assert (diffs <= 1e-6).all()  # non-increasing in |pred - gt|
    assert diffs.abs().max() < 0.02  # no jump at eps1 or eps2
    assert out[0] == 1 and out[-1] == 0


def test_gt_zero_uses_absolute_scale():
    texts = [wrap(x) for x in ("0", "-0", "0.05", "-0.05", "0.125", "0.2", "-0.2", "1")]
    assert numeric_tolerance_reward(texts, ["0"] * len(texts)).tolist() == pytest.approx(
        [1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0]
    )
    out = numeric_tolerance_reward([wrap("0.5"), wrap("2"), wrap("1.25")], ["0", "0", "-0"], zero_scale=10.0)
    assert out.tolist() == pytest.approx([1.0, 0.0, 0.5])
    reward = NumericToleranceReward(zero_scale=10.0)
    assert reward.score([wrap("0.5")], [sample("0.0")]).tolist() == [1.0]


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (wrap("3/4"), "0.75", 1.0),
        (wrap("$\\frac{3}{4}$"), "75%", 1.0),
        (wrap("12 cm"), "12", 1.0),
        (wrap("\\frac{\\pi}{2}"), "1.5708", 1.0),
        (wrap("2\\sqrt{3}"), "3.4641", 1.0),
        (wrap("45°"), "45^\\circ", 1.0),
        (wrap("1,000"), "1000", 1.0),
        (wrap("seven"), "7", 0.0),
        (wrap(""), "7", 0.0),
        (wrap("7 or 8"), "7", 0.0),
        (wrap("nan"), "7", 0.0),
        (wrap("inf"), "7", 0.0),
        (wrap("1e309"), "7", 0.0),
        (wrap("1" * 100_000), "7", 0.0),
        ("7", "7", 0.0),  # no answer block
        ("<answer>7", "7", 0.0),  # unclosed
        (wrap("1e308"), "-1e308", 0.0),  # |pred - gt| overflows to inf
    ],
)
def test_parsing_and_malformed(completion, answer, expected):
    assert numeric_tolerance_reward([completion], [answer]).tolist() == [expected]


def test_class_matches_functional_and_checks_config():
    reward = NumericToleranceReward(eps1=0.1, eps2=0.3, weight=0.5)
    assert reward.name == "numeric_tolerance" and reward.weight == 0.5 and reward.value_range == (0.0, 1.0)
    texts = [wrap(x) for x in ("10", "11.5", "12", "14", "x")]
    samples = [sample("10")] * len(texts)
    torch.testing.assert_close(
        reward.score(texts, samples), numeric_tolerance_reward(texts, ["10"] * len(texts), eps1=0.1, eps2=0.3)
    )
    for kwargs in ({"eps1": 0.2, "eps2": 0.2}, {"eps1": -0.1}, {"eps2": float("nan")}, {"zero_scale": 0.0}):
        with pytest.raises(ValueError):
            NumericToleranceReward(**kwargs)
        with pytest.raises(ValueError):
            numeric_tolerance_reward([wrap("1")], ["1"], **kwargs)


def test_labels_must_be_numbers():
    with pytest.raises(ValueError, match="labeled samples.*'geometry'"):
        NumericToleranceReward().score([wrap("1")], [sample(None)])
    with pytest.raises(ValueError, match="not a number"):
        numeric_tolerance_reward([wrap("1")], ["about three"])
    with pytest.raises(ValueError, match="answers\\[0\\] is None"):
        numeric_tolerance_reward([wrap("1")], [None])
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        numeric_tolerance_reward([wrap("1"), wrap("2")], ["1"])


@given(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6))
def test_property_matches_reference(pred, gt):
    got = numeric_tolerance_reward([wrap(repr(pred))], [repr(gt)]).item()
    assert got == pytest.approx(reference(pred + 0.0, gt + 0.0), abs=1e-6)
    assert 0.0 <= got <= 1.0


def test_tolerance_score_defaults_are_the_paper_band_and_a_unit_zero_scale():
    preds = (104.0, 106.0, 112.5, 119.0, 120.0, 130.0)
    assert [tolerance_score(p, 100.0) for p in preds] == pytest.approx([reference(p, 100.0) for p in preds])
    assert [tolerance_score(p, 100.0) for p in preds][::2] == pytest.approx([1.0, 0.5, 0.0])
    assert tolerance_score(0.125, 0.0) == pytest.approx(0.5)  # the middle of the absolute band 0.05 .. 0.2


def test_tolerance_score_at_the_limits_of_floating_point():
    # An exact answer scores 1 even when the label is so small that both band edges underflow to 0.
    assert tolerance_score(5e-324, 5e-324) == 1.0
    assert tolerance_score(5e-324, 0.0, zero_scale=5e-324) == 0.0  # |pred| >= eps2 * zero_scale == 0
    # |pred - gt| and eps2 * |gt| both overflow to inf: a relative error of exactly eps2 scores 0, not NaN.
    assert tolerance_score(-1.5e308, 1.5e308, eps1=0.05, eps2=2.0) == 0.0


def test_class_defaults_and_base_arguments():
    reward = NumericToleranceReward()
    assert (reward.eps1, reward.eps2, reward.zero_scale, reward.weight) == (0.05, 0.2, 1.0, 1.0)
    custom = NumericToleranceReward(name="length", weight=0.5, dist_sync_on_step=True)
    assert (custom.name, custom.weight, custom.dist_sync_on_step) == ("length", 0.5, True)
    texts = [wrap(x) for x in ("104", "112.5", "120", "0.125")]
    assert reward.score(texts, [sample("100")] * 3 + [sample("0")]).tolist() == pytest.approx([1.0, 0.5, 0.0, 0.5])


def test_a_zero_eps1_is_a_pure_ramp():
    out = numeric_tolerance_reward([wrap("10"), wrap("10.5"), wrap("12")], ["10"] * 3, eps1=0.0, eps2=0.2)
    assert out.tolist() == pytest.approx([1.0, reference(10.5, 10.0, 0.0, 0.2), 0.0])
    assert 0.0 < out[1] < 1.0
    assert NumericToleranceReward(eps1=0.0).eps1 == 0.0


def test_configuration_and_label_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"^need finite 0 <= eps1 < eps2, got eps1=0.2, eps2=0.2$"):
        NumericToleranceReward(eps1=0.2, eps2=0.2)
    with pytest.raises(ValueError, match=r"^zero_scale must be finite and > 0, got 0.0$"):
        NumericToleranceReward(zero_scale=0)
    with pytest.raises(ValueError, match=r"^numeric_tolerance_reward needs a label for every completion; answers\[1\]"):
        numeric_tolerance_reward([wrap("1")] * 2, ["1", None])
    long_label = "x" * 100  # quoted in the message, cut to 80 characters
    with pytest.raises(ValueError, match=rf"^answers\[1\] = '{'x' * 80}' is not a number parse_number understands$"):
        numeric_tolerance_reward([wrap("1")] * 2, ["1", long_label])


def test_scores_are_float32_under_a_float64_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = numeric_tolerance_reward([wrap("10"), wrap("11.25"), "no block"], ["10"] * 3)
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 0.5, 0.0]

"""GRPO math against straightforward reference computations (loops / numpy) on fresh random tensors."""

import math

import numpy as np
import pytest
import torch

from app.algorithms import (
    aggregate,
    clipped_surrogate,
    group_advantages,
    grpo_loss,
    k3_kl,
    zero_std_groups,
)

SEEDS = [0, 1, 2]


def make_gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_rewards(gen: torch.Generator, num_groups: int, group_size: int) -> torch.Tensor:
    """Gaussian rewards with a few groups forced constant (including a non-dyadic value) to exercise zero std."""
    rewards = torch.randn(num_groups, group_size, generator=gen)
    rewards[0] = 0.1
    rewards[1] = rewards[1, 0]
    binary = torch.randint(0, 2, (group_size,), generator=gen).float()
    rewards[2] = binary
    return rewards.reshape(-1)


def random_mask(gen: torch.Generator, n: int, length: int, empty_rows: int = 0) -> torch.Tensor:
    mask = torch.rand(n, length, generator=gen) < 0.7
    mask[:empty_rows] = False
    return mask


def ref_advantages(rewards: np.ndarray, k: int, scale: str, eps: float) -> np.ndarray:
    out = np.zeros_like(rewards, dtype=np.float64)
    batch_std = rewards.std()  # population std
    for b in range(len(rewards) // k):
        group = rewards[b * k : (b + 1) * k].astype(np.float64)
        if group.max() - group.min() <= 1e-6:
            continue  # no signal: advantage 0
        for i in range(k):
            centered = group[i] - group.mean()
            if scale == "group":
                centered /= group.std() + eps
            elif scale == "batch":
                centered /= batch_std + eps
            out[b * k + i] = centered
    return out


# ---------------------------------------------------------------- advantages


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_reference_loop(seed, scale):
    gen = make_gen(seed)
    num_groups, k = 6, int(torch.randint(2, 9, (1,), generator=gen))
    rewards = random_rewards(gen, num_groups, k)
    adv = group_advantages(rewards, k, scale=scale)
    expected = ref_advantages(rewards.double().numpy(), k, scale, eps=1e-4)
    assert adv.shape == rewards.shape
    np.testing.assert_allclose(adv.double().numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_std_groups_flagged_and_get_exactly_zero_advantage(scale):
    gen = make_gen(3)
    k = 4
    rewards = random_rewards(gen, 5, k)
    flat = zero_std_groups(rewards, k)
    expected = [len(set(rewards[b * k : (b + 1) * k].tolist())) == 1 for b in range(5)]
    assert flat.tolist() == expected
    assert flat[:2].all()
    adv = group_advantages(rewards, k, scale=scale).view(5, k)
    assert torch.equal(adv[flat], torch.zeros_like(adv[flat]))
    assert torch.isclose(flat.float().mean(), torch.tensor(sum(expected) / 5))


def test_groups_of_one_completion_have_no_signal():
    rewards = torch.tensor([0.3, -1.0, 2.0])
    assert zero_std_groups(rewards, 1).tolist() == [True, True, True]
    for scale in ("group", "batch", "none"):
        assert torch.equal(group_advantages(rewards, 1, scale=scale), torch.zeros(3))


def test_zero_std_threshold_is_inclusive():
    rewards = torch.tensor([0.0, 1e-6, 0.0, 2e-6, 0.0, 0.5], dtype=torch.float64)  # spreads 1e-6, 2e-6, 0.5
    assert zero_std_groups(rewards, 2).tolist() == [True, False, False]
    assert zero_std_groups(rewards, 2, atol=0.5).tolist() == [True, True, True]
    assert zero_std_groups(rewards, 2, atol=0.25).tolist() == [True, True, False]


def test_default_scale_is_group_and_rewards_are_at_least_float32():
    gen = make_gen(7)
    rewards = random_rewards(gen, 4, 3)
    expected = group_advantages(rewards, 3, scale="group")
    assert torch.equal(group_advantages(rewards, 3), expected)
    assert not torch.equal(expected, group_advantages(rewards, 3, scale="batch"))
    half = rewards.to(torch.bfloat16)
    got = group_advantages(half, 3)
    assert got.dtype == torch.float32
    assert torch.equal(got, group_advantages(half.float(), 3))
    assert group_advantages(rewards.double(), 3).dtype == torch.float64
    assert group_advantages(torch.tensor([0, 2, 1, 1]), 2, scale="none").tolist() == [-1.0, 1.0, 0.0, 0.0]


def test_advantage_input_errors():
    with pytest.raises(
        ValueError, match=r"\(7\) is not divisible by group_size \(3\); rows must be group-major, B prompts x K"
    ):
        group_advantages(torch.zeros(7), 3)
    with pytest.raises(ValueError, match=r"rewards must be 1-D \[N\], got shape \(2, 2\)"):
        group_advantages(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        zero_std_groups(torch.zeros(4), 0)
    bad = torch.tensor([1.0, float("nan"), 0.0, float("inf"), 2.0, 3.0])
    with pytest.raises(ValueError, match="rewards must be finite: 2 of 6"):
        group_advantages(bad, 3)
    with pytest.raises(ValueError, match="scale must be"):
        group_advantages(torch.zeros(4), 2, scale="std")


# ---------------------------------------------------------------- ratio and gradient


@pytest.mark.parametrize("seed", SEEDS)
def test_ratio_is_exactly_one_and_gradient_is_minus_advantage_over_tokens(seed):
    gen = make_gen(seed)
    n, length = 8, 11
    logprobs = (torch.randn(n, length, generator=gen) - 2.0).requires_grad_()
    advantages = torch.randn(n, generator=gen)
    mask = random_mask(gen, n, length, empty_rows=1)
    out = grpo_loss(logprobs, logprobs.detach(), advantages, mask)
    _, ratio, is_clipped = clipped_surrogate(logprobs, logprobs.detach(), advantages, 0.2, 0.2)
    assert torch.equal(ratio, torch.ones_like(ratio))
    assert not is_clipped.any()
    assert out.ratio_mean.item() == 1.0 and out.clip_fraction.item() == 0.0
    out.loss.backward()
    num_tokens = int(mask.sum())
    expected = np.zeros((n, length))
    for i in range(n):
        for t in range(length):
            if mask[i, t]:
                expected[i, t] = -advantages[i].item() / num_tokens
    np.testing.assert_allclose(logprobs.grad.numpy(), expected, rtol=1e-5, atol=1e-8)


def test_gradient_matches_finite_differences():
    gen = make_gen(4)
    n, length = 4, 5
    old = torch.randn(n, length, generator=gen, dtype=torch.float64) - 1.0
    advantages = torch.randn(n, generator=gen, dtype=torch.float64)
    ref = old + 0.1 * torch.randn(n, length, generator=gen, dtype=torch.float64)
    mask = random_mask(gen, n, length)

    def loss(logprobs):
        return grpo_loss(logprobs, old, advantages, mask, beta=0.05, ref_logprobs=ref).loss

    start = (old + 0.01 * torch.randn(n, length, generator=gen, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(loss, (start,))


# ---------------------------------------------------------------- clipping


def ratios_by_regime(gen, n, length, eps_low, eps_high):
    """Ratios well inside one of three regimes: below 1 - eps_low, inside the trust region, above 1 + eps_high."""
    regime = torch.randint(0, 3, (n, length), generator=gen)
    u = torch.rand(n, length, generator=gen)
    low = 0.2 + u * (1 - eps_low - 0.05 - 0.2)
    mid = (1 - eps_low + 0.05) + u * (eps_low + eps_high - 0.1)
    high = (1 + eps_high + 0.05) + u * 0.8
    return torch.stack([low, mid, high])[regime, torch.arange(n)[:, None], torch.arange(length)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("eps_low", "eps_high"), [(0.2, 0.2), (0.2, 0.28), (0.1, 0.3)])
def test_clipping_flags_and_zero_gradient(seed, eps_low, eps_high):
    gen = make_gen(seed)
    n, length = 10, 12
    old = torch.randn(n, length, generator=gen) - 1.0
    ratios = ratios_by_regime(gen, n, length, eps_low, eps_high)
    advantages = torch.randn(n, generator=gen)
    advantages[0], advantages[1] = advantages[0].abs() + 0.1, -advantages[1].abs() - 0.1  # both signs present
    logprobs = (old + ratios.log()).requires_grad_()
    mask = torch.ones(n, length, dtype=torch.bool)
    per_token, ratio, is_clipped = clipped_surrogate(logprobs, old, advantages, eps_low, eps_high)
    out = grpo_loss(logprobs, old, advantages, mask, eps_low=eps_low, eps_high=eps_high)
    out.loss.backward()

    r, a = ratios.double().numpy(), advantages.double().numpy()[:, None]
    expected_clipped = ((a > 0) & (r > 1 + eps_high)) | ((a < 0) & (r < 1 - eps_low))
    expected_loss = -np.minimum(r * a, np.clip(r, 1 - eps_low, 1 + eps_high) * a)
    expected_grad = np.where(expected_clipped, 0.0, -r * a) / (n * length)
    high_negative = (r > 1 + eps_high) & (a < 0)
    assert expected_clipped.any() and (~expected_clipped).any() and high_negative.any()  # every case is exercised
    np.testing.assert_allclose(ratio.detach().numpy(), r, rtol=1e-5)
    assert np.array_equal(is_clipped.numpy(), expected_clipped)
    np.testing.assert_allclose(per_token.detach().numpy(), expected_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logprobs.grad.numpy(), expected_grad, rtol=1e-5, atol=1e-9)
    assert math.isclose(out.clip_fraction.item(), expected_clipped.mean(), abs_tol=1e-6)
    # above 1 + eps_high with a negative advantage: the min picks the unclipped term, the gradient flows
    assert not is_clipped.numpy()[high_negative].any()
    assert (logprobs.grad.numpy()[high_negative] > 0).all()


def test_asymmetric_clip_range():
    old = torch.zeros(2, 2)
    ratios = torch.tensor([[1.25, 1.35], [0.95, 0.85]])  # eps_low = 0.1, eps_high = 0.3
    advantages = torch.tensor([1.0, -1.0])
    per_token, _, is_clipped = clipped_surrogate(ratios.log(), old, advantages, eps_low=0.1, eps_high=0.3)
    assert is_clipped.tolist() == [[False, True], [False, True]]
    torch.testing.assert_close(per_token, torch.tensor([[-1.25, -1.3], [0.95, 0.9]]))


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize("seed", SEEDS)
def test_k3_kl_nonnegative_zero_at_equality_and_matches_formula(seed):
    gen = make_gen(seed)
    logprobs = torch.randn(6, 9, generator=gen) * 2 - 1
    ref = torch.randn(6, 9, generator=gen) * 2 - 1
    kl = k3_kl(logprobs, ref)
    d = (ref - logprobs).double().numpy()
    np.testing.assert_allclose(kl.numpy(), np.exp(d) - d - 1, rtol=1e-5, atol=1e-6)
    assert (kl >= 0).all()
    assert torch.equal(k3_kl(logprobs, logprobs), torch.zeros_like(logprobs))
    tiny = logprobs + 1e-7 * torch.randn(6, 9, generator=gen)
    assert (k3_kl(logprobs, tiny) >= 0).all()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("aggregation", "max_length"), [("token_mean", None), ("sequence_mean", None), ("constant", None), ("constant", 16)]
)
def test_loss_adds_beta_kl_per_token(seed, aggregation, max_length):
    gen = make_gen(seed)
    n, length, beta = 6, 7, 0.04
    old = torch.randn(n, length, generator=gen) - 1
    logprobs = old + 0.1 * torch.randn(n, length, generator=gen)
    ref = old + 0.3 * torch.randn(n, length, generator=gen)
    advantages = torch.randn(n, generator=gen)
    mask = random_mask(gen, n, length, empty_rows=1)
    out = grpo_loss(
        logprobs, old, advantages, mask, beta=beta, ref_logprobs=ref, aggregation=aggregation, max_length=max_length
    )

    r = np.exp((logprobs - old).double().numpy())
    a = advantages.double().numpy()[:, None]
    d = (ref - logprobs).double().numpy()
    policy_tok = -np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)
    kl_tok = np.exp(d) - d - 1
    m = mask.numpy()
    expected_loss = ref_aggregate(policy_tok + beta * kl_tok, m, aggregation, max_length)
    np.testing.assert_allclose(out.loss.item(), expected_loss, rtol=1e-5)
    np.testing.assert_allclose(out.policy_loss.item(), ref_aggregate(policy_tok, m, aggregation, max_length), rtol=1e-5)
    np.testing.assert_allclose(out.kl.item(), ref_aggregate(kl_tok, m, aggregation, max_length), rtol=1e-5)
    assert out.kl.item() >= 0 and not out.kl.requires_grad
    torch.testing.assert_close(out.loss, out.policy_loss + beta * out.kl)


def test_beta_zero_logs_kl_without_adding_it():
    gen = make_gen(5)
    old = torch.randn(3, 4, generator=gen)
    ref = old + torch.randn(3, 4, generator=gen)
    advantages, mask = torch.randn(3, generator=gen), torch.ones(3, 4)
    with_ref = grpo_loss(old, old, advantages, mask, ref_logprobs=ref)
    without = grpo_loss(old, old, advantages, mask)
    assert torch.equal(with_ref.loss, without.loss)
    assert with_ref.kl.item() > 0
    assert torch.equal(without.kl, torch.tensor(0.0))


def test_beta_zero_ignores_even_an_overflowing_kl():
    old = torch.full((2, 3), -100.0)
    ref = torch.full((2, 3), -1.0)  # d = 99: exp(d) overflows float32, the k3 KL is inf
    advantages, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 3)
    out = grpo_loss(old, old, advantages, mask, beta=0.0, ref_logprobs=ref)
    assert math.isinf(out.kl.item())
    assert torch.equal(out.loss, grpo_loss(old, old, advantages, mask).loss)


def test_half_precision_inputs_are_computed_in_float32():
    gen = make_gen(8)
    old = (torch.randn(3, 5, generator=gen) - 1).to(torch.bfloat16)
    logprobs = (old.float() + 0.2 * torch.randn(3, 5, generator=gen)).to(torch.bfloat16)
    ref = (old.float() + 0.2 * torch.randn(3, 5, generator=gen)).to(torch.bfloat16)
    advantages, mask = torch.randn(3, generator=gen).to(torch.bfloat16), random_mask(gen, 3, 5)
    kwargs = dict(beta=0.1, aggregation="sequence_mean")
    out = grpo_loss(logprobs, old, advantages, mask, ref_logprobs=ref, **kwargs)
    expected = grpo_loss(logprobs.float(), old.float(), advantages.float(), mask, ref_logprobs=ref.float(), **kwargs)
    for name in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
        got = getattr(out, name)
        assert got.dtype == torch.float32 and torch.equal(got, getattr(expected, name)), name


def test_a_zero_width_clip_range_clips_every_moved_ratio():
    """(The bounds of the clip range and beta are checked where a config sets them: tests/modules/test_settings.py.)"""
    x, adv, mask = torch.zeros(3, 4), torch.ones(3), torch.ones(3, 4)
    out = grpo_loss(x + 0.1, x, adv, mask, eps_low=0.0, eps_high=0.0)  # zero width: every ratio != 1 is clipped
    assert out.clip_fraction.item() == 1.0 and math.isclose(out.loss.item(), -1.0)


def test_loss_input_errors():
    with pytest.raises(ValueError, match=r"logprobs must be \[N, L\], got shape \(3,\)"):
        grpo_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3))
    x, adv, mask = torch.zeros(3, 4), torch.zeros(3), torch.ones(3, 4)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        grpo_loss(x, x, adv, mask, beta=0.01)
    with pytest.raises(ValueError, match=r"old_logprobs has shape \(3, 5\), logprobs has \(3, 4\)"):
        grpo_loss(x, torch.zeros(3, 5), adv, mask)
    with pytest.raises(ValueError, match=r"mask has shape \(4, 3\)"):
        grpo_loss(x, x, adv, torch.ones(4, 3))
    with pytest.raises(ValueError, match=r"advantages must be \[N\] = \(3,\), got \(3, 4\)"):
        grpo_loss(x, x, x, mask)
    with pytest.raises(ValueError, match=r"ref_logprobs has shape \(2, 4\)"):
        grpo_loss(x, x, adv, mask, beta=0.1, ref_logprobs=torch.zeros(2, 4))


# ---------------------------------------------------------------- aggregation


def ref_aggregate(values: np.ndarray, mask: np.ndarray, mode: str, max_length: int | None = None) -> float:
    total, count, row_means = 0.0, 0, []
    for i in range(values.shape[0]):
        row = [values[i, t] for t in range(values.shape[1]) if mask[i, t]]
        total += sum(row)
        count += len(row)
        if row:
            row_means.append(sum(row) / len(row))
    if mode == "token_mean":
        return total / max(count, 1)
    if mode == "sequence_mean":
        return sum(row_means) / max(len(row_means), 1)
    return total / (values.shape[0] * (max_length or values.shape[1]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("mode", "max_length"), [("token_mean", None), ("sequence_mean", None), ("constant", None), ("constant", 32)]
)
def test_aggregate_matches_reference(seed, mode, max_length):
    gen = make_gen(seed)
    n, length = 7, 9
    values = torch.randn(n, length, generator=gen)
    mask = random_mask(gen, n, length, empty_rows=2)
    mask = mask[torch.randperm(n, generator=gen)]  # empty rows anywhere
    values[~mask] = float("nan")  # padding must never leak into the result
    got = aggregate(values, mask, mode, max_length)
    expected = ref_aggregate(values.double().numpy(), mask.numpy(), mode, max_length)
    assert math.isclose(got.item(), expected, rel_tol=1e-5, abs_tol=1e-7)
    # same result with a 0/1 float mask
    assert torch.equal(aggregate(values, mask.float(), mode, max_length), got)


@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean", "constant"])
def test_empty_mask_gives_connected_zero(mode):
    gen = make_gen(6)
    logprobs = torch.randn(4, 5, generator=gen).requires_grad_()
    mask = torch.zeros(4, 5, dtype=torch.bool)
    got = aggregate(logprobs * 2, mask, mode)
    assert got.item() == 0.0 and got.grad_fn is not None
    out = grpo_loss(logprobs, logprobs.detach(), torch.randn(4, generator=gen), mask, aggregation=mode)
    assert out.loss.item() == 0.0
    assert not any(torch.isnan(t).any() for t in (out.policy_loss, out.clip_fraction, out.ratio_mean))
    out.loss.backward()
    assert torch.equal(logprobs.grad, torch.zeros_like(logprobs))


def test_aggregate_errors():
    with pytest.raises(ValueError, match="same shape"):
        aggregate(torch.zeros(2, 3), torch.ones(3, 2), "token_mean")
    with pytest.raises(ValueError, match="mode must be"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "sum")
    with pytest.raises(ValueError, match="max_length must be >= 1, got 0"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "constant", max_length=0)


def test_aggregate_with_single_tokens_and_a_single_row():
    values = torch.tensor([[2.0, 3.0, 5.0], [7.0, 11.0, 13.0], [17.0, 19.0, 23.0]], dtype=torch.float64)
    one_token = torch.tensor([[0, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.bool)
    for mode in ("token_mean", "sequence_mean"):
        assert aggregate(values, one_token, mode).item() == 11.0
    assert aggregate(values, one_token, "constant", max_length=1).item() == 11.0 / 3
    one_per_row = torch.eye(3, dtype=torch.bool)
    assert aggregate(values, one_per_row, "sequence_mean").item() == (2.0 + 11.0 + 23.0) / 3
    one_row = torch.tensor([[0, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    assert aggregate(values, one_row, "sequence_mean").item() == 9.0

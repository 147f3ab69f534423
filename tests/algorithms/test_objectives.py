"""The GRPO objectives beside PPO-clip, against float64 references written as plain loops over rows and tokens: GSPO's
sequence-level ratio (``importance_sampling_level="sequence"``), CISPO (``objective="cispo"``) and off-policy sequence
masking (``off_policy_max_log_ratio`` / ``off_policy_max_kl``), each through ``grpo_loss`` with the three aggregations
and the k3 KL; loss, statistics and the gradient of the log-probs (derived by hand in the reference, not by autograd).

Tolerances. Float64 inputs: the loss is a sum of about N * L = 48 terms of O(1), each a handful of exp / log / product
operations, so both sides round to within ~100 ulp of the exact value (1e-14 relative); ``TIGHT`` (1e-12) leaves two
orders of magnitude of room while catching any wrong term (a dropped token changes the loss by ~1e-2). Float32 inputs
(the upcast-free path the modules take on CPU): the same expression in float32 rounds each operation at 2^-24 = 6e-8
relative, and the sums accumulate at most ~log2(48) + 10 of those, i.e. < 1e-6 relative; ``FLOAT32`` (rtol 1e-5, atol
1e-6) keeps a 10x margin. The float64 reference is computed from the float32 values themselves, so only the
arithmetic differs (a clip decision could flip only for a ratio within 1e-7 of a bound, which these inputs avoid).
``clip_fraction`` and ``off_policy_masked`` are ratios of counts that ``grpo_loss`` takes in float32 whatever the
inputs (as it always has for the clip fraction): they are compared at ``FLOAT32`` (a count ratio rounds at 6e-8).
"""

import math

import numpy as np
import pytest
import torch

from app.algorithms import (
    cispo_surrogate,
    clipped_surrogate,
    grpo_loss,
    gspo_surrogate,
    high_entropy_mask,
    off_policy_mask,
    sequence_log_ratio,
)

AGGREGATIONS = ("token_mean", "sequence_mean", "constant")
N, L, MAX_LENGTH = 8, 6, 9
TIGHT = dict(rtol=1e-12, atol=1e-12)
FLOAT32 = dict(rtol=1e-5, atol=1e-6)


def case(seed: int, dtype=torch.float64, spread: float = 0.3):
    """Log-probs ``[N, L]`` (NaN on padding, which must never leak), old log-probs ``spread`` away, reference
    log-probs, advantages ``[N]`` and a mask with an empty row and a single-token row. Whatever the seed, row 0 has
    every ratio e^0.5 and A > 0, row 1 every ratio e^-0.5 and A < 0 (both clipped, at token and at sequence level, by
    any clip range below 0.39, and masked by a log-ratio threshold below 0.5), and row 6 is on-policy (never clipped or
    masked)."""
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(N, L, generator=g, dtype=torch.float64) * 2
    old = logprobs + spread * torch.randn(N, L, generator=g, dtype=torch.float64)
    ref = logprobs + 0.3 * torch.randn(N, L, generator=g, dtype=torch.float64)
    advantages = torch.randn(N, generator=g, dtype=torch.float64)
    old[0], old[1], old[6] = logprobs[0] - 0.5, logprobs[1] + 0.5, logprobs[6]
    advantages[0], advantages[1] = advantages[0].abs() + 0.1, -advantages[1].abs() - 0.1
    mask = torch.rand(N, L, generator=g) < 0.7
    mask[:, 0] = True
    mask[2] = False  # a row without a token
    mask[5] = False
    mask[5, 3] = True  # a row with a single token
    logprobs = torch.where(mask, logprobs, torch.nan)
    return tuple(t.to(dtype) for t in (logprobs, old, ref, advantages)) + (mask,)


# ------------------------------------------------------------------------------------------------ the reference
def token_weights(mask: np.ndarray, aggregation: str, max_length: int) -> np.ndarray:
    """``c[i, t]``: what a per-token loss of 1 on token (i, t) adds to the aggregated loss."""
    n, _ = mask.shape
    c = np.zeros(mask.shape)
    rows = sum(1 for i in range(n) if mask[i].any())
    total = mask.sum()
    for i in range(n):
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            if aggregation == "token_mean":
                c[i, t] = 1.0 / total
            elif aggregation == "sequence_mean":
                c[i, t] = 1.0 / (rows * mask[i].sum())
            else:
                c[i, t] = 1.0 / (n * max_length)
    return c


def reference(
    logprobs,
    old,
    advantages,
    mask,
    *,
    level="token",
    objective="ppo_clip",
    eps_low=0.2,
    eps_high=0.2,
    beta=0.0,
    ref=None,
    aggregation="token_mean",
    max_length=MAX_LENGTH,
    max_log_ratio=None,
    max_kl=None,
    entropy=None,
    top_entropy_quantile=1.0,
):
    """Loss, policy loss, KL, clip fraction, masked fraction, kept rows and d loss / d logprobs, in float64 loops.

    With ``top_entropy_quantile < 1`` a token's policy term counts only if its entropy is at or above the
    ``1 - quantile`` quantile (linear interpolation) of the masked tokens' entropies."""
    lp, lo, adv, m = (np.asarray(x.detach(), dtype=np.float64) for x in (logprobs, old, advantages, mask))
    m = m.astype(bool)
    high = np.ones_like(m)
    if top_entropy_quantile < 1:
        h = np.asarray(entropy, dtype=np.float64)
        threshold = np.quantile(h[m], 1 - top_entropy_quantile)
        high = m & (h >= threshold)
    lr = np.asarray(ref, dtype=np.float64) if ref is not None else None
    n, length = lp.shape
    c = token_weights(m, aggregation, max_length)
    keep, masked_rows, rows = [], 0, 0
    for i in range(n):
        tokens = [t for t in range(length) if m[i, t]]
        log_s = sum(lp[i, t] - lo[i, t] for t in tokens) / max(len(tokens), 1)
        r = [math.exp(lp[i, t] - lo[i, t]) for t in tokens]
        kl = sum(x - 1 - math.log(x) for x in r) / max(len(tokens), 1)
        kept = not (max_log_ratio is not None and abs(log_s) > max_log_ratio)
        kept = kept and not (max_kl is not None and kl > max_kl)
        keep.append(kept)
        rows += bool(tokens)
        masked_rows += bool(tokens) and not kept
    policy, kl_total, grad = 0.0, 0.0, np.zeros_like(lp)
    clipped_tokens = 0
    for i in range(n):
        tokens = [t for t in range(length) if m[i, t]]
        if not tokens:
            continue
        if level == "sequence":
            s = math.exp(sum(lp[i, t] - lo[i, t] for t in tokens) / len(tokens))
            bounded = min(max(s, 1 - eps_low), 1 + eps_high)
            clipped = bounded * adv[i] < s * adv[i]
            loss_i = -(bounded if clipped else s) * adv[i]
            dloss_ds = 0.0 if clipped else -adv[i]
            clipped_tokens += clipped * len(tokens)
            weight = sum(c[i, t] * high[i, t] for t in tokens)  # the row's loss sits on each of its (selected) tokens
            policy += keep[i] * weight * loss_i
            for t in tokens:  # ds / dlogp_t = s / |M_i|
                grad[i, t] += keep[i] * weight * dloss_ds * s / len(tokens)
        for t in tokens:
            rho = math.exp(lp[i, t] - lo[i, t])
            bounded = min(max(rho, 1 - eps_low), 1 + eps_high)
            if level == "token" and objective == "ppo_clip":
                clipped = bounded * adv[i] < rho * adv[i]
                loss_t = -(bounded if clipped else rho) * adv[i]
                dloss = 0.0 if clipped else -adv[i] * rho  # d(rho) / dlogp = rho
                clipped_tokens += clipped
            elif level == "token":  # cispo: the weight is a constant of the gradient
                loss_t = -bounded * adv[i] * lp[i, t]
                dloss = -bounded * adv[i]
                clipped_tokens += bounded * adv[i] < rho * adv[i]
            else:
                loss_t = dloss = 0.0  # done per row above
            policy += keep[i] * high[i, t] * c[i, t] * loss_t
            grad[i, t] += keep[i] * high[i, t] * c[i, t] * dloss
            if lr is not None:
                d = lr[i, t] - lp[i, t]
                kl_total += keep[i] * c[i, t] * (math.exp(d) - d - 1)
                grad[i, t] += beta * keep[i] * c[i, t] * (1 - math.exp(d))  # d k3 / dlogp = 1 - e^d
    return {
        "loss": policy + beta * kl_total,
        "policy_loss": policy,
        "kl": kl_total,
        "clip_fraction": clipped_tokens / max(m.sum(), 1),
        "off_policy_masked": masked_rows / max(rows, 1),
        "keep": keep,
        "grad": np.where(m, grad, 0.0),
    }


def run(logprobs, old, advantages, mask, ref=None, **options):
    """``grpo_loss`` and the gradient of its loss with respect to ``logprobs`` (0 on padding)."""
    logprobs = logprobs.detach().requires_grad_(True)
    out = grpo_loss(logprobs, old, advantages, mask, ref_logprobs=ref, max_length=MAX_LENGTH, **options)
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    return out, torch.where(mask, grad, torch.zeros_like(grad))


def reference_options(options: dict) -> dict:
    names = {
        "importance_sampling_level": "level",
        "off_policy_max_log_ratio": "max_log_ratio",
        "off_policy_max_kl": "max_kl",
    }
    return {names.get(k, k): v for k, v in options.items()}


def check_against_reference(seed, dtype=torch.float64, tolerance=TIGHT, spread=0.3, **options):
    logprobs, old, ref, advantages, mask = case(seed, dtype, spread)
    ref = ref if options.get("beta", 0) > 0 else None
    out, grad = run(logprobs, old, advantages, mask, ref, **options)
    expected = reference(logprobs, old, advantages, mask, ref=ref, **reference_options(options))
    masking = options.get("off_policy_max_log_ratio") is not None or options.get("off_policy_max_kl") is not None
    assert (out.off_policy_masked is not None) == masking  # the fraction exists only where masking is on
    for name in ("loss", "policy_loss", "kl", "clip_fraction", "off_policy_masked"):
        if name == "off_policy_masked" and not masking:
            assert expected[name] == 0
            continue
        actual = getattr(out, name).double()
        expected_value = torch.tensor(expected[name], dtype=torch.float64)
        counted = name in ("clip_fraction", "off_policy_masked")  # fractions of counts, taken in float32
        torch.testing.assert_close(actual, expected_value, msg=name, **(FLOAT32 if counted else tolerance))
    torch.testing.assert_close(grad.double(), torch.from_numpy(expected["grad"]), msg="gradient", **tolerance)
    return out, expected


# -------------------------------------------------------------------------------------------------------- GSPO
def test_sequence_log_ratio_is_the_masked_mean_token_log_ratio(random_seed):
    logprobs, old, _, _, mask = case(random_seed)
    expected = [
        np.mean([float(logprobs[i, t] - old[i, t]) for t in range(L) if mask[i, t]]) if mask[i].any() else 0.0
        for i in range(N)
    ]
    torch.testing.assert_close(sequence_log_ratio(logprobs, old, mask), torch.tensor(expected), **TIGHT)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_gspo_loss_and_gradient_match_the_float64_reference(aggregation, beta, random_seed):
    out, _ = check_against_reference(
        random_seed,
        importance_sampling_level="sequence",
        eps_low=0.03,
        eps_high=0.04,
        beta=beta,
        aggregation=aggregation,
    )
    assert 0 < out.clip_fraction < 1, "some rows should be clipped and some not"


def test_gspo_surrogate_broadcasts_each_row_s_loss_and_clip_to_its_tokens(random_seed):
    logprobs, old, _, advantages, mask = case(random_seed)
    loss, ratio, clipped = gspo_surrogate(logprobs, old, advantages, mask, 0.03, 0.04)
    assert loss.shape == clipped.shape == (N, L) and ratio.shape == (N,)
    assert torch.equal(loss, loss[:, :1].expand(N, L)) and torch.equal(clipped, clipped[:, :1].expand(N, L))
    torch.testing.assert_close(ratio, sequence_log_ratio(logprobs, old, mask).exp(), **TIGHT)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_gspo_gradient_equals_the_gspo_token_form_s(aggregation, beta, random_seed):
    """GSPO-token: s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)] has the value s_i and, with one advantage per row, the
    gradient of the plain sequence form under every aggregation (here by autograd on the token form)."""
    logprobs, old, ref, advantages, mask = case(random_seed)
    ref = ref if beta > 0 else None
    options = dict(eps_low=0.03, eps_high=0.04, beta=beta, aggregation=aggregation)
    out, grad = run(logprobs, old, advantages, mask, ref, importance_sampling_level="sequence", **options)

    token_form = logprobs.detach().requires_grad_(True)
    s = sequence_log_ratio(token_form, old, mask).exp()  # [N]
    s_token = s.detach()[:, None] * torch.exp(token_form - token_form.detach())  # [N, L], value s_i
    unclipped = s_token * advantages[:, None]
    clipped = s_token.clamp(1 - 0.03, 1 + 0.04) * advantages[:, None]
    per_token = -torch.minimum(unclipped, clipped)
    if ref is not None:
        per_token = per_token + beta * (torch.expm1(ref - token_form) - (ref - token_form))
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    counts = mask.sum(dim=1)
    if aggregation == "token_mean":
        loss = per_token.sum() / mask.sum()
    elif aggregation == "sequence_mean":
        loss = (per_token.sum(dim=1)[counts > 0] / counts[counts > 0]).mean()
    else:
        loss = per_token.sum() / (N * MAX_LENGTH)
    (token_grad,) = torch.autograd.grad(loss, token_form)
    torch.testing.assert_close(out.loss, loss, **TIGHT)
    torch.testing.assert_close(grad, torch.where(mask, token_grad, torch.zeros_like(token_grad)), **TIGHT)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_with_one_token_per_row_is_the_token_level_loss(aggregation, random_seed):
    """One token per row: the sequence ratio is that token's ratio, so loss, clipping and gradient are PPO-clip's."""
    logprobs, old, ref, advantages, _ = case(random_seed)
    g = torch.Generator().manual_seed(random_seed)
    mask = torch.zeros(N, L, dtype=torch.bool)
    mask[torch.arange(N), torch.randint(0, L, (N,), generator=g)] = True
    logprobs = torch.where(mask, logprobs.nan_to_num(-1.0), torch.nan)
    options = dict(eps_low=0.1, eps_high=0.15, beta=0.1, aggregation=aggregation)
    sequence, sequence_grad = run(logprobs, old, advantages, mask, ref, importance_sampling_level="sequence", **options)
    token, token_grad = run(logprobs, old, advantages, mask, ref, **options)
    assert token.clip_fraction > 0
    for name in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
        torch.testing.assert_close(getattr(sequence, name), getattr(token, name), msg=name, **TIGHT)
    torch.testing.assert_close(sequence_grad, token_grad, **TIGHT)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_on_policy_is_the_token_level_loss(aggregation, random_seed):
    """At ratio 1 (one update per rollout) the gradient of each token is -A c_t either way."""
    logprobs, _, ref, advantages, mask = case(random_seed)
    old = logprobs.detach()
    options = dict(beta=0.1, aggregation=aggregation)
    sequence, sequence_grad = run(logprobs, old, advantages, mask, ref, importance_sampling_level="sequence", **options)
    token, token_grad = run(logprobs, old, advantages, mask, ref, **options)
    torch.testing.assert_close(sequence.loss, token.loss, **TIGHT)
    torch.testing.assert_close(sequence_grad, token_grad, **TIGHT)
    assert sequence.ratio_mean == 1 and sequence.clip_fraction == 0


# ------------------------------------------------------------------------------------------------------- CISPO
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("eps_low", [0.2, 1.0], ids=["two_sided", "upper_only"])
def test_cispo_loss_and_gradient_match_the_float64_reference(aggregation, beta, eps_low, random_seed):
    out, _ = check_against_reference(
        random_seed, objective="cispo", eps_low=eps_low, eps_high=0.28, beta=beta, aggregation=aggregation
    )
    assert out.clip_fraction > 0


def test_cispo_trains_the_tokens_ppo_clip_clips_with_the_capped_weight():
    """Ratios above 1 + eps_high with A > 0 and below 1 - eps_low with A < 0: PPO-clip gives them no gradient; CISPO
    gives each -w A / (tokens) with w the bound, and both count them as clipped."""
    ratios = torch.tensor([[1.5, 1.0, 1.1], [0.5, 1.0, 0.9]], dtype=torch.float64)
    advantages = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    logprobs = torch.log(torch.tensor([[0.3, 0.2, 0.1], [0.4, 0.5, 0.6]], dtype=torch.float64))
    old = logprobs - ratios.log()
    options = dict(eps_low=0.2, eps_high=0.2)
    ppo, ppo_grad = run(logprobs, old, advantages, mask, **options)
    cispo, cispo_grad = run(logprobs, old, advantages, mask, objective="cispo", **options)
    assert ppo_grad[0, 0] == 0 and ppo_grad[1, 0] == 0
    torch.testing.assert_close(cispo_grad[0, 0], torch.tensor(-1.2 * 1.0 / 6, dtype=torch.float64), **TIGHT)
    torch.testing.assert_close(cispo_grad[1, 0], torch.tensor(-0.8 * -2.0 / 6, dtype=torch.float64), **TIGHT)
    torch.testing.assert_close(cispo_grad[:, 1:], ppo_grad[:, 1:], **TIGHT)  # inside the range: the same gradient
    assert ppo.clip_fraction == cispo.clip_fraction == 2 / 6


def test_cispo_on_policy_has_the_gradient_of_ppo_clip(random_seed):
    logprobs, _, _, advantages, mask = case(random_seed)
    old = logprobs.detach()
    _, ppo_grad = run(logprobs, old, advantages, mask)
    cispo, cispo_grad = run(logprobs, old, advantages, mask, objective="cispo")
    torch.testing.assert_close(cispo_grad, ppo_grad, **TIGHT)
    assert cispo.clip_fraction == 0 and cispo.ratio_mean == 1


def test_cispo_weight_is_detached_and_unbounded_below_with_eps_low_one():
    logprobs = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[1.0, -2.5]], dtype=torch.float64)  # ratios e^-2 (far below 1) and e^0.5
    loss, ratio, clipped = cispo_surrogate(logprobs, old, torch.tensor([1.0], dtype=torch.float64), 1.0, 0.28)
    expected = -torch.stack([ratio[0, 0], torch.tensor(1.28, dtype=torch.float64)]) * logprobs.detach()[0]
    torch.testing.assert_close(loss[0], expected, **TIGHT)
    (grad,) = torch.autograd.grad(loss.sum(), logprobs)
    torch.testing.assert_close(grad[0], -torch.stack([ratio[0, 0], torch.tensor(1.28, dtype=torch.float64)]), **TIGHT)
    assert clipped.tolist() == [[False, True]] and not ratio.requires_grad


# ---------------------------------------------------------------------------------------- off-policy masking
def drifted_rows():
    """Row 0 on-policy, rows 1 / 2 shifted by +0.5 / -0.5 on every token (|log s| = 0.5, k3 ~ 0.15 / 0.11), row 3
    +1 / -1 on alternate tokens (log s = 0, k3 ~ 0.54), row 4 without a token, row 5 shifted by 0.1 (k3 ~ 0.005)."""
    logprobs = torch.full((6, 4), -1.0, dtype=torch.float64)
    shift = torch.zeros(6, 4, dtype=torch.float64)
    shift[1], shift[2], shift[3], shift[5] = 0.5, -0.5, torch.tensor([1.0, -1.0, 1.0, -1.0]), 0.1
    mask = torch.ones(6, 4, dtype=torch.bool)
    mask[4] = False
    return logprobs, logprobs - shift, mask


@pytest.mark.parametrize(
    "max_log_ratio, max_kl, kept",
    [
        (None, None, [True] * 6),
        (0.3, None, [True, False, False, True, True, True]),
        (0.6, None, [True] * 6),
        (None, 0.3, [True, True, True, False, True, True]),
        (None, 0.12, [True, False, True, False, True, True]),
        (0.3, 0.3, [True, False, False, False, True, True]),
    ],
)
def test_off_policy_mask_leaves_out_the_drifted_rows(max_log_ratio, max_kl, kept):
    logprobs, old, mask = drifted_rows()
    keep = off_policy_mask(logprobs, old, mask, max_log_ratio, max_kl)
    assert keep.tolist() == kept
    advantages = torch.ones(6, dtype=torch.float64)
    out = grpo_loss(logprobs, old, advantages, mask, off_policy_max_log_ratio=max_log_ratio, off_policy_max_kl=max_kl)
    if max_log_ratio is None and max_kl is None:
        assert out.off_policy_masked is None  # masking off: no fraction
    else:
        assert out.off_policy_masked == pytest.approx(kept.count(False) / 5)  # of the 5 rows with a token


def test_a_nan_measure_keeps_the_row_so_the_loss_stays_non_finite():
    logprobs, old, mask = drifted_rows()
    logprobs[0, 0] = torch.nan
    assert off_policy_mask(logprobs, old, mask, 0.3, 0.3)[0]
    assert torch.isnan(grpo_loss(logprobs, old, torch.ones(6), mask, off_policy_max_log_ratio=0.3).loss)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize(
    "options",
    [{}, {"importance_sampling_level": "sequence"}, {"objective": "cispo"}],
    ids=["ppo_clip", "gspo", "cispo"],
)
def test_masked_losses_match_the_float64_reference(aggregation, options, random_seed):
    out, expected = check_against_reference(
        random_seed,
        spread=0.6,
        beta=0.1,
        aggregation=aggregation,
        off_policy_max_log_ratio=0.25,
        off_policy_max_kl=0.3,
        **options,
    )
    assert 0 < out.off_policy_masked < 1, expected["keep"]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_masked_rows_stay_in_the_normaliser_so_micro_batches_add_up(aggregation, random_seed):
    """Each half weighted by its share of the aggregation's normaliser (tokens, rows with a token, rows) gives the
    full-batch loss: the mask, decided per row, needs no full-batch pass."""
    logprobs, old, ref, advantages, mask = case(random_seed, spread=0.6)
    options = dict(beta=0.1, ref_logprobs=ref, aggregation=aggregation, max_length=MAX_LENGTH)
    options |= dict(off_policy_max_log_ratio=0.25, importance_sampling_level="sequence")
    full = grpo_loss(logprobs, old, advantages, mask, **options)
    assert full.off_policy_masked > 0
    halves = (slice(0, N // 2), slice(N // 2, N))
    if aggregation == "token_mean":
        shares = [int(mask[rows].sum()) / int(mask.sum()) for rows in halves]
    elif aggregation == "sequence_mean":
        shares = [int(mask[rows].any(dim=1).sum()) / int(mask.any(dim=1).sum()) for rows in halves]
    else:
        shares = [0.5, 0.5]
    parts = [
        grpo_loss(logprobs[r], old[r], advantages[r], mask[r], **(options | {"ref_logprobs": ref[r]})) for r in halves
    ]
    for name in ("loss", "policy_loss", "kl"):
        weighted = sum(share * getattr(part, name) for share, part in zip(shares, parts, strict=True))
        torch.testing.assert_close(weighted, getattr(full, name), msg=name, **TIGHT)


# ---------------------------------------------------------------------------------------- high-entropy tokens
def entropies(seed: int, mask: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Per-token entropies in [0, 3), distinct, NaN on padding (which must never leak into the threshold)."""
    g = torch.Generator().manual_seed(seed + 1)
    values = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 3
    return torch.where(mask, values, torch.nan).to(dtype)


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.999])
def test_high_entropy_mask_keeps_the_top_fraction_of_the_masked_tokens(quantile, random_seed):
    _, _, _, _, mask = case(random_seed)
    entropy = entropies(random_seed, mask)
    high = high_entropy_mask(entropy, mask, quantile)
    assert not (high & ~mask).any()
    kept, total = int(high.sum()), int(mask.sum())
    values = entropy[mask].numpy()
    assert kept == int((values >= np.quantile(values, 1 - quantile)).sum())  # numpy's linear quantile
    assert quantile * total - 1 <= kept <= quantile * total + 1  # distinct values: the top fraction, up to rounding
    assert entropy[high].min() >= entropy[mask & ~high].max()  # every kept token above every left-out one
    assert torch.equal(high_entropy_mask(entropy, mask, 1.0), mask)
    assert not high_entropy_mask(entropy, torch.zeros_like(mask), quantile).any()


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize(
    "options",
    [{}, {"importance_sampling_level": "sequence"}, {"objective": "cispo"}],
    ids=["ppo_clip", "gspo", "cispo"],
)
def test_high_entropy_losses_match_the_float64_reference(aggregation, options, random_seed):
    logprobs, old, ref, advantages, mask = case(random_seed, spread=0.6)
    entropy = entropies(random_seed, mask)
    options = dict(options, beta=0.1, aggregation=aggregation, entropy=entropy, top_entropy_quantile=0.3)
    out, grad = run(logprobs, old, advantages, mask, ref, **options)
    expected = reference(logprobs, old, advantages, mask, ref=ref, **reference_options(options))
    for name in ("loss", "policy_loss", "kl"):
        torch.testing.assert_close(getattr(out, name), torch.tensor(expected[name], dtype=torch.float64), **TIGHT)
    torch.testing.assert_close(grad, torch.from_numpy(expected["grad"]), msg="gradient", **TIGHT)
    every = run(logprobs, old, advantages, mask, ref, **(options | {"top_entropy_quantile": 1.0}))
    assert torch.equal(every[0].kl, out.kl)  # the KL covers every token
    assert not torch.allclose(every[0].policy_loss, out.policy_loss)
    left_out = mask & ~high_entropy_mask(entropy, mask, 0.3)
    assert (grad[left_out] == 0).all() if options["beta"] == 0 else (grad[left_out] != 0).any()


def test_high_entropy_selection_needs_the_entropy():
    logprobs, old, _, advantages, mask = case(0)
    with pytest.raises(ValueError, match="top_entropy_quantile = 0.2 < 1 needs the per-token entropy"):
        grpo_loss(logprobs, old, advantages, mask, top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="entropy has shape"):
        grpo_loss(logprobs, old, advantages, mask, entropy=torch.zeros(2), top_entropy_quantile=0.2)


# ------------------------------------------------------------------------------------------- float32, defaults
@pytest.mark.parametrize(
    "options",
    [
        {"importance_sampling_level": "sequence", "eps_low": 0.03, "eps_high": 0.04},
        {"objective": "cispo", "eps_low": 1.0, "eps_high": 0.28},
        {"off_policy_max_log_ratio": 0.25, "off_policy_max_kl": 0.3},
    ],
    ids=["gspo", "cispo", "masked"],
)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_float32_inputs_agree_with_the_float64_reference_to_the_float32_bound(options, aggregation, random_seed):
    out, _ = check_against_reference(
        random_seed, torch.float32, FLOAT32, beta=0.1, aggregation=aggregation, spread=0.6, **options
    )
    assert out.loss.dtype == torch.float32


def test_the_default_options_are_today_s_loss_bit_for_bit(random_seed):
    logprobs, old, ref, advantages, mask = case(random_seed)
    plain = grpo_loss(logprobs, old, advantages, mask, beta=0.1, ref_logprobs=ref)
    explicit = grpo_loss(
        logprobs,
        old,
        advantages,
        mask,
        beta=0.1,
        ref_logprobs=ref,
        importance_sampling_level="token",
        objective="ppo_clip",
        off_policy_max_log_ratio=None,
        off_policy_max_kl=None,
    )
    for name in ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean"):
        assert torch.equal(getattr(plain, name), getattr(explicit, name)), name
    loss, _, clipped = clipped_surrogate(logprobs, old, advantages, 0.2, 0.2)
    assert plain.off_policy_masked is None and explicit.off_policy_masked is None and clipped.any()


def test_an_unknown_objective_is_refused_not_trained_as_ppo_clip():
    logprobs = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown objective 'cispoo'"):
        grpo_loss(logprobs, logprobs, torch.ones(2), torch.ones(2, 3), objective="cispoo")

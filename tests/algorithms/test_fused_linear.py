"""liger-kernel's fused linear GRPO loss (``app.algorithms.fused_linear``) against ``grpo_loss`` on the chunked
log-probs: same loss, statistics and gradients of the hidden states and the head for every aggregation, with and
without stored old log-probs and a reference, with a single kept token, without ``max_length`` and at the default
temperature, and for the sequence-level ratio (GSPO) and CISPO where Liger computes them; the statistics it cannot
give are NaN; ``compiled`` decides whether Liger compiles; the short errors of a run that cannot use it (no
liger-kernel, a wrapped head). The options it cannot compute are refused by ``VLMLossSettings``
(tests/modules/test_settings.py)."""

import importlib.util

import pytest
import torch
from torch import nn

from app.algorithms import grpo_loss
from app.algorithms.fused_linear import (
    LIGER_LOSS_TYPES,
    FusedLinearGRPOLoss,
    check_fused_head,
    require_liger_loss,
)
from app.algorithms.logprobs import chunked_token_logprobs
from app.errors import ConfigError

AGGREGATIONS = ("token_mean", "sequence_mean", "constant")
CISPO_AGGREGATIONS = ("token_mean", "constant")
"""The aggregations of ``cispo`` on the fused loss (Liger's ``cispo`` divides by the token count)."""
STATS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean")
N, L, H, V, MAX_LENGTH, TEMPERATURE = 6, 7, 16, 50, 10, 0.7


def case(seed: int):
    """Hidden states, a head with bias, targets, advantages, a mask with an empty row, stored old and reference
    log-probs far enough from the current ones that the clip acts."""
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(H, V)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) / 4)
        head.bias.copy_(torch.randn(V, generator=g))
    hidden = torch.randn(N, L, H, generator=g)
    targets = torch.randint(0, V, (N, L), generator=g)
    advantages = torch.randn(N, generator=g)
    mask = (torch.rand(N, L, generator=g) > 0.3).long()
    mask[2] = 0  # a dropped row: sequence_mean's normaliser counts only rows with a token
    mask[4] = 0
    mask[4, 3] = 1  # a row with a single token: it counts
    with torch.no_grad():
        current = chunked_token_logprobs(hidden, head, targets, temperature=TEMPERATURE)
    old = current + 0.3 * torch.randn(N, L, generator=g)
    ref = current + 0.3 * torch.randn(N, L, generator=g)
    return head, hidden, targets, advantages, mask, old, ref


def run(
    fused: bool,
    aggregation,
    beta,
    with_old,
    seed,
    keep=None,
    max_length=MAX_LENGTH,
    temperature=TEMPERATURE,
    drifted_rows=False,
    **objective,
):
    """One loss and its gradients, fused or from the chunked log-probs; ``keep`` replaces the case's mask,
    ``temperature=None`` leaves the temperature at its default, ``drifted_rows`` gives row 0 every ratio e^0.5 and
    A > 0, row 1 every ratio e^-0.5 and A < 0 (both clipped by these clip ranges; CISPO, unbounded below, caps row 0's
    weights) and row 3 the current log-probs as old ones (ratio 1, never clipped), and ``objective``
    (``importance_sampling_level``, ``objective``, ``eps_low``, ``eps_high``) goes to both losses."""
    liger = pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed")
    assert liger is not None
    head, hidden, targets, advantages, mask, old, ref = case(seed)
    if drifted_rows:
        with torch.no_grad():
            current = chunked_token_logprobs(hidden, head, targets, temperature=TEMPERATURE)
        advantages = advantages.clone()
        advantages[0], advantages[1] = advantages[0].abs(), -advantages[1].abs()
        old = old.clone()
        old[0], old[1], old[3] = current[0] - 0.5, current[1] + 0.5, current[3]
    mask = mask if keep is None else keep
    hidden.requires_grad_(True)
    ref = ref if beta > 0 else None
    old = old if with_old else None
    clip = dict(eps_low=0.2, eps_high=0.28) | objective
    at = {} if temperature is None else dict(temperature=temperature)
    if fused:
        loss = FusedLinearGRPOLoss(beta=beta, aggregation=aggregation, max_length=max_length, compiled=False, **clip)
        out = loss(hidden, head, targets, advantages, mask, old, ref, **at)
    else:
        logprobs = chunked_token_logprobs(hidden, head, targets, **at)
        out = grpo_loss(
            logprobs,
            logprobs.detach() if old is None else old,
            advantages,
            mask,
            beta=beta,
            ref_logprobs=ref,
            aggregation=aggregation,
            max_length=max_length,
            **clip,
        )
    out.loss.backward()
    return out, [hidden.grad, head.weight.grad, head.bias.grad]


def check_same(aggregation, beta, with_old, seed, **kwargs):
    """The fused loss gives grpo_loss's loss, statistics (None where Liger returns none: the ratio with old
    log-probs, the per-row KL under sequence_mean) and gradients; returns grpo_loss's."""
    expected, expected_grads = run(False, aggregation, beta, with_old, seed, **kwargs)
    actual, grads = run(True, aggregation, beta, with_old, seed, **kwargs)
    missing = ({"ratio_mean"} if with_old else set()) | (
        {"kl", "policy_loss"} if aggregation == "sequence_mean" and beta > 0 else set()
    )
    for name in STATS:
        value = getattr(actual, name)
        if name in missing:
            assert value is None, name
        else:
            torch.testing.assert_close(value, getattr(expected, name).float(), atol=1e-6, rtol=1e-5, msg=name)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5)
    return expected


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta, with_old", [(0.0, False), (0.0, True), (0.1, False), (0.1, True)])
def test_fused_loss_equals_grpo_loss_on_chunked_logprobs(aggregation, beta, with_old, random_seed):
    expected = check_same(aggregation, beta, with_old, random_seed)
    if with_old:
        assert expected.clip_fraction > 0, "the clip should act in this case"


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_a_single_kept_token(aggregation, random_seed):
    """One token in the whole batch: one row with a token for sequence_mean, a KL over one token, a ratio of 1."""
    keep = torch.zeros(N, L, dtype=torch.long)
    keep[1, 5] = 1
    expected = check_same(aggregation, 0.1, False, random_seed, keep=keep)
    assert expected.loss != 0 and expected.ratio_mean == 1


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_without_max_length_constant_divides_by_the_completion_length(aggregation, random_seed):
    check_same(aggregation, 0.1, True, random_seed, max_length=None)


def test_the_default_temperature_is_one(random_seed):
    check_same("token_mean", 0.1, True, random_seed, temperature=None)


GSPO = dict(importance_sampling_level="sequence", eps_low=0.02, eps_high=0.03)
"""A sequence ratio moves less than a token's (here the rows' mean of 0.3-wide noise): a clip range that acts on it."""
CISPO = dict(objective="cispo", eps_low=1.0, eps_high=0.28)
"""Liger's CISPO: the weight bounded above only (eps_low >= 1), at 1 + eps_high."""


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta, with_old", [(0.0, True), (0.1, True), (0.1, False)])
def test_fused_sequence_level_loss_equals_grpo_loss(aggregation, beta, with_old, random_seed):
    """Liger's sequence-level importance sampling is GSPO's: same sequence ratio, clip, broadcast and statistics."""
    expected = check_same(aggregation, beta, with_old, random_seed, drifted_rows=with_old, **GSPO)
    if with_old:
        assert 0 < expected.clip_fraction < 1, "some rows should be clipped and some not"


@pytest.mark.parametrize("aggregation", CISPO_AGGREGATIONS)
@pytest.mark.parametrize("beta, with_old", [(0.0, True), (0.1, True), (0.1, False)])
def test_fused_cispo_loss_equals_grpo_loss(aggregation, beta, with_old, random_seed):
    """Liger's ``cispo`` (weight min(r, 1 + eps_high), token-count normaliser; rescaled for ``constant``)."""
    expected = check_same(aggregation, beta, with_old, random_seed, drifted_rows=with_old, **CISPO)
    if with_old:
        assert expected.clip_fraction > 0, "some weights should be capped"


def test_fused_cispo_divides_by_this_call_s_tokens_without_an_all_reduce(monkeypatch):
    """The token count goes to Liger as ``num_items_in_batch`` (times the world size Liger divides it by), so Liger
    never all-reduces the count across ranks, which would hang a rank whose micro-batches differ in number."""
    liger = pytest.importorskip("liger_kernel.chunked_loss.fused_linear_ppo", reason="liger-kernel is not installed")
    normalisers = []
    real = liger.LigerFusedLinearPPOBase._compute_dapo_normalizer

    def spy(attention_mask, num_items_in_batch=None):
        normalisers.append(num_items_in_batch)
        return real(attention_mask, num_items_in_batch=num_items_in_batch)

    monkeypatch.setattr(liger.LigerFusedLinearPPOBase, "_compute_dapo_normalizer", staticmethod(spy))
    head, hidden, targets, advantages, mask, old, _ = case(0)
    FusedLinearGRPOLoss(compiled=False, **CISPO)(hidden, head, targets, advantages, mask, old)
    assert normalisers and all(float(count) == float(mask.sum()) for count in normalisers)


@pytest.mark.parametrize("compiled", [False, True])
def test_compiled_decides_whether_liger_compiles_the_loss_math(compiled, monkeypatch):
    """``compiled=False`` never calls ``torch.compile`` (CPU without a C++ compiler); True hands it the loss math."""
    pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed")
    compiled_functions = []

    def spy(fn, *args, **kwargs):
        compiled_functions.append(fn)
        return fn  # run eagerly: the test checks the request, not the compiler

    monkeypatch.setattr(torch, "compile", spy)
    head, hidden, targets, advantages, mask, old, ref = case(0)
    FusedLinearGRPOLoss(beta=0.1, compiled=compiled)(hidden, head, targets, advantages, mask, old, ref)
    assert len(compiled_functions) == (1 if compiled else 0)


def test_every_aggregation_has_a_liger_loss_type():
    assert set(LIGER_LOSS_TYPES) == set(AGGREGATIONS)


def test_errors():
    with pytest.raises(ConfigError) as error:
        check_fused_head(nn.Sequential(nn.Linear(2, 3)))
    assert str(error.value) == (
        "loss.fused_linear needs a plain nn.Linear output head, got torch.nn.modules.container.Sequential (LoRA "
        "on lm_head is not supported by the fused loss); drop lm_head from the LoRA targets or set "
        "loss.fused_linear: false"
    )
    if importlib.util.find_spec("liger_kernel") is not None:
        require_liger_loss()
        head, hidden, targets, advantages, mask, *_ = case(0)
        with pytest.raises(ValueError, match="beta = 0.1 > 0 needs ref_logprobs"):
            FusedLinearGRPOLoss(beta=0.1, compiled=False)(hidden, head, targets, advantages, mask)


def test_without_liger_the_error_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real(name, *a)
    )
    with pytest.raises(ConfigError) as error:
        require_liger_loss()
    assert str(error.value) == (
        "loss.fused_linear needs liger-kernel (pip install -e '.[gpu]', or pip install liger-kernel); "
        "set loss.fused_linear: false"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_compiled_fused_loss_matches_on_cuda(aggregation, beta):
    """Liger's default on GPU: the loss math under ``torch.compile``; every statistic on the GPU, NaN ones too."""
    pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed")
    head, hidden, targets, advantages, mask, old, ref = (t.cuda() for t in case(0))
    ref = ref if beta > 0 else None
    logprobs = chunked_token_logprobs(hidden, head, targets, temperature=TEMPERATURE)
    expected = grpo_loss(
        logprobs, old, advantages, mask, beta=beta, ref_logprobs=ref, aggregation=aggregation, max_length=MAX_LENGTH
    )
    loss = FusedLinearGRPOLoss(beta=beta, aggregation=aggregation, max_length=MAX_LENGTH, compiled=True)
    actual = loss(hidden, head, targets, advantages, mask, old, ref, temperature=TEMPERATURE)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=1e-4)
    devices = {name: getattr(actual, name).device for name in STATS}
    assert set(devices.values()) == {hidden.device}, devices


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "objective, aggregation",
    [(GSPO, "token_mean"), (GSPO, "sequence_mean"), (GSPO, "constant"), (CISPO, "token_mean"), (CISPO, "constant")],
    ids=["gspo-token_mean", "gspo-sequence_mean", "gspo-constant", "cispo-token_mean", "cispo-constant"],
)
def test_compiled_fused_objectives_match_on_cuda(objective, aggregation):
    """GSPO and CISPO under Liger's ``torch.compile`` on the GPU: the loss and the gradients of grpo_loss."""
    pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed")
    head, hidden, targets, advantages, mask, old, ref = (t.cuda() for t in case(0))
    hidden.requires_grad_(True)
    logprobs = chunked_token_logprobs(hidden, head, targets, temperature=TEMPERATURE)
    options = dict(beta=0.1, aggregation=aggregation, max_length=MAX_LENGTH) | objective
    expected = grpo_loss(logprobs, old, advantages, mask, ref_logprobs=ref, **options)
    expected_grads = torch.autograd.grad(expected.loss, [hidden, head.weight])
    loss = FusedLinearGRPOLoss(compiled=True, **options)
    actual = loss(hidden, head, targets, advantages, mask, old, ref, temperature=TEMPERATURE)
    grads = torch.autograd.grad(actual.loss, [hidden, head.weight])
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(actual.clip_fraction, expected.clip_fraction, atol=1e-6, rtol=0)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-4)

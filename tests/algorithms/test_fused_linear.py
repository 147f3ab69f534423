"""liger-kernel's fused linear GRPO loss (``app.algorithms.fused_linear``) against ``grpo_loss`` on the chunked
log-probs: same loss, statistics and gradients of the hidden states and the head for every aggregation, with and
without stored old log-probs and a reference; the statistics it cannot give are NaN; the short errors."""

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
    unavailable_statistics,
)
from app.errors import ConfigError
from app.sampling.logprobs import chunked_token_logprobs

AGGREGATIONS = ("token_mean", "sequence_mean", "constant")
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
    with torch.no_grad():
        current = chunked_token_logprobs(hidden, head, targets, temperature=TEMPERATURE)
    old = current + 0.3 * torch.randn(N, L, generator=g)
    ref = current + 0.3 * torch.randn(N, L, generator=g)
    return head, hidden, targets, advantages, mask, old, ref


def run(fused: bool, aggregation, beta, with_old, seed):
    liger = pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed")
    assert liger is not None
    head, hidden, targets, advantages, mask, old, ref = case(seed)
    hidden.requires_grad_(True)
    ref = ref if beta > 0 else None
    old = old if with_old else None
    clip = dict(eps_low=0.2, eps_high=0.28)
    if fused:
        loss = FusedLinearGRPOLoss(beta=beta, aggregation=aggregation, max_length=MAX_LENGTH, compiled=False, **clip)
        out = loss(hidden, head, targets, advantages, mask, old, ref, temperature=TEMPERATURE)
    else:
        logprobs = chunked_token_logprobs(hidden, head, targets, temperature=TEMPERATURE)
        out = grpo_loss(
            logprobs, logprobs.detach() if old is None else old, advantages, mask, beta=beta, ref_logprobs=ref,
            aggregation=aggregation, max_length=MAX_LENGTH, **clip,
        )  # fmt: skip
    out.loss.backward()
    return out, [hidden.grad, head.weight.grad, head.bias.grad]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta, with_old", [(0.0, False), (0.0, True), (0.1, False), (0.1, True)])
def test_fused_loss_equals_grpo_loss_on_chunked_logprobs(aggregation, beta, with_old, random_seed):
    expected, expected_grads = run(False, aggregation, beta, with_old, random_seed)
    actual, grads = run(True, aggregation, beta, with_old, random_seed)
    missing = unavailable_statistics(aggregation, beta, stores_old_logprobs=with_old)
    for name in STATS:
        value = getattr(actual, name)
        if name in missing:
            assert torch.isnan(value), name
        else:
            torch.testing.assert_close(value, getattr(expected, name).float(), atol=1e-6, rtol=1e-5, msg=name)
    if with_old:
        assert expected.clip_fraction > 0, "the clip should act in this case"
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5)


def test_unavailable_statistics():
    assert unavailable_statistics("token_mean", 0.0, stores_old_logprobs=False) == frozenset()
    assert unavailable_statistics("constant", 0.1, stores_old_logprobs=True) == {"ratio_mean"}
    assert unavailable_statistics("sequence_mean", 0.0, stores_old_logprobs=False) == frozenset()
    assert unavailable_statistics("sequence_mean", 0.1, stores_old_logprobs=False) == {"kl", "policy_loss"}
    assert set(LIGER_LOSS_TYPES) == set(AGGREGATIONS)


def test_errors():
    with pytest.raises(ConfigError, match="fused_linear_loss supports loss_aggregation .*got 'sum'"):
        FusedLinearGRPOLoss(aggregation="sum")
    with pytest.raises(
        ConfigError, match="needs a plain nn.Linear output head, got torch.nn.modules.container.Sequential"
    ):
        check_fused_head(nn.Sequential(nn.Linear(2, 3)))
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
    with pytest.raises(ConfigError, match=r"fused_linear_loss=True needs liger-kernel \(pip install -e '.\[gpu\]'"):
        require_liger_loss()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_compiled_fused_loss_matches_on_cuda(aggregation):
    """Liger's default on GPU: the loss math under ``torch.compile``."""
    pytest.importorskip("liger_kernel.chunked_loss", reason="liger-kernel is not installed")
    head, hidden, targets, advantages, mask, old, ref = (t.cuda() for t in case(0))
    logprobs = chunked_token_logprobs(hidden, head, targets, temperature=TEMPERATURE)
    expected = grpo_loss(logprobs, old, advantages, mask, beta=0.1, ref_logprobs=ref, aggregation=aggregation,
                         max_length=MAX_LENGTH)  # fmt: skip
    loss = FusedLinearGRPOLoss(beta=0.1, aggregation=aggregation, max_length=MAX_LENGTH, compiled=True)
    actual = loss(hidden, head, targets, advantages, mask, old, ref, temperature=TEMPERATURE)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=1e-4)

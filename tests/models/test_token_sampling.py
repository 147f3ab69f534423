"""Inverse-transform next-token sampling: its law, its edge cases and the logits processor around it."""

import pytest
import torch
from transformers import SuppressTokensLogitsProcessor, TopPLogitsWarper

from app.models import token_sampling
from app.models.token_sampling import InverseCDFSampling, sample_from_probs

DRAWS = 200_000


def frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).double() / len(tokens)


def assert_law(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    """Empirical frequencies within 5 standard errors of ``probs``, and no token of probability 0 drawn."""
    got = frequencies(tokens, len(probs))
    tolerance = 5 * (probs * (1 - probs) / len(tokens)).sqrt() + 1e-12
    assert ((got - probs).abs() <= tolerance).all(), (got, probs)
    assert (got[probs == 0] == 0).all()


def test_draws_follow_the_probabilities_and_skip_zero_ones():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    torch.manual_seed(0)
    tokens = sample_from_probs(probs.expand(DRAWS, -1))
    assert tokens.shape == (DRAWS,) and tokens.dtype == torch.int64
    assert_law(tokens, probs.double())


def test_rows_need_not_sum_to_one_and_keep_their_own_laws():
    rows = torch.tensor([[2.0, 0.0, 2.0, 4.0], [0.0, 0.0, 0.0, 3.0]])  # totals 8 and 3
    torch.manual_seed(1)
    tokens = sample_from_probs(rows.repeat(DRAWS // 2, 1)).view(-1, 2)
    assert_law(tokens[:, 0], torch.tensor([0.25, 0.0, 0.25, 0.5], dtype=torch.float64))
    assert (tokens[:, 1] == 3).all()


def uniform_draws(monkeypatch, value: float) -> None:
    """Make the sampler's uniform numbers all equal ``value``."""
    monkeypatch.setattr(token_sampling.torch, "rand", lambda shape, **kw: torch.full(shape, value, dtype=torch.float64))


def test_a_token_too_small_for_float32_sums_keeps_its_interval(monkeypatch):
    """1 + 1e-8 is 1 in float32, so a float32 cumulative sum would give the middle token an empty interval."""
    probs = torch.tensor([[1.0, 1e-8, 1.0]])
    total = 1.0 + float(probs[0, 1]) + 1.0
    uniform_draws(monkeypatch, (1.0 + 0.5 * float(probs[0, 1])) / total)  # inside the middle token's interval
    assert sample_from_probs(probs).tolist() == [1]


def test_a_zero_uniform_skips_leading_zero_probability_tokens(monkeypatch):
    uniform_draws(monkeypatch, 0.0)
    assert sample_from_probs(torch.tensor([[0.0, 0.0, 0.4, 0.6], [0.5, 0.0, 0.0, 0.5]])).tolist() == [2, 0]


def test_same_seed_same_tokens_and_another_seed_other_tokens():
    probs = torch.softmax(torch.randn(64, 100, generator=torch.Generator().manual_seed(3)), dim=-1)
    torch.manual_seed(4)
    first = sample_from_probs(probs)
    torch.manual_seed(4)
    assert torch.equal(sample_from_probs(probs), first)
    torch.manual_seed(5)
    assert not torch.equal(sample_from_probs(probs), first)


@pytest.mark.parametrize(
    "row", [[0.5, float("nan"), 0.5], [0.5, float("inf"), 0.5], [0.0, 0.0, 0.0]], ids=["nan", "inf", "no-mass"]
)
def test_non_finite_or_empty_rows_are_refused_with_a_message(row):
    probs = torch.tensor([[0.2, 0.3, 0.5], row])
    with pytest.raises(
        ValueError,
        match=r"^cannot sample the next token: its probabilities hold NaN or inf or a row sums to 0 "
        r"\(the policy's logits are not finite\)$",
    ):
        sample_from_probs(probs)


def test_a_generator_draws_one_float64_uniform_per_row_from_it_alone():
    """The documented draw, by hand: ``u ~ U[0, 1)`` in float64 per row from ``generator`` (the global RNG untouched),
    and the first token whose cumulative probability exceeds ``u * total``."""
    probs = torch.softmax(torch.randn(64, 100, generator=torch.Generator().manual_seed(3)), dim=-1)
    torch.manual_seed(11)
    got = sample_from_probs(probs, generator=torch.Generator().manual_seed(12))
    uniform = torch.rand(64, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    cdf = probs.double().cumsum(dim=-1)
    assert torch.equal(got, torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(1))
    torch.manual_seed(13)  # another global seed: the same tokens
    assert torch.equal(sample_from_probs(probs, generator=torch.Generator().manual_seed(12)), got)


def test_processor_returns_scores_whose_argmax_is_the_drawn_token():
    scores = torch.randn(8, 50, generator=torch.Generator().manual_seed(6))
    torch.manual_seed(7)
    out = InverseCDFSampling()(torch.zeros(8, 3, dtype=torch.long), scores.clone())
    torch.manual_seed(7)
    drawn = sample_from_probs(torch.softmax(scores, dim=-1))
    assert torch.equal(out.argmax(dim=-1), drawn)
    assert (out == 0).sum() == 8 and torch.isneginf(out).sum() == 8 * 49


def test_processor_suppresses_tokens_as_transformers_suppress_processor_then_itself():
    """The suppressed tokens are never drawn, even the most likely, and the draws are those of transformers'
    ``SuppressTokensLogitsProcessor`` followed by the processor without suppression, for the same seed."""
    scores = torch.randn(64, 50, generator=torch.Generator().manual_seed(4))
    scores[:, [3, 17]] += 10.0  # the likeliest by far
    torch.manual_seed(5)
    out = InverseCDFSampling(temperature=0.7, top_p=0.9, suppressed_token_ids=[3, 17])(None, scores.clone())
    torch.manual_seed(5)
    suppressed = SuppressTokensLogitsProcessor([3, 17])(None, scores.clone())
    want = InverseCDFSampling(temperature=0.7, top_p=0.9)(None, suppressed)
    assert torch.equal(out, want)
    assert not torch.isin(out.argmax(dim=-1), torch.tensor([3, 17])).any()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_processor_samples_the_tempered_softmax(temperature):
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")]])
    torch.manual_seed(8)
    out = InverseCDFSampling(temperature=temperature)(torch.zeros(DRAWS, 1, dtype=torch.long), scores.repeat(DRAWS, 1))
    assert_law(out.argmax(dim=-1), torch.softmax(scores[0].double() / temperature, dim=-1))


def test_processor_top_p_keeps_transformers_nucleus_and_renormalises_it():
    scores = torch.log(torch.tensor([[0.45, 0.25, 0.15, 0.1, 0.05]]))
    kept = torch.isfinite(TopPLogitsWarper(0.8)(None, scores.clone()))[0]  # the nucleus: first three tokens
    assert kept.tolist() == [True, True, True, False, False]
    torch.manual_seed(9)
    out = InverseCDFSampling(top_p=0.8)(torch.zeros(DRAWS, 1, dtype=torch.long), scores.repeat(DRAWS, 1))
    want = torch.where(kept, scores[0].exp(), 0.0).double()
    assert_law(out.argmax(dim=-1), want / want.sum())


def test_processor_by_default_keeps_every_token_even_one_half_precision_cannot_hold(monkeypatch):
    """No top-p filter at top_p 1: transformers' would drop a token whose probability underflows in the scores' own
    precision (e^-21 in float16), which the float32 softmax here still draws."""
    uniform_draws(monkeypatch, 1.0 - 1e-10)  # past the first token's share, 1 - 7.6e-10
    scores = torch.tensor([[0.0, -21.0]], dtype=torch.float16)
    assert InverseCDFSampling()(torch.zeros(1, 1, dtype=torch.long), scores).argmax(dim=-1).tolist() == [1]


def test_processor_rejects_a_non_positive_temperature():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        InverseCDFSampling(temperature=0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_draws_on_cuda_follow_the_probabilities_and_stay_on_the_device():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0], device="cuda")
    torch.manual_seed(10)
    tokens = sample_from_probs(probs.expand(DRAWS, -1))
    assert tokens.device == probs.device
    assert_law(tokens.cpu(), probs.double().cpu())
    scores = torch.log(probs).expand(4, -1).clone()
    out = InverseCDFSampling(temperature=0.7, top_p=0.9)(torch.zeros(4, 1, dtype=torch.long, device="cuda"), scores)
    assert out.device == scores.device and torch.isin(out.argmax(dim=-1).cpu(), torch.tensor([0, 2, 3])).all()

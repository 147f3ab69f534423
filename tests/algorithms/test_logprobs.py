import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import entropy_atol
from torch import nn

from app.algorithms import chunked_token_logprobs, token_logprobs_naive
from app.algorithms.logprobs import chunked_token_logprobs_and_entropy, token_entropy_naive


def _inputs(n, length, h, v, bias=True, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    lm_head = nn.Linear(h, v, bias=bias).to(dtype)
    hidden = (2 * torch.randn(n, length, h)).to(dtype).requires_grad_()  # [N, L, H], logits of order 1
    targets = torch.randint(v, (n, length))  # [N, L]
    weights = torch.randn(n, length)  # [N, L] a random loss weighting
    return lm_head, hidden, targets, weights


def _value_and_grads(fn, lm_head, hidden, targets, weights, **kwargs):
    lm_head.zero_grad()
    hidden.grad = None
    logp = fn(hidden, lm_head, targets, **kwargs)  # [N, L]
    (logp * weights).sum().backward()
    grads = [hidden.grad] + [p.grad for p in lm_head.parameters() if p.requires_grad]
    return logp.detach(), [g.clone() for g in grads]


def _assert_chunked_matches_naive(lm_head, hidden, targets, weights, chunk_size, temperature=1.0, atol=1e-5):
    naive, naive_grads = _value_and_grads(
        token_logprobs_naive, lm_head, hidden, targets, weights, temperature=temperature
    )
    chunked, chunked_grads = _value_and_grads(
        chunked_token_logprobs, lm_head, hidden, targets, weights, chunk_size=chunk_size, temperature=temperature
    )
    assert chunked.dtype == torch.float32 and chunked.shape == targets.shape
    assert (chunked - naive).abs().max() < atol
    for got, want in zip(chunked_grads, naive_grads, strict=True):  # sums over tokens: float32 error scales with size
        assert (got.float() - want.float()).abs().max() < atol * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("chunk_size", [1, 5, 7, 12, 1000])  # 5 and 7 do not divide N * L = 12; 1000 > N * L
@pytest.mark.parametrize("bias", [True, False])
def test_chunked_matches_naive_values_and_grads(chunk_size, bias):
    _assert_chunked_matches_naive(*_inputs(3, 4, 16, 97, bias=bias), chunk_size=chunk_size)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 4),
    length=st.integers(1, 9),
    h=st.integers(1, 24),
    v=st.integers(2, 300),
    chunk_size=st.integers(1, 40),
    bias=st.booleans(),
    temperature=st.sampled_from([0.3, 1.0, 1.7]),
    seed=st.integers(0, 2**31 - 1),
)
def test_chunked_matches_naive_on_random_shapes(n, length, h, v, chunk_size, bias, temperature, seed):
    lm_head, hidden, targets, weights = _inputs(n, length, h, v, bias=bias, seed=seed)
    _assert_chunked_matches_naive(lm_head, hidden, targets, weights, chunk_size=chunk_size, temperature=temperature)


@pytest.mark.parametrize("temperature", [0.7, 2.0])
def test_temperature_divides_the_logits(temperature):
    lm_head, hidden, targets, _ = _inputs(2, 6, 8, 40)
    with torch.no_grad():
        want = torch.log_softmax(lm_head(hidden) / temperature, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
        got = chunked_token_logprobs(hidden, lm_head, targets, chunk_size=5, temperature=temperature)
        at_one = chunked_token_logprobs(hidden, lm_head, targets, chunk_size=5)
    assert (got - want).abs().max() < 1e-5
    assert (got - at_one).abs().max() > 1e-2


def test_no_grad_gives_same_values_without_a_graph():
    lm_head, hidden, targets, _ = _inputs(2, 7, 8, 40)
    with torch.no_grad():
        chunked = chunked_token_logprobs(hidden, lm_head, targets, chunk_size=4)
        naive = token_logprobs_naive(hidden, lm_head, targets)
    assert not chunked.requires_grad
    assert (chunked - naive).abs().max() < 1e-5


def test_bf16_hidden_gives_float32_close_to_naive():
    lm_head, hidden, targets, weights = _inputs(2, 9, 32, 130, dtype=torch.bfloat16)
    naive, naive_grads = _value_and_grads(token_logprobs_naive, lm_head, hidden, targets, weights)
    chunked, chunked_grads = _value_and_grads(chunked_token_logprobs, lm_head, hidden, targets, weights, chunk_size=4)
    assert chunked.dtype == torch.float32
    assert (chunked - naive).abs().max() < 1e-2
    assert chunked_grads[0].dtype == torch.bfloat16
    for got, want in zip(chunked_grads, naive_grads, strict=True):
        assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_backward_saves_no_vocabulary_sized_tensor():
    lm_head, hidden, targets, _ = _inputs(2, 5, 8, 50)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_token_logprobs(hidden, lm_head, targets, chunk_size=3)
    assert saved and all(50 not in shape for shape in saved)  # only chunk inputs; logits are recomputed


def test_peft_wrapped_head_matches_naive():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = nn.Module()
    model.lm_head = nn.Linear(8, 60)
    model = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["lm_head"], init_lora_weights=False))
    lm_head = model.base_model.model.lm_head
    _, hidden, targets, weights = _inputs(2, 5, 8, 60)
    _assert_chunked_matches_naive(lm_head, hidden, targets, weights, chunk_size=3)  # grads of lora_A, lora_B


def test_empty_completions():
    lm_head, hidden, targets, _ = _inputs(2, 0, 8, 20, dtype=torch.bfloat16)
    empty = chunked_token_logprobs(hidden, lm_head, targets)
    assert empty.shape == (2, 0) and empty.dtype == torch.float32


def test_default_chunk_is_1024_tokens():
    lm_head, hidden, targets, _ = _inputs(1, 1030, 2, 3)
    rows = []
    lm_head.register_forward_hook(lambda module, args, output: rows.append(args[0].shape[0]))
    with torch.no_grad():
        chunked_token_logprobs(hidden, lm_head, targets)
    assert rows == [1024, 6]


def test_head_gets_gradients_when_hidden_is_a_constant():
    lm_head, hidden, targets, weights = _inputs(2, 5, 8, 30)
    hidden = hidden.detach()  # e.g. a frozen trunk: only the head trains
    naive = torch.autograd.grad((token_logprobs_naive(hidden, lm_head, targets) * weights).sum(), lm_head.weight)
    chunked = torch.autograd.grad(
        (chunked_token_logprobs(hidden, lm_head, targets, chunk_size=3) * weights).sum(), lm_head.weight
    )
    assert (chunked[0] - naive[0]).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("hidden_shape", "targets_shape", "kwargs", "match"),
    [
        ((2, 3), (2, 3), {}, "hidden must be"),
        ((2, 3, 4), (2, 4), {}, r"^targets must be \[N, L\] = \(2, 3\) like hidden, got \(2, 4\)$"),
        ((2, 3, 4), (6,), {}, r"^targets must be \[N, L\] = \(2, 3\) like hidden, got \(6,\)$"),
        ((2, 3, 4), (2, 3), {"chunk_size": 0}, "chunk_size"),
        ((2, 3, 4), (2, 3), {"temperature": 0.0}, "temperature"),
    ],
)
def test_bad_arguments_raise(hidden_shape, targets_shape, kwargs, match):
    hidden = torch.randn(hidden_shape, generator=torch.Generator().manual_seed(0))
    targets = torch.zeros(targets_shape, dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        chunked_token_logprobs(hidden, nn.Linear(4, 10), targets, **kwargs)


@pytest.mark.parametrize("logprobs", [token_logprobs_naive, chunked_token_logprobs], ids=["naive", "chunked"])
def test_log_probs_divide_the_logits_by_the_temperature(logprobs):
    """By hand: logits (2, -1, 1) at temperature 0.5 are (4, -2, 2); token 2's log-prob is 2 - log(e^4 + e^-2 + e^2)."""
    lm_head = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        lm_head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    hidden = torch.tensor([[[2.0, -1.0]]])  # [N=1, L=1, H=2]
    expected = 2.0 - torch.log(torch.tensor(4.0).exp() + torch.tensor(-2.0).exp() + torch.tensor(2.0).exp())
    got = logprobs(hidden, lm_head, torch.tensor([[2]]), temperature=0.5)
    torch.testing.assert_close(got, expected.view(1, 1))


# ------------------------------------------------------------------------------------------------------- entropy
def _entropy_reference_float64(hidden, lm_head, temperature):
    """``-sum_v p_v log p_v`` of the tempered logits, in float64."""
    with torch.no_grad():
        head64 = copy.deepcopy(lm_head).double()
        logp = torch.log_softmax(head64(hidden.detach().double()) / temperature, dim=-1)  # [N, L, V]
    return -(logp.exp() * logp).sum(dim=-1)  # [N, L]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 4),
    length=st.integers(1, 9),
    h=st.integers(1, 24),
    v=st.integers(2, 300),
    chunk_size=st.integers(1, 40),
    temperature=st.sampled_from([0.3, 1.0, 1.7]),
    seed=st.integers(0, 2**31 - 1),
)
def test_entropy_from_the_chunks_is_the_distributions_entropy(n, length, h, v, chunk_size, temperature, seed):
    lm_head, hidden, targets, weights = _inputs(n, length, h, v, seed=seed)
    logprobs, entropy = chunked_token_logprobs_and_entropy(
        hidden, lm_head, targets, chunk_size=chunk_size, temperature=temperature
    )
    want = _entropy_reference_float64(hidden, lm_head, temperature)
    with torch.no_grad():  # |z| and max_j sum_i |W_ji h_i| + |b_j| of the tempered logits, for the bound
        logit_max = float((lm_head(hidden) / temperature).abs().max())
        terms = hidden.abs() @ lm_head.weight.abs().T + lm_head.bias.abs()  # [N, L, V]
        logit_l1 = float(terms.max()) / temperature
    # float32 (logits from a contraction over H plus the bias, then divided) against float64: the logits' rounding
    # is covered by a sum of H + 1 terms (the division's u |z| <= (H + 1) u logit_l1)
    atol = entropy_atol(v, logit_max, sums=[h + 1], logit_l1=logit_l1)
    assert entropy.dtype == torch.float32 and entropy.shape == (n, length)
    assert not entropy.requires_grad
    assert (entropy.double() - want).abs().max() <= atol
    assert ((entropy >= -atol) & (entropy <= torch.log(torch.tensor(float(v))) + atol)).all()  # 0 <= H <= log V
    # the log-probs (and so their gradients) are those without entropy, bit for bit
    without = chunked_token_logprobs(hidden, lm_head, targets, chunk_size=chunk_size, temperature=temperature)
    assert torch.equal(logprobs, without)


def test_entropy_matches_the_naive_reference_and_leaves_the_gradients_alone():
    lm_head, hidden, targets, weights = _inputs(3, 4, 16, 97)
    logprobs, entropy = chunked_token_logprobs_and_entropy(hidden, lm_head, targets, chunk_size=5)
    naive = token_entropy_naive(hidden, lm_head)
    logit_max = float(lm_head(hidden).detach().abs().max())
    assert (entropy - naive.detach()).abs().max() <= entropy_atol(97, logit_max)  # same [C, H] x [H, V] contractions
    (logprobs * weights).sum().backward()
    with_entropy = [hidden.grad.clone()] + [p.grad.clone() for p in lm_head.parameters()]
    _, without = _value_and_grads(chunked_token_logprobs, lm_head, hidden, targets, weights, chunk_size=5)
    for got, want in zip(with_entropy, without, strict=True):
        assert torch.equal(got, want)


def test_entropy_of_a_uniform_and_of_a_certain_distribution():
    v = 50
    zero_head = nn.Linear(4, v, bias=False)
    nn.init.zeros_(zero_head.weight)
    hidden, targets = torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long)
    _, uniform = chunked_token_logprobs_and_entropy(hidden, zero_head, targets, chunk_size=4)
    torch.testing.assert_close(uniform, torch.full((2, 3), math.log(v)), atol=entropy_atol(v, 0.0), rtol=0)
    peaked = nn.Linear(4, v, bias=True)
    nn.init.zeros_(peaked.weight)
    with torch.no_grad():
        peaked.bias.fill_(-60.0)
        peaked.bias[7] = 60.0  # p_7 = 1 - 49 e^-120: entropy ~ 1e-50
    _, certain = chunked_token_logprobs_and_entropy(hidden, peaked, targets, chunk_size=4)
    assert certain.abs().max() <= entropy_atol(v, 60.0)


def test_empty_completions_have_empty_entropy():
    lm_head, hidden, targets, _ = _inputs(2, 0, 8, 20)
    logprobs, entropy = chunked_token_logprobs_and_entropy(hidden, lm_head, targets)
    assert logprobs.shape == entropy.shape == (2, 0)

"""Tolerances derived from the computation, for tests that compare two computations which differ only in float32
rounding: DDP vs FSDP2, two processes vs four vs one, micro-batches vs one batch, or the same code on another CPU,
whose BLAS kernels sum in another order. Rounding differences are not bugs, and the tolerances must not depend on
the CPU the test runs on.

Weights trained with AdamW
--------------------------
Adam divides each gradient element by its running RMS, so an element whose gradient is about zero moves by a
sizeable part of the learning rate whatever its size. Near zero the step is linear in the gradient with slope up to
``1 / eps`` (``eps = 1e-8``), so a rounding difference of 1e-10 in such a gradient, from summing in another order,
moves the element by 1e-2 of the learning rate. In the two-process flow probe an element's second-step gradient was
-2.9e-11 under FSDP2 and 5.4e-10 under DDP, which moved it by 0.029 x lr; on another CPU the worst element moved by
0.2 x lr. A fixed tolerance of "a fraction of the learning rate" therefore depends on the CPU. Two bounds do not:

1. Per element, a hard bound. At step ``t`` AdamW moves an element by ``lr_t * |m_t| / (sqrt(v_t) + eps)`` (bias
   corrected), and by Cauchy-Schwarz ``|m_t| / sqrt(v_t) <= c_t`` for any gradients:
   ``c_t = (1 - b1) / (1 - b1^t) * sqrt((1 - b2^t) / (1 - b2)) * sqrt(sum_{k<t} (b1^2 / b2)^k)``
   (1, 1.0014, 1.0036 for t = 1, 2, 3 at the default betas). Two runs from the same initial weights, with rates
   ``lr_t <= lr`` and the same decoupled weight decay (a factor ``1 - lr_t * wd`` in ``[0, 1]``, which only shrinks a
   difference), therefore end at most ``D = 2 * lr * sum_t c_t`` apart per element (:func:`adamw_drift_bound`),
   plus the rounding of the two updates ``theta * (1 - lr * wd)`` and ``theta - step`` in each run: at most
   ``eps32 * |theta|`` per step and run (two roundings of ``eps32 / 2`` each).

2. In aggregate, a budget. ``D`` is reached only by an element whose gradient's sign is left to rounding at every
   step, and a material part of it only where the gradient is within its own rounding error (about
   ``n * eps32 * sum |terms|`` for a sum of ``n`` terms) of zero or not far above Adam's eps. An element whose
   gradients are not cancellation-dominated (relative rounding error under 1e-3, which takes a sum whose terms
   cancel to 1e-3 of their size for n * eps32 ~ 1e-6) differs by less than 1e-3 of its step. The check lets a
   fraction ``OUTLIER_FRACTION = 1e-3`` of the elements, and at least one per tensor, differ by the full ``D``:
   ``||got - expected||_2 <= D * sqrt(max(1, f * N))`` for each tensor of ``N`` elements and for all of them. The
   rest's 1e-3 of the update's norm is far inside that budget (``D * sqrt(f) = 0.19 lr`` per element for three
   steps, against a step of about ``lr``).

Why a bug still fails. A bug changes the update's direction in most elements (a rank's gradient missing, ranks
trained on the same data, another learning rate, a step lost or repeated) or leaves a tensor where it started, so
``||got - expected||_2`` is a sizeable part of the update's norm, about ``lr * sqrt(N)`` per step, against the
budget ``D * sqrt(f * N)``, about ``0.06 lr * sqrt(N)`` per step. A tensor left untrained fails once its own update
norm exceeds ``D``: with elements that move by about ``lr`` in all, once it has more than ``(2 sum_t c_t)^2``
elements (36 for three steps). Given the initial weights, the check also asserts that the update is at least
twice the budget, so that the comparison could tell a path that trained nothing. In the two-process probe runs
the rounding differences of DDP vs FSDP2 use under 1% of the budget, and a rank's gradient left out, a doubled
learning rate, an adapter left untrained or a step fewer on one side exceed it 1.4 to 11 times.

What no comparison of Adam's weights can see: a gradient wrong by a constant factor (a sum over ranks where a mean
was due) leaves Adam's steps unchanged, up to its eps, and gradient clipping rescales it too; compare gradients for
that.

Log-probs computed two ways
---------------------------
Without an optimizer in between nothing amplifies rounding. A float32 sum of ``n`` terms is within
``gamma_n * sum |x_i|`` of the exact sum in any order (``gamma_n = n u / (1 - n u)``, ``u = 2^-24``; Higham,
*Accuracy and Stability of Numerical Algorithms*, 4.2), so two orders differ by at most twice that. A log-prob
``z_t - logsumexp(z)`` of logits ``z = W h`` then differs by at most (:func:`logprob_atol`): ``2 gamma_V`` from the
log-sum-exp's sum over the ``V`` exponentials (relative, so absolute after the log), plus, twice (``z_t`` and the
largest logit), ``2 gamma_n * logit_l1`` for each sum of ``n`` terms (a contraction, a norm's mean, attention over
positions) the two ways may order differently, as a relative error carried to the logits at most one for one
(unit-RMS normalised layers at the tiny models' std-0.02 initialisation), where ``logit_l1 = max_j sum_i |W_ji h_i|``.
For the tiny VLMs, ``||W_j||_2 ||h||_2 = (0.02 * 8) * 8 = 1.3`` by Cauchy-Schwarz (hidden 64, unit-RMS ``h`` after
the final norm); ``TINY_VLM_LOGIT_L1 = 2`` leaves room for the spread of the 1024 rows' norms. These worst-case
bounds are 1e-4 to 2e-3 for the tiny VLMs, still under what a bug moves: another image for a row changes their
log-probs by up to 2e-2, another token's log-prob is typically 0.15 away.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

ADAM_BETAS = (0.9, 0.999)  # torch.optim.AdamW's defaults, what app.modules.optim.adamw_with_warmup uses
FLOAT32_EPS = torch.finfo(torch.float32).eps  # 1.19e-7, twice float32's unit roundoff
OUTLIER_FRACTION = 1e-3  # elements allowed the full per-element bound (see the module docstring)
UNIT_ROUNDOFF = 2.0**-24  # float32's u: a rounding is off by at most u relative
TINY_VLM_LOGIT_L1 = 2.0  # max_j sum_i |W_ji h_i| for the tiny VLMs' LM head (1.3 by Cauchy-Schwarz, see above)
TINY_VLM_VOCAB = 1024  # the embedded tiny VLMs' vocabulary (app.tiny.models)


def adam_ratio_bound(step: int, betas: tuple[float, float] = ADAM_BETAS) -> float:
    """The largest ``|m_t| / sqrt(v_t)`` (bias corrected) Adam's moments can reach at step ``step`` (1-based), for any
    gradients: Cauchy-Schwarz on ``sum b1^(t-i) g_i = sum (b1 / sqrt(b2))^(t-i) * sqrt(b2)^(t-i) g_i``."""
    b1, b2 = betas
    assert b1 * b1 < b2, "the bound needs b1^2 < b2"
    geometric = sum((b1 * b1 / b2) ** k for k in range(step))
    return (1 - b1) / (1 - b1**step) * math.sqrt((1 - b2**step) / (1 - b2)) * math.sqrt(geometric)


def adamw_drift_bound(lr: float, steps: int, betas: tuple[float, float] = ADAM_BETAS) -> float:
    """The most one element can differ between two AdamW runs of ``steps`` steps from the same weights at rates up to
    ``lr``, whatever their gradients: each step moves it at most ``lr * c_t`` in either run."""
    return 2 * lr * sum(adam_ratio_bound(t, betas) for t in range(1, steps + 1))


def assert_close_training(
    got: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    lr: float,
    steps: int,
    initial: Mapping[str, torch.Tensor] | None = None,
    shared_steps: int = 0,
    betas: tuple[float, float] = ADAM_BETAS,
    outlier_fraction: float = OUTLIER_FRACTION,
) -> None:
    """``got`` and ``expected`` are the weights of two AdamW runs of ``steps`` steps (at most, per parameter) from the
    same initial weights at rates up to ``lr``, which should differ only in float32 rounding: check the per-element
    bound and the aggregate budget of the module docstring. ``shared_steps``: the first steps both runs share (a run
    resumed from the other's checkpoint after them), so that only the later steps count in the bounds.

    With ``initial``, also check that it is where the runs started (no element of ``expected`` farther from it than
    one run's bound, ``lr * sum_t c_t``) and that they moved the weights enough for the budget to tell a path that
    did not train."""
    assert got.keys() == expected.keys() and got, f"different or no tensors: {sorted(got.keys() ^ expected.keys())[:3]}"
    assert 0 <= shared_steps < steps
    bound = adamw_drift_bound(lr, steps, betas) - adamw_drift_bound(lr, shared_steps, betas)
    squares, count = 0.0, 0
    for name, want in expected.items():
        have, want = got[name].double(), want.double()
        assert have.shape == want.shape, f"{name}: shape {tuple(have.shape)} vs {tuple(want.shape)}"
        difference = (have - want).abs()
        rounding = 2 * steps * FLOAT32_EPS * torch.maximum(have.abs(), want.abs())
        excess = difference - (bound + rounding)
        assert excess.max() <= 0, (
            f"{name}: an element differs by {difference.flatten()[excess.argmax()]:.3e}, more than AdamW's bound "
            f"{bound:.3e} for {steps} steps at lr {lr:g}: not a rounding difference"
        )
        norm, budget = difference.norm().item(), bound * math.sqrt(max(1.0, outlier_fraction * want.numel()))
        assert norm <= budget, (
            f"{name}: the difference's norm {norm:.3e} exceeds the budget {budget:.3e} of {outlier_fraction:g} of "
            f"its {want.numel()} elements at AdamW's bound: the runs trained differently"
        )
        squares, count = squares + norm**2, count + want.numel()
    total, budget = math.sqrt(squares), bound * math.sqrt(max(1.0, outlier_fraction * count))
    assert total <= budget, f"the difference's norm {total:.3e} exceeds the budget {budget:.3e} over all tensors"
    if initial is not None:
        reach = adamw_drift_bound(lr, steps, betas) / 2
        for name, want in expected.items():
            moved = (want.double() - initial[name].double()).abs()
            limit = reach + steps * FLOAT32_EPS * torch.maximum(want.abs(), initial[name].abs()).double()
            assert (moved <= limit).all(), (
                f"{name}: {moved.max():.3e} from the initial weights, AdamW's reach is {reach:.3e}"
            )
        update = math.sqrt(sum((expected[n].double() - initial[n].double()).norm().item() ** 2 for n in expected))
        assert update >= 2 * budget, (
            f"the update's norm {update:.3e} is under twice the budget {budget:.3e}: this comparison could not tell "
            "a run that did not train"
        )


def sum_error_bound(terms: int) -> float:
    """Higham's ``gamma_n``: a float32 sum of ``terms`` terms, in any order, is within ``gamma_n * sum |x_i|`` of the
    exact sum."""
    nu = terms * UNIT_ROUNDOFF
    return nu / (1 - nu)


def logprob_atol(vocab_size: int, sums: Sequence[int], logit_l1: float) -> float:
    """The most two float32 computations of the same log-softmax log-probs can differ when they order the sums of
    lengths ``sums`` (one per sum a token's computation goes through, where the two ways may order it differently)
    otherwise, for logits whose terms sum to at most ``logit_l1`` in magnitude (see the module docstring)."""
    return 2 * sum_error_bound(vocab_size) + 2 * 2 * logit_l1 * sum(sum_error_bound(n) for n in sums)


def entropy_atol(vocab_size: int, logit_max: float, sums: Sequence[int] = (), logit_l1: float = 0.0) -> float:
    """The most two float32 computations of a distribution's entropy ``H = logsumexp(z) - sum_v softmax(z)_v z_v``
    can differ, for logits ``|z_v| <= logit_max`` (``logit_l1`` and ``sums`` as in :func:`logprob_atol`, for logits
    that the two ways compute with differently ordered sums).

    Each way errs by: ``gamma_V`` from the log-sum-exp's sum (relative, so absolute after the log);
    ``gamma_V * logit_max`` from the sum of ``V`` terms ``p_v z_v`` (``sum_v |p_v z_v| <= logit_max``); and the
    rounding of each ``p_v = exp(z_v - lse)``, relative ``u (2 + |z_v - lse|)`` (the argument's rounding carried by
    the exponential, the result's own, the product's), with ``|z_v - lse| <= 2 logit_max + log V``, weighted by
    ``sum_v p_v |z_v| <= logit_max``. Logits that differ by ``delta`` move ``H`` by at most ``max_v |z_v - E_p z| *
    delta <= 2 logit_max * delta`` (``dH/dz_v = -p_v (z_v - E_p z)``)."""
    gamma = sum_error_bound(vocab_size)
    spread = 2 * logit_max + math.log(vocab_size)
    one_way = gamma + gamma * logit_max + UNIT_ROUNDOFF * (2 + spread) * logit_max
    logit_delta = 2 * 2 * logit_l1 * sum(sum_error_bound(n) for n in sums)
    return 2 * one_way + 2 * logit_max * logit_delta

"""One denoising step of a rectified-flow model, as pure functions: Euler (ODE), Flow-GRPO's SDE and CPS.

Notation of diffusers' ``FlowMatchEulerDiscreteScheduler``: sigma runs from 1 (noise) to 0 (data); ``s`` is the
current and ``s'`` the next sigma, ``D = s' - s < 0``; ``x_s = (1 - s) x0 + s eps`` and the model predicts the
velocity ``v ~ eps - x0``, so ``x0_hat = x - s v`` and ``x1_hat = x + (1 - s) v`` (the predicted noise).

- ODE (Euler): ``x' = x + D v``.
- SDE (Flow-GRPO): ``std_s = eta sqrt(s / (1 - s))``; ``mu = x + (v + std_s^2 / (2 s) x1_hat) D``;
  ``std = std_s sqrt(-D)``. At ``s = 1`` the ratio's denominator uses ``s'`` (``sqrt(1 / (1 - s'))``), as the
  public Flow-GRPO code does with ``torch.where(sigma == 1, sigmas[1], sigma)``.
  On the step onto ``s' = 0`` this package switches the SDE's noise off (``std_s = 0``, so ``mu`` is the Euler step
  ``x0_hat``): the formula alone would leave ``std = std_s sqrt(s) > 0`` there, and Flow-GRPO's code does sample and
  may train that step; here the last step is deterministic for every sampler and the final latent is ``x0_hat``.
- CPS (coefficients-preserving): ``std = s' sin(eta pi / 2)``; ``mu = (1 - s') x0_hat + s' cos(eta pi / 2) x1_hat``.

Every step is evaluated as ``mu = a x + b v`` with per-sample coefficients: Euler ``a = 1``, ``b = D``; SDE
``c = std_s^2 D / (2 s)``, ``a = 1 + c``, ``b = D + c (1 - s)`` (Flow-GRPO's own grouping); CPS
``k = s' (1 - cos(eta pi / 2))`` (as ``2 s' sin^2(eta pi / 4)``, accurate for small eta), ``a = 1 - k``,
``b = D - k (1 - s)``. These are the equations above regrouped; at ``eta = 0`` they give ``a = 1`` and ``b = D``
exactly, so the step is the Euler step bit for bit. Then ``x' = mu + std z``.

Log-probabilities are exact Gaussian densities, ``-(x' - mu)^2 / (2 std^2) - log std - log(2 pi) / 2``, averaged
(MEAN, not sum) over all non-batch elements as the public implementations do; the result is ``[B]``. The CPS
reference code drops the ``1 / (2 std^2)`` factor and the normaliser (it scores ``-(x' - mu)^2``), so its ratios
and the clip range tuned for them (1e-4 .. 1e-3) do not carry over to these log-probs.

The step that lands on ``s' = 0`` (and any step with ``eta = 0``) has ``std = 0``: it is deterministic and is never
trained. The stochastic steps then return ``log_prob=None`` and refuse to score a given ``prev_sample``; use
:func:`is_trainable_step` to pick the steps to train on.

Precision: the sigmas are rounded to float32 (diffusers keeps them in float32) and read on the host; the per-sample
coefficients (``a``, ``b``, ``std`` and the log-density's ``-log std`` and ``1 / (2 std^2)``) are computed from them
in float64 and rounded once to float32; all elementwise math over the latents runs in float32 whatever the input
dtype. Computing the few scalars on the host costs one small host-to-device copy per step instead of some twenty
tiny kernels. The sample is cast back to the input dtype and its log-prob is that of the cast sample, so re-scoring
the stored sample in training (``prev_sample=``) reproduces ``logp_old`` exactly.

>>> sigmas = flow_sigmas(4)
>>> x, v = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
>>> out = cps_step(x, v, sigmas[0], sigmas[1], eta=0.7)
>>> out.sample.shape, out.log_prob.shape
(torch.Size([2, 4, 8, 8]), torch.Size([2]))
>>> rescored = cps_step(x, v, sigmas[0], sigmas[1], eta=0.7, prev_sample=out.sample)
>>> torch.equal(rescored.log_prob, out.log_prob)
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["StepOutput", "cps_step", "flow_sigmas", "is_trainable_step", "ode_step", "sde_step", "unipc_sample"]

Scalar = float | Tensor  # a Python number, a 0-d tensor or a per-sample [B] tensor (sigmas)

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class StepOutput:
    """What one step returns. Shapes: ``x`` is ``[B, ...]``.

    Attributes:
        sample: ``[B, ...]`` the next latent ``x'``, in the input dtype.
        mean: ``[B, ...]`` float32 mean ``mu`` of the transition (the Euler step for the ODE).
        std: ``[B]`` float32 standard deviation of the transition, the same for every element of a sample.
        log_prob: ``[B]`` float32 log-density of ``sample`` under ``N(mean, std^2)``, MEAN over all non-batch
            elements; differentiable w.r.t. ``v`` (the sample itself is detached). Zeros for the ODE; ``None`` for a
            stochastic step whose ``std`` is 0 (the last step, or ``eta = 0``).
    """

    sample: Tensor
    mean: Tensor
    std: Tensor
    log_prob: Tensor | None


def flow_sigmas(
    num_steps: int,
    shift: float = 1.0,
    use_dynamic_shifting: bool = False,
    mu: float | None = None,
    base_sigmas: Sequence[float] | None = None,
    **scheduler_kwargs,
) -> Tensor:
    """The ``[num_steps + 1]`` float32 sigmas of diffusers' ``FlowMatchEulerDiscreteScheduler``, ending with 0.

    Built by the scheduler's own ``set_timesteps`` (which appends the final 0), so shifting, dynamic shifting and the
    Karras/exponential/beta variants are exactly diffusers'. The transformer's timestep for step ``i`` is
    ``sigmas[i] * num_train_timesteps`` (1000 by default), as in the diffusers pipelines.

    Args:
        num_steps: denoising steps ``T``.
        shift: the static shift (SD3: 3.0); ignored with ``use_dynamic_shifting``.
        use_dynamic_shifting: resolution-dependent shift (Flux, SD3.5 with ``mu``); requires ``mu``.
        mu: the log-shift for dynamic shifting (the pipelines compute it from the image sequence length).
        base_sigmas: the ``num_steps`` unshifted sigmas a pipeline hands to ``set_timesteps`` (``FluxPipeline``:
            ``linspace(1, 1 / T, T)``); None: the scheduler's own (``linspace(1, sigma_min, T)``, as SD3's pipeline).
        **scheduler_kwargs: any other ``FlowMatchEulerDiscreteScheduler`` argument (e.g. ``shift_terminal``).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler  # heavy import, only where a schedule is built

    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if use_dynamic_shifting and mu is None:
        raise ValueError("use_dynamic_shifting=True needs mu= (the pipelines derive it from the image sequence length)")
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=shift, use_dynamic_shifting=use_dynamic_shifting, **scheduler_kwargs
    )
    scheduler.set_timesteps(num_steps, mu=mu, sigmas=base_sigmas)
    sigmas = torch.tensor(scheduler.sigmas.tolist(), dtype=torch.float32, device="cpu")  # [T + 1]
    if sigmas.shape != (num_steps + 1,) or sigmas[-1] != 0:
        raise ValueError("the scheduler must run sigma down to a final 0 (invert_sigmas is not supported)")
    return sigmas


def is_trainable_step(sigma_next: Scalar) -> bool | Tensor:
    """Whether a step into ``sigma_next`` is stochastic and can be trained: ``sigma_next > 0``.

    The step onto ``s' = 0`` is deterministic for every sampler here (CPS's ``std = s' sin(eta pi / 2)`` is 0 and the
    SDE's noise is switched off there), so it is never trained. A step with ``eta = 0`` is deterministic as well; that
    is the caller's choice of sampler, not a property of the schedule. Returns a ``bool`` for a number and a bool
    tensor of the same shape for a tensor.
    """
    if isinstance(sigma_next, Tensor):
        return sigma_next > 0
    return float(sigma_next) > 0


def ode_step(x: Tensor, v: Tensor, sigma: Scalar, sigma_next: Scalar) -> StepOutput:
    """Euler step ``x' = x + D v``; ``std`` and ``log_prob`` are zeros (a deterministic step adds nothing)."""
    return _step(x, v, [(1.0, s_next - s, 0.0) for s, s_next in _sigma_pairs(x, sigma, sigma_next)], ode=True)


def sde_step(
    x: Tensor,
    v: Tensor,
    sigma: Scalar,
    sigma_next: Scalar,
    eta: float,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    prev_sample: Tensor | None = None,
) -> StepOutput:
    """Flow-GRPO SDE step (``eta`` is its noise level ``a``; Flow-GRPO uses 0.7).

    Args:
        x: ``[B, ...]`` current latent at ``sigma``, any float dtype.
        v: ``[B, ...]`` predicted velocity at ``sigma``.
        sigma: ``s``, a number or a ``[B]`` tensor, in ``(0, 1]``.
        sigma_next: ``s'``, a number or a ``[B]`` tensor, in ``[0, s)``.
        eta: noise level, ``>= 0``; 0 is the Euler step.
        noise: ``[B, ...]`` standard normal ``z``; drawn (float32, from ``generator``) when omitted.
        generator: the random generator for the drawn noise.
        prev_sample: a stored ``x'`` to score instead of sampling (training); it is returned as ``sample``.
    """
    eta = _check_eta(eta, upper=None)
    coefficients = []
    for s, s_next in _sigma_pairs(x, sigma, sigma_next):
        d = s_next - s
        # std_s^2, with Flow-GRPO's rule at s = 1; 0 on the step onto s' = 0 (see the module docstring)
        var_s = 0.0 if s_next == 0 else eta**2 * s / (1 - (s_next if s == 1 else s))
        c = var_s / (2 * s) * d  # mu = x + D v + c x1_hat = (1 + c) x + (D + c (1 - s)) v
        coefficients.append((1 + c, d + c * (1 - s), math.sqrt(var_s * -d)))
    return _step(x, v, coefficients, noise=noise, generator=generator, prev_sample=prev_sample)


def cps_step(
    x: Tensor,
    v: Tensor,
    sigma: Scalar,
    sigma_next: Scalar,
    eta: float,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    prev_sample: Tensor | None = None,
) -> StepOutput:
    """Coefficients-preserving step, ``eta`` in [0, 1]: 0 is Euler, 1 re-noises fully at ``s'`` (paper: 0.7).

    Arguments as in :func:`sde_step`.
    """
    eta = _check_eta(eta, upper=1.0)
    sin = math.sin(eta * math.pi / 2)  # exactly 1 at eta = 1
    one_minus_cos = 2 * math.sin(eta * math.pi / 4) ** 2  # 1 - cos(eta pi / 2), accurate for small eta
    coefficients = []
    for s, s_next in _sigma_pairs(x, sigma, sigma_next):
        k = s_next * one_minus_cos  # mu = x + D v - k x1_hat = (1 - k) x + (D - k (1 - s)) v
        coefficients.append((1 - k, (s_next - s) - k * (1 - s), s_next * sin))
    return _step(x, v, coefficients, noise=noise, generator=generator, prev_sample=prev_sample)


def _check_eta(eta: float, upper: float | None) -> float:
    eta = float(eta)
    if not (eta >= 0 and (upper is None or eta <= upper)):
        interval = "[0, inf)" if upper is None else f"[0, {upper:g}]"
        raise ValueError(f"eta must be in {interval}, got {eta}")
    return eta


def _sigma_pairs(x: Tensor, sigma: Scalar, sigma_next: Scalar) -> list[tuple[float, float]]:
    """Per-sample ``(s, s')`` as Python floats holding float32 values; checks ``0 <= s' < s <= 1``."""
    if x.ndim < 2:
        raise ValueError(f"x must be [B, ...] with at least one non-batch dim, got shape {tuple(x.shape)}")
    batch = x.shape[0]
    per_sample = []
    for value in (sigma, sigma_next):
        if not isinstance(value, Tensor):
            values = [float(np.float32(value))]
        elif value.ndim > 1 or (value.ndim == 1 and value.shape[0] not in (1, batch)):
            raise ValueError(f"expected a number or a [B] tensor with B = {batch}, got shape {tuple(value.shape)}")
        else:  # one host read (a sync for a device tensor)
            values = value.detach().float().reshape(-1).tolist()
        per_sample.append(values * batch if len(values) == 1 else values)
    pairs = list(zip(*per_sample))  # noqa: B905 (both lists hold B values)
    if not all(0 <= s_next < s <= 1 for s, s_next in pairs):
        raise ValueError(f"expected 0 <= sigma_next < sigma <= 1 for every sample, got {pairs}")
    return pairs


def _step(
    x: Tensor,
    v: Tensor,
    coefficients: list[tuple[float, float, float]],
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    prev_sample: Tensor | None = None,
    ode: bool = False,
) -> StepOutput:
    """``mu = a x + b v``, then sample (or take ``prev_sample``) and score; one ``(a, b, std)`` per sample."""
    if v.shape != x.shape:
        raise ValueError(f"x and v must have the same shape, got {tuple(x.shape)} and {tuple(v.shape)}")
    num_deterministic = sum(std == 0 for _, _, std in coefficients)
    if num_deterministic not in (0, len(coefficients)):
        raise ValueError("a batch mixes deterministic (std = 0) and stochastic steps; step them separately")
    stochastic = num_deterministic == 0
    if prev_sample is not None:
        if noise is not None or generator is not None:
            raise ValueError("pass prev_sample (to score a stored transition) or noise/generator (to sample), not both")
        if prev_sample.shape != x.shape:
            raise ValueError(f"prev_sample must have shape {tuple(x.shape)}, got {tuple(prev_sample.shape)}")
        if not stochastic:
            raise ValueError(
                "cannot score a deterministic step (std = 0: the last step or eta = 0); see is_trainable_step"
            )
    if noise is not None and noise.shape != x.shape:
        raise ValueError(f"noise must have shape {tuple(x.shape)}, got {tuple(noise.shape)}")

    # one [5, B] float32 table: a, b, std and the log-density's -log std - log(2 pi) / 2 and -1 / (2 std^2)
    # (NaN where std = 0: a deterministic step has no density)
    rows = [
        (a, b, std, -math.log(std) - _HALF_LOG_2PI, -0.5 / std**2) if std > 0 else (a, b, 0.0, math.nan, math.nan)
        for a, b, std in coefficients
    ]
    table = torch.tensor(rows, dtype=torch.float32).T.contiguous().to(x.device)  # [5, B]
    a, b, std, log_norm, neg_half_prec = table  # [B] each
    col = (-1,) + (1,) * (x.ndim - 1)  # [B] -> [B, 1, ...]
    mean = a.view(col) * x.float() + b.view(col) * v.float()  # [B, ...]
    if ode:
        return StepOutput(sample=mean.to(x.dtype), mean=mean, std=std, log_prob=torch.zeros_like(std))
    if prev_sample is None:
        if noise is None:
            noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=torch.float32)
        sample = torch.addcmul(mean, std.view(col), noise.float()).to(x.dtype)  # mu + std z, [B, ...]
    else:
        sample = prev_sample
    if not stochastic:
        return StepOutput(sample=sample, mean=mean, std=std, log_prob=None)
    # the mean over elements of -(x' - mu)^2 / (2 std^2) - log std - log(2 pi) / 2 (std is constant per sample)
    diff = (sample.detach().float() - mean).flatten(1)  # [B, N]
    log_prob = torch.addcmul(log_norm, neg_half_prec, (diff * diff).mean(dim=1))  # [B]
    return StepOutput(sample=sample, mean=mean, std=std, log_prob=log_prob)


def unipc_sample(velocity, noise: Tensor, sigmas: Tensor, solver_order: int = 2) -> Tensor:
    """Deterministic sample with diffusers' ``UniPCMultistepScheduler`` in flow mode (``use_flow_sigmas``,
    ``prediction_type="flow_prediction"``, ``flow_shift=1`` because ``sigmas`` ``[T + 1]`` are already shifted) on the
    same schedule as the Euler sampler; ``velocity(x, sigma)`` gives the ``[N, ...]`` float32 velocity at ``x``.

    UniPC predicts ``x0 = x - sigma v`` and combines the last ``solver_order`` predictions (a predictor-corrector
    multistep method), so with the same T it is more accurate than Euler. The scheduler nudges a first sigma of
    exactly 1 to ``1 - 1e-6`` (its log-SNR is infinite there); the velocity is evaluated at the scheduler's sigmas.
    """
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(
        num_train_timesteps=1000,
        solver_order=solver_order,
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=1.0,
    )
    scheduler.set_timesteps(sigmas=sigmas[:-1].double().cpu().numpy(), device=noise.device)
    if float(sigmas[-1]) != 0.0:
        raise ValueError(f"unipc_sample needs a schedule ending at sigma 0, got {float(sigmas[-1])}")
    timesteps = scheduler.timesteps.tolist()
    if len(set(timesteps)) < len(timesteps):  # the scheduler finds its step by timestep: a repeat breaks its order
        raise ValueError(
            f"unipc_sample needs sigmas at least 1/1000 apart (UniPC's timesteps are sigma x 1000 as integers), got "
            f"timesteps {timesteps}: use fewer steps"
        )
    x = noise.float()
    for i, t in enumerate(scheduler.timesteps):
        v = velocity(x, scheduler.sigmas[i].float())  # [N, ...]
        x = scheduler.step(v, t, x, return_dict=False)[0].float()
    return x

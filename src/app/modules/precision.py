"""In which dtype a fit stores its weights, gradients and optimizer state, and computes: one line at every fit start,
and a warning when the trainable weights themselves are 16-bit.

AdamW's step at the learning rates of GRPO (1e-6) is far below half a bfloat16 ulp of a weight (2^-9 of its
magnitude), so a bfloat16 weight rounds most of its updates away. That happens when ``trainer.precision`` is
``bf16-true`` / ``16-true`` (Lightning casts every parameter, LoRA adapters included) or when full fine-tuning loads the
policy in a 16-bit ``dtype``. Float32 master weights with 16-bit compute come from ``bf16-mixed`` (autocast), or from
FSDP2's ``param_dtype`` over float32 sharded parameters; a frozen base may stay 16-bit under LoRA.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from app.dtypes import dtype_name

log = logging.getLogger(__name__)

SIXTEEN_BIT = (torch.bfloat16, torch.float16)
_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
_TRUE_16 = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "bf16": torch.bfloat16, "16": torch.float16}
POLICY_DTYPE_FIELD = "model.init_args.policy.init_args.dtype"


@dataclass(frozen=True)
class PrecisionReport:
    """Element counts per dtype of each stored quantity, and the dtype matrix products run in."""

    trainable: dict[torch.dtype, int]
    frozen: dict[torch.dtype, int]
    optimizer_state: dict[torch.dtype, int]  # empty before the first step: AdamW makes its moments like the weights
    compute: str
    reduce: str | None  # the gradient reduction's dtype where the strategy sets one (FSDP2's reduce_dtype)
    precision: str  # trainer.precision as Lightning reads it

    def line(self) -> str:
        state = (
            _dtypes(self.optimizer_state)
            if self.optimizer_state
            else f"{_dtypes(self.trainable)} (AdamW, as the weights)"
        )
        grads = _dtypes(self.trainable) + (f", reduced in {self.reduce}" if self.reduce else "")
        frozen = f"; frozen weights {_dtypes(self.frozen)}" if self.frozen else ""
        return (
            f"precision: trainable weights {_dtypes(self.trainable)}{frozen}; gradients {grads}; optimizer state "
            f"{state}; compute {self.compute} (trainer.precision {self.precision})"
        )

    def sixteen_bit_trainable(self) -> int:
        return sum(n for dtype, n in self.trainable.items() if dtype in SIXTEEN_BIT)

    def warning(self) -> str | None:
        """Why the trainable weights are 16-bit and which fields to change; None when they are not."""
        sixteen = self.sixteen_bit_trainable()
        if not sixteen:
            return None
        total = sum(self.trainable.values())
        if self.precision in _TRUE_16:
            cause = (
                f"trainer.precision: {self.precision} casts every parameter, LoRA adapters included, to "
                f"{dtype_name(_TRUE_16[self.precision])}; use bf16-mixed (autocast over float32 trainable weights)"
            )
        else:
            cause = (
                f"{POLICY_DTYPE_FIELD} loads the trained weights in 16 bits; use float32 there (under "
                "app.parallel.FSDP2Strategy with param_dtype: bfloat16 compute stays bfloat16)"
            )
        return (
            f"{sixteen} of {total} trainable elements are stored in 16 bits: AdamW updates smaller than half a ulp "
            f"of a weight round away (at lr 1e-6 most of them). {cause}"
        )


def precision_report(
    module: nn.Module, optimizers: Sequence[torch.optim.Optimizer], precision: str, strategy: object
) -> PrecisionReport:
    """The report of ``module``'s parameters as the fit holds them (sharded parameters count their local shard)."""
    trainable: Counter = Counter()
    frozen: Counter = Counter()
    for param in _unique(module.parameters()):
        (trainable if param.requires_grad else frozen)[param.dtype] += _local_numel(param)
    state: Counter = Counter()
    for optimizer in optimizers:
        for param_state in optimizer.state.values():
            for key, value in param_state.items():
                if key != "step" and isinstance(value, torch.Tensor) and value.is_floating_point():
                    state[value.dtype] += _local_numel(value)
    param_dtype, reduce_dtype = _strategy_dtypes(strategy)
    precision = str(precision)
    if precision in _AUTOCAST:
        compute = f"{dtype_name(_AUTOCAST[precision])} (autocast)"
    elif param_dtype is not None:
        compute = f"{dtype_name(param_dtype)} (FSDP2 param_dtype)"
    else:
        compute = f"as the weights, {_dtypes(trainable + frozen)}"
    return PrecisionReport(
        trainable=dict(trainable),
        frozen=dict(frozen),
        optimizer_state=dict(state),
        compute=compute,
        reduce=dtype_name(reduce_dtype) if reduce_dtype is not None else None,
        precision=precision,
    )


def report_precision(module: nn.Module, optimizers: Sequence[torch.optim.Optimizer], trainer) -> PrecisionReport:
    """Print :func:`precision_report`'s line through Lightning's rank-zero log (shown like its own set-up lines) and log
    its warning, on rank 0 (every rank holds the same dtypes)."""
    report = precision_report(module, optimizers, trainer.precision, trainer.strategy)
    if trainer.is_global_zero:
        rank_zero_info(report.line())
        warning = report.warning()
        if warning:
            log.warning(warning)
    return report


def _strategy_dtypes(strategy: object) -> tuple[torch.dtype | None, torch.dtype | None]:
    policy = getattr(strategy, "mixed_precision", None)  # app.parallel.FSDP2Strategy's MixedPrecisionPolicy
    return getattr(policy, "param_dtype", None), getattr(policy, "reduce_dtype", None)


def _unique(params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
    return list({id(p): p for p in params}.values())


def _local_numel(tensor: torch.Tensor) -> int:
    to_local = getattr(tensor, "to_local", None)  # a DTensor counts the shard this rank stores
    return (to_local() if callable(to_local) else tensor).numel()


def _dtypes(counts: dict[torch.dtype, int]) -> str:
    """``float32`` for one dtype; ``float32 (1,024) + bfloat16 (96)`` by element count, largest first, for several."""
    if not counts:
        return "none"
    if len(counts) == 1:
        return dtype_name(next(iter(counts)))
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    return " + ".join(f"{dtype_name(dtype)} ({n:,})" for dtype, n in ordered)

"""An exponential moving average of a policy's trainable weights, for validation and export (:class:`PolicyEMA`).

The averages are buffers of their own module, one per trainable parameter and in its layout: under FSDP2 each rank
averages its shard (a clone of a sharded parameter is a ``DTensor`` with the same placements), so the average costs
each rank its share of the trainable weights and goes into sharded checkpoints as they do. Lean checkpoints keep these
buffers (:attr:`PolicyEMA.checkpoint_buffers`, :func:`~app.modules.checkpoints.omit_frozen_parameters`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from app.settings import EMASettings


class PolicyEMA(nn.Module):
    """The moving average of ``parameters`` (:class:`~app.settings.EMASettings` says how it moves).

    Args:
        parameters: the trainable parameters to average, as the optimizer holds them (sharded ones under FSDP2).
        settings: decay, first step and interval of :meth:`step`; None for an average moved only by :meth:`follow`
            (a schedule of the caller's, as DiffusionNFT's sampling policy).

    Example:
        >>> weight = nn.Parameter(torch.tensor([0.0]))
        >>> ema = PolicyEMA([weight], EMASettings(decay=0.5))
        >>> with torch.no_grad():
        ...     _ = weight.fill_(4.0)
        >>> ema.step(), ema.averages[0].item()
        (True, 2.0)
        >>> with ema.swapped_in():
        ...     weight.item()
        2.0
        >>> weight.item()
        4.0
    """

    checkpoint_buffers = True
    """Lean checkpoints keep this module's buffers, though it holds no trained parameter."""

    def __init__(self, parameters: Sequence[nn.Parameter], settings: EMASettings | None = None) -> None:
        super().__init__()
        if not parameters:
            raise ValueError("an EMA needs trainable parameters to average")
        self.settings = settings
        self.tracked = list(parameters)  # not registered: the policy owns them
        for i, parameter in enumerate(self.tracked):
            self.register_buffer(f"average_{i}", parameter.detach().clone())
        # optimizer steps taken in, saved with the averages (a checkpoint written mid-step-loop resumes the count)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long, device="cpu"))

    @property
    def averages(self) -> list[Tensor]:
        return [getattr(self, f"average_{i}") for i in range(len(self.tracked))]

    @torch.no_grad()
    def step(self) -> bool:
        """Take in the weights after an optimizer step (step ``t``: the ``t``-th taken in); True when the average
        moved by the decay rule, False when it only followed the weights (before ``start_step``) or skipped this step
        (``every_n_steps``)."""
        settings = self.settings
        if settings is None:
            raise ValueError("this average has no EMASettings: move it with follow(decay)")
        self.steps += 1
        global_step = int(self.steps)
        if global_step < settings.start_step:
            for average, parameter in zip(self.averages, self.tracked, strict=True):
                average.copy_(parameter.detach())
            return False
        if (global_step - settings.start_step) % settings.every_n_steps:
            return False
        for average, parameter in zip(self.averages, self.tracked, strict=True):
            average.lerp_(parameter.detach().to(average.dtype), 1.0 - settings.decay)
        return True

    @torch.no_grad()
    def follow(self, decay: float) -> None:
        """``average <- decay * average + (1 - decay) * weights`` now (0: the weights themselves)."""
        self.steps += 1
        for average, parameter in zip(self.averages, self.tracked, strict=True):
            average.lerp_(parameter.detach().to(average.dtype), 1.0 - decay)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averages in the parameters for the duration (validation, export); the trained weights back after,
        bit for bit."""
        with torch.no_grad():
            trained = [parameter.detach().clone() for parameter in self.tracked]
            for parameter, average in zip(self.tracked, self.averages, strict=True):
                parameter.copy_(average)
        try:
            yield
        finally:
            with torch.no_grad():
                for parameter, weights in zip(self.tracked, trained, strict=True):
                    parameter.copy_(weights)

    def extra_repr(self) -> str:
        s = self.settings
        if s is None:
            return f"tensors={len(self.tracked)}, moved by follow(decay)"
        return (
            f"tensors={len(self.tracked)}, decay={s.decay}, start_step={s.start_step}, every_n_steps={s.every_n_steps}"
        )

"""What the Lightning modules need of a policy, whatever it generates (text with a VLM, images with a flow model)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Policy(Protocol):
    """A trainable generator with a KL reference.

    "Reference" means one thing for every policy: the model the KL term compares against. With LoRA it is the same
    model with the adapter disabled; with full fine-tuning it is ``frozen_reference``, a frozen copy of the starting
    weights that :meth:`enable_reference` makes (modules call it only when ``beta > 0``, so runs without a KL term
    never hold a second copy). Inside ``with policy.reference():`` the policy's forward passes are the reference's.
    """

    uses_lora: bool
    frozen_reference: nn.Module | None

    @property
    def device(self) -> torch.device: ...

    def trainable_parameters(self) -> list[nn.Parameter]: ...

    def enable_reference(self) -> None: ...

    def reference(self) -> AbstractContextManager[None]: ...

    def export(self, output_dir: str | Path) -> Path: ...

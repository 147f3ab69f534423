"""What the Lightning modules need of a policy, whatever it generates (text with a VLM, images with a flow model)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from app.parallel.plan import ShardingPlan

_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


@runtime_checkable
class Policy(Protocol):
    """A trainable generator with a KL reference.

    "Reference" means one thing for every policy: the model the KL term compares against. With LoRA it is the same
    model with the adapter disabled; with full fine-tuning it is ``frozen_reference``, a frozen copy of the starting
    weights that :meth:`enable_reference` makes (modules call it only when ``beta > 0``, so runs without a KL term
    never hold a second copy). Inside ``with policy.reference():`` the policy's forward passes are the reference's.

    A policy may also have ``parameter_groups(learning_rate) -> list[dict]``: its trainable parameters as torch
    optimizer param groups, some with their own ``lr`` (the VLM policy's ``vision_learning_rate``); the modules'
    optimizer uses it when present, and ``trainable_parameters()`` at the module's rate otherwise (it is not part of
    the protocol, so a policy without it is still one).
    """

    uses_lora: bool
    frozen_reference: nn.Module | None

    @property
    def device(self) -> torch.device: ...

    def trainable_parameters(self) -> list[nn.Parameter]: ...

    def enable_reference(self) -> None: ...

    def reference(self) -> AbstractContextManager[None]: ...

    def export(self, output_dir: str | Path) -> Path: ...

    def sharding_plan(self) -> ShardingPlan: ...


class SwitchableReference:
    """:meth:`enable_reference`, :meth:`reference`, :attr:`base_network` and :attr:`device` for an ``nn.Module`` policy
    whose ``model`` is a PEFT model (LoRA) or the plain network.

    The policy sets ``uses_lora``, ``frozen_reference = None`` and ``_use_reference = False`` in its ``__init__`` and
    runs its forward passes on ``frozen_reference`` while ``_use_reference`` is True.
    """

    @property
    def base_network(self) -> nn.Module:
        """The trained network without the PEFT wrapper (LoRA layers are injected into it in place)."""
        return self.model.get_base_model() if self.uses_lora else self.model

    @property
    def device(self) -> torch.device:
        return next(self.base_network.parameters()).device

    def enable_reference(self) -> None:
        """Prepare the KL reference. With LoRA it is the adapter-disabled model (free); with full fine-tuning a frozen
        copy of the starting weights, made here once. Lean checkpoints leave the copy out
        (:mod:`app.modules.checkpoints`): a resumed run makes it again from the base checkpoint the config names, so
        it is the same reference only when the run starts from the same base weights."""
        if not self.uses_lora and self.frozen_reference is None:
            self.frozen_reference = copy.deepcopy(self.base_network).requires_grad_(False).eval()

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Inside, the policy's forward passes are the reference policy's: the adapter disabled (LoRA) or the frozen
        copy (full fine-tuning, after :meth:`enable_reference`)."""
        if self.uses_lora:
            with self.model.disable_adapter():
                yield
            return
        if self.frozen_reference is None:
            raise RuntimeError("the reference needs enable_reference() first (done by modules with beta > 0)")
        previous, self._use_reference = self._use_reference, True
        try:
            yield
        finally:
            self._use_reference = previous


def disable_dropout(network: nn.Module) -> list[str]:
    """Make every dropout of ``network`` the identity, in train mode too (so the network stays in train mode, where
    gradient checkpointing acts); the names of the modules that had a non-zero one.

    Dropout layers (PEFT's LoRA dropout among them) get ``p = 0``, as TRL's ``disable_dropout_in_model`` does, and
    transformers' attention modules, which read a float ``attention_dropout`` in their forward, get 0.
    """
    changed = []
    for name, module in network.named_modules():
        if isinstance(module, _DROPOUTS) and module.p > 0:
            module.p = 0.0
            changed.append(name)
        elif isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout > 0:
            module.attention_dropout = 0.0
            changed.append(name)
    return changed

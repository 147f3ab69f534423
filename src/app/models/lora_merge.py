"""LoRA adapters folded into the base weights for a rollout, without touching the base weights.

During decoding a LoRA linear layer costs three products per token (``x W``, ``x A`` and ``(x A) B``) and, on a
small model, as many kernel launches; with ``W + s B A`` formed once per rollout it costs one. Merging in place (peft's
``merge`` / ``unmerge``) would add and subtract the delta in the weights' dtype every step, so bf16 base weights would
drift by a rounding error per step. Here the merged weight is a new tensor put in the layer's place for the rollout and
the original tensor is put back afterwards, bit for bit; the price is one merged copy of every adapted weight while the
rollout runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from app.parallel.fsdp import fsdp_modules


def mergeable_lora_layers(model: nn.Module) -> list[nn.Module]:
    """The vanilla LoRA linear layers of ``model`` whose adapters can be folded into a copy of the base weight: not
    merged already, adapters enabled, no DoRA or other variant and no LoRA bias among the active adapters. Other
    layers keep computing their adapters as usual."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # pragma: no cover - peft is a core dependency
        return []
    layers = []
    for module in model.modules():
        if not isinstance(module, LoraLinear) or module.merged or module.disable_adapters:
            continue
        active = [a for a in module.active_adapters if a in module.lora_A]
        if active and not any(a in module.lora_variant or module.lora_bias[a] for a in active):
            layers.append(module)
    return layers


@contextmanager
def merged_lora(model: nn.Module) -> Iterator[int]:
    """Inside, each mergeable LoRA layer of ``model`` computes ``x (W + ΔW)`` in one product, ``ΔW`` being the sum of
    its active adapters' deltas, and bypasses its adapter branch; on exit every layer has its original weight tensor
    and its adapters back. Yields the number of merged layers (0 for a model without LoRA, and for an FSDP-sharded
    model, whose gathered weights are buffers FSDP owns). Use under ``torch.no_grad()``: the merged weight is not a
    parameter, so no gradient reaches the adapters through it."""
    if fsdp_modules(model):
        yield 0
        return
    swapped: list[tuple[nn.Module, torch.Tensor]] = []
    try:
        for layer in mergeable_lora_layers(model):
            weight = layer.get_base_layer().weight
            original = weight.data
            delta = sum(layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A)
            weight.data = original + delta.to(original.dtype)
            swapped.append((layer, original))
            layer._disable_adapters = True  # peft's flag: forward runs the base layer only
        yield len(swapped)
    finally:
        for layer, original in swapped:
            layer.get_base_layer().weight.data = original
            layer._disable_adapters = False

"""Policies the tests of several folders build and change: a plain helper module, not a test file (pytest collects
nothing here). Test files import it as ``from policy_helpers import ...``: ``tests/`` is on ``sys.path`` (pytest puts
the folder of ``tests/conftest.py`` there, as for ``tolerances.py``)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from app.models import VLMPolicy
from app.settings import LANGUAGE_MODEL_PROJECTIONS, LoRASettings

VISION_BLOCKS = r".*visual\.blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(fc1|fc2|gate_proj|up_proj|down_proj))"
"""The attention and MLP linears of every block of the tiny Qwen2- and Qwen2.5-VL vision towers (not the merger)."""


def vision_lora_policy(model: str = "tiny-qwen2.5-vl", **kwargs) -> VLMPolicy:
    """LoRA r 4 (no dropout) on the language model's projections and on the vision blocks' linears."""
    targets = f"{LANGUAGE_MODEL_PROJECTIONS}|{VISION_BLOCKS}"
    return VLMPolicy(model, lora=LoRASettings(r=4, alpha=8, dropout=0.0, target_modules=targets), **kwargs)


def vision_split(policy: VLMPolicy) -> tuple[dict, dict]:
    """The vision tower's parameters by name: its LoRA adapters, and its base weights."""
    vision = {id(p) for p in policy.vision_parameters()}
    named = [(n, p) for n, p in policy.model.named_parameters() if id(p) in vision]
    return {n: p for n, p in named if "lora_" in n}, {n: p for n, p in named if "lora_" not in n}


def perturb(parameters: Iterable[torch.Tensor], scale: float = 0.05, seed: int = 1) -> None:
    """Add seeded Gaussian noise of std ``scale`` to each parameter in place (a "trained" adapter, say)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in parameters:
            p.add_(torch.randn(p.shape, generator=generator) * scale)

"""Optional GPU kernels (Liger). Everything falls back to PyTorch when they are missing or on CPU."""

from __future__ import annotations

import importlib
import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

# model_type -> name of liger-kernel's patch function for that family
_LIGER_PATCHES = {
    "qwen2_vl": "apply_liger_kernel_to_qwen2_vl",
    "qwen2_5_vl": "apply_liger_kernel_to_qwen2_5_vl",
    "qwen3_vl": "apply_liger_kernel_to_qwen3_vl",
}


def apply_optional_kernels(model: nn.Module, use_liger_kernel: bool) -> bool:
    """Patch ``model`` with Liger kernels when asked, installed and on CUDA; returns whether it was patched.

    Liger's fused linear cross-entropy is not used: the policy computes log-probs itself, in chunks.
    """
    if not use_liger_kernel:
        return False
    if not torch.cuda.is_available():
        log.warning("use_liger_kernel=True ignored: Liger kernels need CUDA; using PyTorch kernels")
        return False
    name = _LIGER_PATCHES.get(getattr(model.config, "model_type", ""))
    try:
        patch = getattr(importlib.import_module("liger_kernel.transformers"), name) if name else None
    except (ImportError, AttributeError) as error:  # not installed, or built for another transformers version
        log.warning("use_liger_kernel=True ignored: %s", error)
        return False
    if patch is None:
        log.warning("use_liger_kernel=True ignored: no Liger patch for %s", model.config.model_type)
        return False
    patch(model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False)
    return True

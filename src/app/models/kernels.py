"""Optional GPU kernels: Liger's fused RMSNorm, SwiGLU and rotary kernels for the VLM policy by module replacement,
Liger's fused RMSNorm in the flow transformers' query/key norms, the attention implementations the VLM's
``from_pretrained`` may be asked for, and the flow transformers' attention backend (diffusers' attention dispatcher).

liger-kernel's own model patch (``apply_liger_kernel_to_qwen2_5_vl``) does not import against transformers 5.x, so the
language model's modules are replaced here with liger-kernel's public modules and ops. A kernel that is requested but
unavailable is an error naming the option and what is missing, never a silent fallback.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

log = logging.getLogger(__name__)

ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
"""The VLM ``attn_implementation`` choices. ``sdpa`` lets PyTorch pick its flash kernel when the inputs allow it."""

FLOW_ATTENTION_BACKENDS = ("native", "_native_flash", "flash", "_flash_3")
"""diffusers attention-dispatcher backends a flow transformer may use: PyTorch SDPA, PyTorch's own flash kernel (CUDA),
FlashAttention-2 (flash-attn) and FlashAttention-3 (its ``flash_attn_interface``, built from source)."""

_VISION_SCOPES = ("visual", "vision_tower", "vision_model")
_GATED_ACTIVATIONS = ("silu", "swish")


@dataclass
class LigerTargets:
    """What the Liger replacement touches in a model (qualified names), language model only.

    Attributes:
        rms_norms: RMSNorm modules (decoder layer norms, the final norm, Qwen3's q/k norms).
        mlps: gated SiLU MLPs (``gate_proj`` / ``up_proj`` / ``down_proj``).
        rotary_modules: transformers modeling modules whose ``apply_rotary_pos_emb`` the attention layers call.
    """

    rms_norms: list[str] = field(default_factory=list)
    mlps: list[str] = field(default_factory=list)
    rotary_modules: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"RMSNorm x{len(self.rms_norms)}, SwiGLU x{len(self.mlps)}, rotary in {', '.join(self.rotary_modules)}"


def validate_attn_implementation(name: str | None) -> str | None:
    """Check an ``attn_implementation`` choice against what is installed; returns it (None = library default)."""
    if name is None:
        return None
    if name not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation must be one of {list(ATTN_IMPLEMENTATIONS)} or None, got {name!r}")
    if name == "flash_attention_2":
        missing = _missing(flash_attn=True)
        if missing:
            raise RuntimeError(f"attn_implementation='flash_attention_2' needs {' and '.join(missing)}; use 'sdpa'")
    return name


def liger_targets(model: nn.Module) -> LigerTargets:
    """The modules of ``model``'s language model that :func:`apply_liger_kernels` replaces (the vision tower keeps its
    own kernels)."""
    targets = LigerTargets()
    for name, module in model.named_modules():
        if any(scope in name.split(".") for scope in _VISION_SCOPES):
            continue
        if type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), nn.Parameter):
            targets.rms_norms.append(name)
        elif _is_gated_silu_mlp(module):
            targets.mlps.append(name)
        elif hasattr(module, "q_proj") and hasattr(module, "k_proj"):
            modeling = type(module).__module__
            if hasattr(sys.modules.get(modeling), "apply_rotary_pos_emb") and modeling not in targets.rotary_modules:
                targets.rotary_modules.append(modeling)
    return targets


def apply_liger_kernels(model: nn.Module) -> LigerTargets:
    """Replace the language model's RMSNorm and SwiGLU MLP modules with liger-kernel's and its rotary function with
    Liger's fused one. Needs liger-kernel and CUDA (the kernels are Triton); raises a short error naming what is
    missing otherwise. Weights are kept (the same parameter objects), so state-dict keys and LoRA targets are unchanged.

    The rotary function is replaced in the transformers modeling module, which every model of that family in this
    process shares (as liger-kernel's own patch does).
    """
    require_liger()
    targets = liger_targets(model)
    replace_with_liger(model, targets)
    log.info("Liger kernels applied: %s", targets.summary())
    return targets


def require_liger() -> None:
    """Raise a short error naming what ``use_liger_kernel=True`` lacks here (liger-kernel, CUDA)."""
    missing = _missing(liger=True)
    if missing:
        raise RuntimeError(f"use_liger_kernel=True needs {' and '.join(missing)}; set use_liger_kernel: false")


def replace_with_liger(model: nn.Module, targets: LigerTargets) -> None:
    """The replacement itself (builds Liger modules around the existing weights; runs without CUDA, their forward
    does not)."""
    from liger_kernel.transformers import LigerSwiGLUMLP, liger_rotary_pos_emb

    for name in targets.rms_norms:
        _set_submodule(model, name, _liger_rms_norm(model.get_submodule(name), casting_mode="llama"))
    config = _text_config(model)
    for name in targets.mlps:
        old = model.get_submodule(name)
        with torch.device("meta"):
            new = LigerSwiGLUMLP(config, intermediate_size=old.gate_proj.out_features)
        new.gate_proj, new.up_proj, new.down_proj = old.gate_proj, old.up_proj, old.down_proj
        _set_submodule(model, name, new)
    for modeling in targets.rotary_modules:
        sys.modules[modeling].apply_rotary_pos_emb = liger_rotary_pos_emb


def flow_rms_norm_targets(transformer: nn.Module) -> list[str]:
    """The RMSNorms of a diffusers transformer that :func:`apply_liger_rms_norm` replaces: ``torch.nn.RMSNorm`` (Wan's
    and FLUX's query/key norms) and diffusers' ``RMSNorm`` (SD3.5's ``qk_norm: rms_norm``), over the last dimension
    with a weight and no bias. SD3 / SD3.5-medium without ``qk_norm`` have none."""
    from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm

    return [
        name
        for name, module in transformer.named_modules()
        if isinstance(module, (nn.RMSNorm, DiffusersRMSNorm))
        and isinstance(getattr(module, "weight", None), nn.Parameter)
        and module.weight.ndim == 1
        and getattr(module, "bias", None) is None
    ]


def apply_liger_rms_norm(transformer: nn.Module) -> list[str]:
    """Replace a diffusers transformer's RMSNorms (:func:`flow_rms_norm_targets`) with Liger's fused RMSNorm around
    the same weights (state-dict keys and LoRA targets unchanged). Needs liger-kernel and CUDA: a short error naming
    what is missing otherwise. Returns the replaced module names."""
    require_liger()
    targets = flow_rms_norm_targets(transformer)
    replace_flow_rms_norms(transformer, targets)
    log.info("Liger RMSNorm applied to %d modules of %s", len(targets), type(transformer).__name__)
    return targets


def replace_flow_rms_norms(transformer: nn.Module, targets: list[str]) -> None:
    """The replacement itself (runs without CUDA; the Liger modules' forward does not). ``torch.nn.RMSNorm`` computes
    in float32 and casts once at the end (Liger's ``gemma`` casting, offset 0); diffusers' ``RMSNorm`` casts the
    normalised input to the weight's dtype before the product (``llama`` casting)."""
    for name in targets:
        old = transformer.get_submodule(name)
        casting_mode = "gemma" if isinstance(old, nn.RMSNorm) else "llama"
        _set_submodule(transformer, name, _liger_rms_norm(old, casting_mode))


def _liger_rms_norm(old: nn.Module, casting_mode: str) -> nn.Module:
    """A ``LigerRMSNorm`` holding ``old``'s weight (the same parameter) and epsilon."""
    from liger_kernel.transformers import LigerRMSNorm

    eps = getattr(old, "variance_epsilon", getattr(old, "eps", None))
    if eps is None:  # torch.nn.RMSNorm(eps=None) uses the machine epsilon of the input's dtype
        eps = torch.finfo(old.weight.dtype).eps
    with torch.device("meta"):  # no throw-away allocation; the weight is the old module's
        new = LigerRMSNorm(old.weight.shape[0], eps=eps, offset=0.0, casting_mode=casting_mode, in_place=False)
    new.weight = old.weight
    return new


def set_flow_attention_backend(transformer: nn.Module, backend: str) -> None:
    """Route a diffusers transformer's attention through ``backend`` (``set_attention_backend``). A short error when
    the backend needs what is missing here, or when the transformer's attention does not go through the dispatcher
    (SD3's ``JointAttnProcessor2_0`` calls PyTorch SDPA itself: only ``native`` applies to it)."""
    if backend not in FLOW_ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {list(FLOW_ATTENTION_BACKENDS)}, got {backend!r}")
    processors = {type(m.processor).__name__: m.processor for m in transformer.modules() if _has_processor(m)}
    fixed = sorted(name for name, p in processors.items() if not hasattr(p, "_attention_backend"))
    if len(fixed) == len(processors) and backend != "native":
        raise RuntimeError(
            f"attention_backend={backend!r} does not apply to {type(transformer).__name__}: its attention "
            f"({', '.join(fixed)}) calls PyTorch SDPA directly, not diffusers' dispatcher; use 'native'"
        )
    if fixed and backend != "native":
        log.warning("attention_backend=%r: %s keep PyTorch SDPA (not dispatched)", backend, ", ".join(fixed))
    missing = [] if backend == "native" else _missing(flash_attn=backend == "flash", flash_attn_3=backend == "_flash_3")
    if missing:
        raise RuntimeError(f"attention_backend={backend!r} needs {' and '.join(missing)}; use 'native'")
    if len(fixed) < len(processors):
        transformer.set_attention_backend(backend)


def _has_processor(module: nn.Module) -> bool:
    return getattr(module, "processor", None) is not None


def _missing(liger: bool = False, flash_attn: bool = False, flash_attn_3: bool = False) -> list[str]:
    missing = []
    if liger and importlib.util.find_spec("liger_kernel") is None:
        missing.append("liger-kernel (pip install '.[gpu]')")
    if flash_attn and importlib.util.find_spec("flash_attn") is None:
        missing.append("flash-attn (pip install '.[gpu]', builds on CUDA machines only)")
    if flash_attn_3 and importlib.util.find_spec("flash_attn_interface") is None:
        missing.append("FlashAttention-3 (flash_attn_interface, built from source for Hopper GPUs)")
    if not torch.cuda.is_available():
        missing.append("a CUDA device")
    return missing


def _is_gated_silu_mlp(module: nn.Module) -> bool:
    projections = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    activation = type(getattr(module, "act_fn", None)).__name__.lower()
    return all(p is not None for p in projections) and any(a in activation for a in _GATED_ACTIVATIONS)


def _text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)

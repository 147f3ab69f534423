"""PEFT LoRA adapters, the same way for both families: the targets checked, the base weights frozen, B at zero (the
policy starts exactly at the base model)."""

from __future__ import annotations

from torch import nn

from app.models.lora_targets import check_lora_targets
from app.settings import LoRASettings


def lora_adapter(network: nn.Module, lora: LoRASettings, model_name: str) -> nn.Module:
    """``network`` wrapped in a PEFT LoRA adapter (only the adapters require gradients). ``lora`` has its family's
    defaults filled in (:func:`~app.settings.with_defaults`). Targets that match no module are an error naming them
    and ``model_name`` (:func:`~app.models.lora_targets.check_lora_targets`)."""
    from peft import LoraConfig, get_peft_model

    check_lora_targets(network, lora.target_modules, model_name)
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules)
    network.requires_grad_(False)
    return get_peft_model(network, config)


def trainable_transformer(transformer: nn.Module, lora: LoRASettings | None, model_name: str = "") -> nn.Module:
    """``transformer`` with every parameter trainable (``lora`` None), or wrapped in a LoRA adapter."""
    if lora is None:
        return transformer.requires_grad_(True)
    return lora_adapter(transformer, lora, model_name or type(transformer).__name__)

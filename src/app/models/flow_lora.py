"""What of a flow transformer trains: a PEFT LoRA adapter on its attention projections, or the whole transformer."""

from __future__ import annotations

from typing import Protocol

from torch import nn

from app.models.lora_targets import check_lora_targets


class LoRAShape(Protocol):
    """What the adapter is built from (``app.models.lora_settings.FlowLoRASettings``)."""

    r: int
    alpha: int
    dropout: float
    target_modules: str | list[str]


def trainable_transformer(transformer: nn.Module, lora: LoRAShape | None, model_name: str = "") -> nn.Module:
    """``transformer`` with every parameter trainable (``lora`` None), or wrapped in a PEFT LoRA adapter whose B starts
    at zero (the policy starts exactly at the base model) with the base weights frozen. Targets that match no module
    are an error naming them and ``model_name`` (:func:`~app.models.lora_targets.check_lora_targets`)."""
    if lora is None:
        return transformer.requires_grad_(True)
    from peft import LoraConfig, get_peft_model

    check_lora_targets(transformer, lora.target_modules, model_name or type(transformer).__name__)

    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        init_lora_weights=True,
    )
    transformer.requires_grad_(False)
    return get_peft_model(transformer, config)

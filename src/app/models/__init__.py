"""Model builders: the VLM policy (+LoRA, kernels)."""

from app.models.vlm import LoRASettings, SamplingSettings, VLMPolicy

__all__ = ["LoRASettings", "SamplingSettings", "VLMPolicy"]

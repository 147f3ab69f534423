"""Model builders: the VLM policy (+LoRA, kernels)."""

from app.models.vlm import LoRASettings, SamplingSettings, VLMPolicy

__all__ = ["LoRASettings", "SamplingSettings", "VLMPolicy"]

from app.models.flow import FlowLoRASettings, FlowPolicy  # noqa: E402

__all__ += ["FlowLoRASettings", "FlowPolicy"]

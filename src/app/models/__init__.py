"""Policies: the VLM policy (+LoRA, kernels), the flow-matching policy, and the protocol both satisfy."""

from app.models.policy import Policy
from app.models.vlm import LoRASettings, SamplingSettings, VLMPolicy

__all__ = ["LoRASettings", "Policy", "SamplingSettings", "VLMPolicy"]

from app.models.flow import FlowLoRASettings, FlowPolicy  # noqa: E402

__all__ += ["FlowLoRASettings", "FlowPolicy"]

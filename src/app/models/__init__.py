"""Policies: the VLM policy (+LoRA, kernels), the flow-matching policy, and the protocol both satisfy. Their settings
(:class:`~app.settings.LoRASettings`, sampling) are in :mod:`app.settings`."""

from app.models.policy import Policy
from app.models.vlm import VLMPolicy

__all__ = ["Policy", "VLMPolicy"]

from app.models.flow import FlowPolicy  # noqa: E402

__all__ += ["FlowPolicy"]

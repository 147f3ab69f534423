"""LightningModules: VLM supervised fine-tuning (Reason-RFT stage 1), VLM GRPO and flow-matching GRPO."""

from app.modules.base import VLMModule
from app.modules.flow_grpo import FlowGRPOModule
from app.modules.grpo import VLMGRPOModule
from app.modules.sft import VLMSFTModule

__all__ = ["FlowGRPOModule", "VLMGRPOModule", "VLMModule", "VLMSFTModule"]

from app.modules.flow_matching import FlowMatchingModule  # noqa: E402

__all__ += ["FlowMatchingModule"]

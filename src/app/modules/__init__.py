"""LightningModules: VLM supervised fine-tuning (Reason-RFT stage 1) and VLM GRPO."""

from app.modules.base import VLMModule
from app.modules.grpo import VLMGRPOModule
from app.modules.sft import VLMSFTModule

__all__ = ["VLMGRPOModule", "VLMModule", "VLMSFTModule"]

"""LightningModules: VLM supervised fine-tuning (Reason-RFT stage 1), the GRPO skeleton with its VLM and flow-matching
families (flow-GRPO and DiffusionNFT for flow models), and flow-matching pretraining."""

from app.modules.flow_dpo import FlowDPOModule
from app.modules.flow_grpo import FlowGRPOModule
from app.modules.flow_matching import FlowMatchingModule
from app.modules.flow_nft import FlowNFTModule
from app.modules.grpo import GRPOModule
from app.modules.policy_module import NonFiniteCheckpointError, NonFiniteTrainingError, PolicyModule
from app.modules.sft import VLMSFTModule
from app.modules.vlm_grpo import VLMGRPOModule

__all__ = [
    "FlowDPOModule",
    "FlowGRPOModule",
    "FlowMatchingModule",
    "FlowNFTModule",
    "GRPOModule",
    "NonFiniteCheckpointError",
    "NonFiniteTrainingError",
    "PolicyModule",
    "VLMGRPOModule",
    "VLMSFTModule",
]

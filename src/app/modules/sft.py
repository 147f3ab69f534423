"""Supervised fine-tuning on chains of thought (Reason-RFT stage 1, CoT-SFT).

The target of a sample is ``<think>{reasoning}</think><answer>{answer}</answer>`` closed by the end-of-turn token; the
loss is the mean negative log-likelihood of those assistant tokens only (prompt and image tokens carry no loss). Its
exported policy (``ExportPolicy`` callback or ``python -m app export``) is what GRPO starts from.
"""

from __future__ import annotations

from app.modules.base import VLMModule
from app.types import VisualSample


def sft_target(sample: VisualSample) -> str:
    if sample.answer is None:
        raise ValueError(f"SFT needs labeled samples; a {sample.task!r} sample has no answer")
    reasoning = sample.reasoning or ""
    return f"<think>{reasoning}</think><answer>{sample.answer}</answer>"


class VLMSFTModule(VLMModule):
    """CoT supervised fine-tuning of a :class:`~app.models.VLMPolicy` (arguments as :class:`VLMModule`)."""

    def training_step(self, batch: list[VisualSample], batch_idx: int):
        prompts = self.policy.encode_prompts(batch)
        targets = self.policy.encode_targets([sft_target(s) for s in batch])
        logprobs = self.policy.sequence_logprobs(prompts, targets.completion_ids, targets.completion_mask)  # [B, L]
        mask = targets.completion_mask.float()
        loss = -(logprobs * mask).sum() / mask.sum()
        self.log("train/loss/sft", loss, prog_bar=True, batch_size=len(batch))
        return loss

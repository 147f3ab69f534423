"""Supervised fine-tuning on chains of thought (Reason-RFT stage 1, CoT-SFT).

The target of a sample is ``<think>{reasoning}</think><answer>{answer}</answer>`` closed by the end-of-turn token; the
loss is the mean negative log-likelihood of those assistant tokens only (prompt and image tokens carry no loss). Its
exported policy (``ExportPolicy`` callback or ``python -m app export``) is what GRPO starts from.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.formats import format_response
from app.models.vlm import VLMPolicy
from app.modules.policy_module import PolicyModule
from app.modules.vlm_evaluation import VLMEvaluation, default_eval_rewards
from app.rewards import RewardComponent
from app.settings import EMASettings, OptimizerSettings
from app.types import VisualSample


def sft_target(sample: VisualSample) -> str:
    if sample.answer is None:
        raise ValueError(f"SFT needs labeled samples; a {sample.task!r} sample has no answer")
    return format_response(sample.reasoning or "", sample.answer)


class VLMSFTModule(VLMEvaluation, PolicyModule):
    """CoT supervised fine-tuning of a :class:`~app.models.VLMPolicy`, evaluated by greedy decoding.

    Args:
        policy: the model to train.
        optimizer: AdamW (default learning rate 1e-6), its warm-up, non-finite steps
            (:class:`~app.settings.OptimizerSettings`).
        eval_max_new_tokens: generation budget for greedy evaluation.
        eval_rewards: rewards scored on greedy completions in validation / test, logged as ``val/<name>/<task>``
            (``accuracy`` is logged as ``val/acc/<task>``, ``format`` as the format rate). Default: accuracy and format.
        ema: a moving average of the trainable weights for validation and export (:class:`~app.settings.EMASettings`);
            None: the trained weights.
    """

    def __init__(
        self,
        policy: VLMPolicy,
        optimizer: OptimizerSettings | None = None,
        eval_max_new_tokens: int = 256,
        eval_rewards: Sequence[RewardComponent] | None = None,
        ema: EMASettings | None = None,
    ):
        super().__init__(policy, optimizer, default_learning_rate=1e-6, ema=ema)
        self.eval_max_new_tokens = eval_max_new_tokens
        self.eval_rewards = default_eval_rewards(eval_rewards)
        self.eval_results = {}
        self.record_hyperparameters(eval_max_new_tokens=eval_max_new_tokens)

    def training_step(self, batch: list[VisualSample], batch_idx: int):
        prompts = self.policy.encode_prompts(batch)
        targets = self.policy.encode_targets([sft_target(s) for s in batch])
        logprobs = self.policy.sequence_logprobs(prompts, targets.completion_ids, targets.completion_mask)  # [B, L]
        mask = targets.completion_mask.float()
        loss = -(logprobs * mask).sum() / mask.sum()
        self.log("train/loss/sft", loss, prog_bar=True, batch_size=len(batch))
        return loss

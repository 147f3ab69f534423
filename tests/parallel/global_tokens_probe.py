"""Runs under ``torchrun`` (two processes) or alone (one): one GRPO update of a tiny VLM with LoRA on a fixed global
rollout, for ``test_global_tokens.py``.

    torchrun --standalone --nproc_per_node 2 tests/parallel/global_tokens_probe.py OUT AGGREGATION [AGGREGATION ...]
    python tests/parallel/global_tokens_probe.py OUT AGGREGATION [AGGREGATION ...]

The global rollout is 2 prompts x K = 4 completions of fixed tokens with fixed advantages; prompt 0's completions
hold 1-4 tokens (10 in all), prompt 1's 5-8 (26), so the ranks' token counts differ. With two processes rank ``r``
trains on prompt ``r``'s rows (DDP averages the gradients); alone, one process trains on all 8 rows. Rank 0 writes
``OUT/<aggregation>.world<W>.pt``: the trainable parameters' gradients as the optimizer sees them (after DDP's
average), and the tokens each rank held.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
from fsdp_probe import LengthReward, run_cases, trainer_for
from torch.utils.data import DataLoader

from app.models import VLMPolicy
from app.modules import VLMGRPOModule
from app.settings import GRPOSettings, LoRASettings, OptimizerSettings, SamplingSettings, VLMLossSettings
from app.tasks.dots import DotsDataset
from app.types import CompletionBatch, RewardOutput, Rollout, SampledCompletions

K, L_MAX = 4, 8
LENGTHS = [[1, 2, 3, 4], [5, 6, 7, 8]]  # completion tokens of each prompt's K rows
ADVANTAGES = [[1.0, -0.5, 0.25, -0.75], [-1.0, 0.5, 0.75, -0.25]]


class FixedRolloutGRPO(VLMGRPOModule):
    """Trains once on this rank's part of the fixed global rollout and keeps the gradients the optimizer steps on."""

    def training_step(self, batch, batch_idx):
        self._train_on([self.fixed_rollout()])

    def fixed_rollout(self) -> Rollout:
        world, rank = self.trainer.world_size, self.trainer.global_rank
        prompts = range(len(LENGTHS)) if world == 1 else [rank]
        dataset = DotsDataset(len(LENGTHS), 0, image_size=64, dot_radius=12)
        samples = [dataset[p] for p in prompts]
        prompt_inputs = self.policy.encode_prompts(samples, rows_per_prompt=K)
        lengths = torch.tensor([n for p in prompts for n in LENGTHS[p]])  # [N]
        mask = (torch.arange(L_MAX)[None, :] < lengths[:, None]).long()  # [N, L]
        tokens = torch.randint(0, 1000, (2 * K, L_MAX), generator=torch.Generator().manual_seed(0))
        ids = torch.cat([tokens[p * K : (p + 1) * K] for p in prompts]) * mask  # the same tokens on 1 or 2 ranks
        completions = CompletionBatch(ids, mask, [""] * len(ids), torch.zeros(len(ids), dtype=torch.bool), K)
        advantages = torch.tensor([a for p in prompts for a in ADVANTAGES[p]])
        sampled = SampledCompletions(prompt_inputs, completions, old_logprobs=None, ref_logprobs=None)
        rewards = RewardOutput(advantages, {})
        self.tokens = int(mask.sum())
        return Rollout(samples, sampled, rewards, advantages=advantages, loss_mask=mask, rows_per_prompt=K)

    def on_before_optimizer_step(self, optimizer):
        super().on_before_optimizer_step(optimizer)
        self.grads = {n: p.grad.detach().clone() for n, p in self.policy.named_parameters() if p.grad is not None}


def run(out: Path, aggregation: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    L.seed_everything(0, verbose=False)  # the same initial weights on every rank
    policy = VLMPolicy("tiny-qwen2-vl", lora=LoRASettings(r=4, alpha=8, dropout=0.0), instruction="")
    with torch.no_grad():  # B away from 0, so that A gets a gradient too
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    module = FixedRolloutGRPO(
        policy,
        [LengthReward()],
        SamplingSettings(group_size=K, max_new_tokens=L_MAX),
        grpo=GRPOSettings(gradient_clip_val=0.0, micro_batch_size=3),
        optimizer=OptimizerSettings(learning_rate=1e-3),
        loss=VLMLossSettings(aggregation=aggregation),
    )
    trainer = trainer_for("ddp" if world > 1 else "auto", out / aggregation, 1, [], same_draws=False)
    trainer.fit(module, train_dataloaders=DataLoader([0] * world, batch_size=1, collate_fn=list))
    tokens = trainer.strategy.all_gather(torch.tensor(module.tokens)).reshape(-1).tolist()
    if trainer.global_rank == 0:
        torch.save({"grads": module.grads, "tokens": tokens}, out / f"{aggregation}.world{world}.pt")


if __name__ == "__main__":
    run_cases(run)

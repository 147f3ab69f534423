"""The optimizer every module uses: AdamW with a linear learning-rate warm-up, stepped per optimizer step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def adamw_with_warmup(params: Iterable[Any], learning_rate: float, weight_decay: float, warmup_steps: int) -> dict:
    """Lightning's ``configure_optimizers`` dict: AdamW over ``params`` (parameters or param groups, which may set
    their own ``lr``) and a warm-up from ``1 / (warmup_steps + 1)`` of the rate to all of it, the same factor for
    every group's rate."""
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
    warmup = max(warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

"""The callback a rehearsal adds to every fit: what the run stored, in which dtype it computed, whether its losses
stayed finite and which share of the trainable elements its updates changed, written as JSON on rank 0."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import lightning as L
import torch
from torch import nn

from app.dtypes import dtype_name
from app.parallel.fsdp import full_tensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


class RehearsalProbe(L.Callback):
    """Records one fit of a rehearsal.

    Args:
        report: the JSON file written at the end of the fit (rank 0).
        initial: the trainable weights before the first update of the run; written by the first fit that finds it
            missing, read by every later one (a resumed fit counts its changes from the run's start, not its own).
    """

    def __init__(self, report: str, initial: str):
        self.report = Path(report)
        self.initial = Path(initial)
        self.compute: Counter = Counter()
        self.gradients: Counter = Counter()
        self.losses: list[float] = []
        self._hooks: list = []

    # ----------------------------------------------------------------------------------------------- recording
    def on_train_start(self, trainer, pl_module):
        weights = self._trainable(pl_module)  # a collective under FSDP2: every rank gathers
        if trainer.is_global_zero and not self.initial.exists():
            self.initial.parent.mkdir(parents=True, exist_ok=True)
            torch.save(weights, self.initial)
        trainer.strategy.barrier()
        for module in pl_module.modules():
            if isinstance(module, nn.Linear):
                self._hooks.append(module.register_forward_hook(self._record_compute))

    def _record_compute(self, module, args, output):
        if module.training and isinstance(output, torch.Tensor) and torch.is_grad_enabled():
            self.compute[dtype_name(output.dtype)] += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self.gradients[dtype_name(param.grad.dtype)] += _local(param.grad).numel()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        losses = [float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/loss")]
        self.losses.extend(losses)

    # ----------------------------------------------------------------------------------------------- the report
    def on_train_end(self, trainer, pl_module):
        for hook in self._hooks:
            hook.remove()
        weights = self._trainable(pl_module)
        if not trainer.is_global_zero:
            return
        initial = torch.load(self.initial, weights_only=True)
        changed = total = 0
        for name, value in weights.items():
            changed += int(torch.ne(value, initial[name]).sum())
            total += value.numel()
        stored = Counter()
        frozen = Counter()
        for param in {id(p): p for p in pl_module.parameters()}.values():
            (stored if param.requires_grad else frozen)[dtype_name(param.dtype)] += _local(param).numel()
        state = Counter()
        for optimizer in trainer.optimizers:
            for param_state in optimizer.state.values():
                for key, value in param_state.items():
                    if key != "step" and isinstance(value, torch.Tensor) and value.is_floating_point():
                        state[dtype_name(value.dtype)] += _local(value).numel()
        report = {
            "global_step": trainer.global_step,
            "trainable": dict(stored),
            "frozen": dict(frozen),
            "gradients": dict(self.gradients),
            "optimizer_state": dict(state),
            "compute": dict(self.compute),
            "losses": self.losses,
            "losses_finite": bool(self.losses) and all(math.isfinite(v) for v in self.losses),
            "changed_elements": changed,
            "trainable_elements": total,
            "changed_share": changed / total if total else 0.0,
            "skipped_updates": int(getattr(pl_module, "skipped_updates", 0)),
        }
        self.report.parent.mkdir(parents=True, exist_ok=True)
        self.report.write_text(json.dumps(report, indent=2))

    @staticmethod
    def _trainable(pl_module) -> dict[str, torch.Tensor]:
        """The full trainable weights (gathered from every rank's shard), on the CPU, by name."""
        return {
            name: full_tensor(param.detach()).cpu().clone()
            for name, param in pl_module.named_parameters()
            if param.requires_grad
        }

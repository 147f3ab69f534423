"""Throughput of GRPO training: samples/s, generated tokens/s, seconds per phase of a step, and MFU on GPU.

The rates come from Lightning's :class:`~lightning.fabric.utilities.throughput.Throughput` over a sliding window of
steps, timed on training steps only (validation pauses the clock). A step's samples are the N = B * K outputs it trained
on (completions or images, ``outputs["rewards"]``); its generated tokens are the real tokens of those completions
(``outputs["generated_tokens"]``, which the VLM modules return). A step that trained nothing (the delayed pipeline's
first step only primes the queue, and its outputs are empty) logs its time and adds no samples; the rates start from
the first step that trained. Phase times come from ``outputs["timings"]`` (``rollout``, ``reward``,
``update`` seconds) that the GRPO modules return.

MFU is an estimate, logged only where Lightning knows the device's peak FLOP/s (CUDA): FLOPs per step =
``(2 + 6 * num_iterations) * parameters * generated tokens`` (one forward per generated token, forward + backward per
update); prompt tokens and the rollout's KV-cache re-reads are not counted, so it is a lower bound.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.fabric.utilities.throughput import Throughput, get_available_flops

from callbacks.step_outputs import rows_per_prompt


class ThroughputLogger(L.Callback):
    """Log ``train/throughput/{samples_per_sec,tokens_per_sec,mfu}`` and ``train/time/{step,rollout,reward,update}``
    every step (rates once ``window_size`` steps have been seen). ``last`` holds the latest values.

    Args:
        window_size: steps in the sliding window of the rates (at least 2).
        peak_flops: the device's peak FLOP/s for MFU, where Lightning does not know it (a GPU it has no table entry
            for, or a CPU); None: Lightning's figure for a CUDA device, no MFU elsewhere.
    """

    def __init__(self, window_size: int = 5, peak_flops: float | None = None) -> None:
        if window_size < 2:
            raise ValueError(f"window_size must be >= 2 (a rate needs two points in time), got {window_size}")
        if peak_flops is not None and peak_flops <= 0:
            raise ValueError(f"peak_flops must be > 0 or null, got {peak_flops}")
        self.window_size, self.peak_flops = window_size, peak_flops
        self.last: dict[str, float] = {}
        self._throughput: Throughput | None = None
        self._started: float | None = None
        self._train_time = 0.0
        self._batches = self._samples = self._tokens = 0
        self._flops_per_token: float | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        available = self.peak_flops
        parameter = next(pl_module.parameters(), None)
        if available is None and parameter is not None and parameter.device.type == "cuda":
            available = get_available_flops(parameter.device, parameter.dtype)
        self._throughput = Throughput(
            available_flops=available, world_size=trainer.world_size, window_size=self.window_size
        )
        grpo = getattr(pl_module, "grpo", None)  # GRPO makes num_iterations updates per rollout, SFT one
        iterations = grpo.num_iterations if grpo is not None else 1
        self._flops_per_token = (2 + 6 * iterations) * sum(p.numel() for p in pl_module.parameters())
        self._train_time = 0.0
        self._batches = self._samples = self._tokens = 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._started is None or self._throughput is None:
            return
        seconds = time.perf_counter() - self._started
        self._started = None
        self._train_time += seconds
        if not outputs:  # trained nothing: its time counts toward the next rate, it adds no samples
            self._log(trainer, {"train/time/step": seconds})
            return
        self._batches += 1
        self._samples += self._trained_samples(outputs, batch)
        tokens = outputs.get("generated_tokens") if isinstance(outputs, dict) else None
        if tokens is not None:
            self._tokens += int(tokens)
        flops = self._flops_per_token * int(tokens) if tokens is not None and self._throughput.available_flops else None
        self._throughput.update(
            time=self._train_time,
            batches=self._batches,
            samples=self._samples,
            lengths=self._tokens if tokens is not None else None,
            flops=flops,
        )
        rates = self._throughput.compute()
        values = {"train/time/step": seconds}
        names = {
            "device/samples_per_sec": "samples_per_sec",
            "device/items_per_sec": "tokens_per_sec",
            "device/mfu": "mfu",
        }
        values.update({f"train/throughput/{names[k]}": float(v) for k, v in rates.items() if k in names})
        timings = outputs.get("timings") if isinstance(outputs, dict) else None
        values.update({f"train/time/{phase}": float(s) for phase, s in (timings or {}).items()})
        self._log(trainer, values)

    @staticmethod
    def _trained_samples(outputs: Any, batch: Any) -> int:
        """The outputs the step trained on: the rows of its rewards (GRPO), else the batch's prompts times the rows of
        each prompt the step drew."""
        rewards = outputs.get("rewards") if isinstance(outputs, dict) else None
        if rewards is not None and hasattr(rewards, "total"):
            return len(rewards.total)
        return len(batch) * rows_per_prompt(outputs) if isinstance(batch, (list, tuple)) else 0

    def _log(self, trainer: L.Trainer, values: dict[str, float]) -> None:
        self.last = values
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step)

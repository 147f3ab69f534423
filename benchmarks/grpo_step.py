"""CPU time of a VLM GRPO step at the side-by-side harness geometry, with and without shared-prefix rollouts.

    python benchmarks/grpo_step.py                    # full and LoRA: about 1 minute on an idle machine
    python benchmarks/grpo_step.py --modes lora --steps 20

Geometry: tiny-qwen2.5-vl (random weights of the embedded config), 4 prompts x K = 8 completions x 32 new tokens,
float32, 2 threads, the quickstart's dots task (64-pixel images), accuracy + format rewards, one update per rollout.
The step is one Lightning training batch (rollout + rewards + update), timed by a callback; the table shows medians
over ``--steps`` steps of each kind after ``--warmup`` warm-up steps, and the step's process CPU time (with one thread,
the work itself, whatever other processes' load). Within one training run, steps alternate between
shared-prefix and per-row prefill (``policy.shared_prefix`` toggled before each batch), so load from other processes
on a shared machine falls on both alike; the processor runs once per prompt in both. TRL 1.16's GRPOTrainer at this
geometry: ``benchmarks/trl_grpo_step.py`` (docs/performance.md#against-trls-grpotrainer has both side by side).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning as L  # noqa: E402
import torch  # noqa: E402


class AlternatingStepTimer(L.Callback):
    """Alternates shared-prefix and per-row rollouts from batch to batch; records each batch's wall time and the
    module's rollout / reward / update split under its kind."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.steps: dict[bool, list[float]] = {True: [], False: []}
        self.cpu: dict[bool, list[float]] = {True: [], False: []}  # process CPU seconds
        self.phases: dict[bool, list[dict]] = {True: [], False: []}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pl_module.policy.shared_prefix = batch_idx % 2 == 1
        self._start, self._cpu = time.perf_counter(), time.process_time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx >= 2 * self.warmup:
            shared = pl_module.policy.shared_prefix
            self.steps[shared].append(time.perf_counter() - self._start)
            self.cpu[shared].append(time.process_time() - self._cpu)
            self.phases[shared].append(outputs["timings"])


def run(mode: str, steps: int, warmup: int, model: str) -> AlternatingStepTimer:
    from app.data import VisualTaskDataModule
    from app.models import VLMPolicy
    from app.modules import VLMGRPOModule
    from app.rewards import AccuracyReward, FormatReward
    from app.settings import LoRASettings, OptimizerSettings, SamplingSettings
    from app.tasks.dots import DotsDataset

    L.seed_everything(0)
    lora = LoRASettings(r=8, alpha=16, dropout=0.0) if mode == "lora" else None
    policy = VLMPolicy(model, lora=lora)
    sampling = SamplingSettings(group_size=8, max_new_tokens=32)
    rewards = [AccuracyReward(weight=1.0), FormatReward(weight=0.5)]
    module = VLMGRPOModule(
        policy, rewards, sampling, eval_max_new_tokens=4, optimizer=OptimizerSettings(learning_rate=1e-5)
    )
    data = VisualTaskDataModule(
        functools.partial(DotsDataset, dot_radius=12),
        train_size=8 * (steps + warmup + 1),
        val_size=4,
        test_size=4,
        batch_size=4,
        seed=0,
        image_size=64,
    )
    timer = AlternatingStepTimer(warmup)
    trainer = L.Trainer(
        max_steps=2 * (warmup + steps),
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[timer],
    )
    trainer.fit(module, data)
    return timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=["full", "lora"], default=["full", "lora"])
    parser.add_argument("--steps", type=int, default=15, help="timed steps of each kind")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.model}, 4 prompts x 8 x 32 tokens, float32, {args.threads} threads; medians of {args.steps} steps")
    print("| mode | rollouts | step (s) | rollout (s) | reward (s) | update (s) | CPU (s) |")
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes:
        timer = run(mode, args.steps, args.warmup, args.model)
        for shared in (False, True):
            phase = {k: statistics.median(p[k] for p in timer.phases[shared]) for k in ("rollout", "reward", "update")}
            name = "shared prefix" if shared else "per row"
            print(
                f"| {mode} | {name} | {statistics.median(timer.steps[shared]):.3f} | {phase['rollout']:.3f} "
                f"| {phase['reward']:.3f} | {phase['update']:.3f} | {statistics.median(timer.cpu[shared]):.3f} |"
            )


if __name__ == "__main__":
    main()

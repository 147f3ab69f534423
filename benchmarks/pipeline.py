"""How much reward latency the one-step-delayed pipeline hides (docs/pipeline.md, docs/performance.md#reward-pipeline).

For the tiny VLM (tiny-qwen2-vl) and the tiny flow model (tiny-sd3), measures the rollout time T_r and the update time
T_u of a plain step, then runs steps with a reward that costs R seconds per batch (it sleeps, as a scorer in another
process or on another machine would: the training thread is free meanwhile), R = 0 .. 1.5 x T_r, with delay 0 and
delay 1. Target: with delay 1 the step takes at most 1.1 x max(T_r + T_u, R), i.e. the reward is hidden behind the
next rollout and the update whenever R <= T_r + T_u.

    OMP_NUM_THREADS=1 python benchmarks/pipeline.py                 # both families, 10 timed steps per cell
    OMP_NUM_THREADS=1 python benchmarks/pipeline.py --family flow --steps 20
    OMP_NUM_THREADS=1 python benchmarks/pipeline.py --family vlm --remote --prompts 8   # served, 64 per request

With ``--remote`` the reward is served by another process (``python -m app.rewards.serve``, restarted per cell) and
the module scores it through :class:`~app.rewards.RemoteReward`, one request per rollout (``--prompts`` x K outputs).

Step times are medians over the timed steps (after 2 warm-up steps; with delay 1 the priming step is not timed). The
bound of a delay-1 step is taken from its own rollout and update times (they vary with sampled completion lengths and
the machine's load); "reward hidden" is 1 - (median wait for the rewards) / R.
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
from torch.utils.data import DataLoader  # noqa: E402

from app.rewards import RemoteReward, RewardComponent  # noqa: E402
from app.settings import OptimizerSettings, PipelineSettings  # noqa: E402
from app.types import VisualSample  # noqa: E402

WARMUP = 2


class CostlyReward(RewardComponent):
    """Costs ``seconds`` per batch (a sleep: the caller's thread is free meanwhile); the value varies with the
    output."""

    value_range = (0.0, float("inf"))

    def __init__(self, seconds: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def score(self, completions, samples):
        time.sleep(self.seconds)
        return torch.tensor([float(_size(c)) for c in completions])


def _size(output) -> float:
    return len(output) / 8 if isinstance(output, str) else float(output[0].float().mean())


class StepTimer(L.Callback):
    """Wall time of each training batch, and of the rollout / reward wait / update inside it."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.phases: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if outputs:  # a delayed pipeline's priming step returns nothing
            self.steps.append(time.perf_counter() - self._start)
            self.phases.append(outputs["timings"])


def vlm_module(reward: RewardComponent, pipeline: PipelineSettings):
    from app.models import VLMPolicy
    from app.modules import VLMGRPOModule
    from app.settings import LoRASettings, SamplingSettings

    policy = VLMPolicy("tiny-qwen2-vl", lora=LoRASettings(r=4, alpha=8, dropout=0.0))
    sampling = SamplingSettings(group_size=8, max_new_tokens=32)
    return VLMGRPOModule(
        policy,
        [reward],
        sampling,
        eval_max_new_tokens=4,
        pipeline=pipeline,
        optimizer=OptimizerSettings(learning_rate=1e-4),
    )


def vlm_data(num_batches: int, prompts: int = 4):
    from app.data import VisualTaskDataModule
    from app.tasks.dots import DotsDataset

    return VisualTaskDataModule(
        functools.partial(DotsDataset, dot_radius=12),
        train_size=prompts * num_batches,
        val_size=4,
        test_size=4,
        batch_size=prompts,
        seed=0,
        image_size=64,
    )


def flow_module(reward: RewardComponent, pipeline: PipelineSettings):
    from app.models import FlowPolicy
    from app.modules import FlowGRPOModule
    from app.settings import FlowGRPOSamplingSettings, LoRASettings

    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8), resolution={"height": 64, "width": 64})
    sampling = FlowGRPOSamplingSettings(group_size=4, num_steps=8)
    return FlowGRPOModule(
        policy, [reward], sampling, pipeline=pipeline, optimizer=OptimizerSettings(learning_rate=1e-4)
    )


def flow_data(num_batches: int, prompts: int = 4):
    samples = [
        VisualSample(images=[], question=f"a red square, number {i}", task="red") for i in range(prompts * num_batches)
    ]
    return DataLoader(samples, batch_size=prompts, collate_fn=list)


FAMILIES = {"vlm": (vlm_module, vlm_data), "flow": (flow_module, flow_data)}


def run(family: str, seconds: float, delay: int, steps: int, remote: bool = False, prompts: int = 4) -> StepTimer:
    if not remote:
        return _run(family, CostlyReward(seconds), delay, steps, prompts)
    from remote_reward import served

    config = f"rewards:\n  - class_path: pipeline.CostlyReward\n    init_args: {{seconds: {seconds}}}\n"
    with served(config) as url:
        return _run(family, RemoteReward(url, "costly", max_batch=1024), delay, steps, prompts)


def _run(family: str, reward: RewardComponent, delay: int, steps: int, prompts: int) -> StepTimer:
    build, data = FAMILIES[family]
    L.seed_everything(0)
    module = build(reward, PipelineSettings(delay=delay, workers="thread"))
    timer = StepTimer()
    trainer = L.Trainer(
        max_steps=WARMUP + steps,
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
    trainer.fit(module, data(WARMUP + steps + 2, prompts))
    timer.steps, timer.phases = timer.steps[WARMUP:], timer.phases[WARMUP:]
    return timer


def median(values) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), nargs="*", default=["vlm", "flow"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per cell")
    parser.add_argument("--fractions", type=float, nargs="*", default=[0.0, 0.25, 0.5, 1.0, 1.5])
    parser.add_argument("--remote", action="store_true", help="serve the reward from another process")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per rollout (x K outputs per request)")
    args = parser.parse_args()
    cell = functools.partial(run, remote=args.remote, prompts=args.prompts)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    for family in args.family:
        base = cell(family, 0.0, 0, args.steps)
        rollout = median(p["rollout"] for p in base.phases)
        update = median(p["update"] for p in base.phases)
        print(f"\n{family}: rollout T_r = {rollout:.3f} s, update T_u = {update:.3f} s (median of a plain step, R = 0)")
        print(
            "| R / T_r | R (s) | delay 0 step (s) | delay 1 step (s) | delay 1 T_r + T_u (s) "
            "| delay 1 step / max(T_r + T_u, R) | worst step / bound | reward hidden | wait (s) |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for fraction in args.fractions:
            seconds = fraction * rollout
            plain = median(cell(family, seconds, 0, args.steps).steps)
            delayed = cell(family, seconds, 1, args.steps)
            # each step against its own bound: the rollout it drew and the update it made (they vary from step to
            # step: sampled completion lengths, the shared machine's load)
            work = [p["rollout"] + p["update"] for p in delayed.phases]
            ratios = [step / max(w, seconds) for step, w in zip(delayed.steps, work, strict=True)]
            wait = median(p["reward"] for p in delayed.phases)
            hidden = f"{1 - wait / seconds:.0%}" if seconds > 0 else "-"
            print(
                f"| {fraction:.2f} | {seconds:.3f} | {plain:.3f} | {median(delayed.steps):.3f} | {median(work):.3f} "
                f"| {median(ratios):.3f} | {max(ratios):.3f} | {hidden} | {wait:.3f} |"
            )


if __name__ == "__main__":
    main()

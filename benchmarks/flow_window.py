"""What a MixGRPO window saves per flow-GRPO step against the full-SDE trajectory (docs/algorithms.md#training-steps).

Tiny SD3 at 64 px, 2 prompts x K 4, 8 denoising steps, a dense reward; one fit per arm, alternating arms over
``--rounds`` rounds so that load from other processes falls on all of them alike:

- ``full``: every step but the last is stochastic and trained (7 trained steps), Flow-GRPO's trajectory;
- ``window``: a fixed SDE window of 2 steps, Euler elsewhere (``sde_window: [0, 2]``);
- ``unipc``: the same window with the 6 steps after it taken by UniPC (``ode_tail: unipc``), MixGRPO's ODE part;
- ``flash``: the same with the UniPC tail compressed to 2 steps (``ode_tail_steps: 2``, MixGRPO-Flash's faster ODE
  part): a rollout costs 2 + 2 velocity evaluations instead of 8.

The window stays at its first position (steps 0-1), where MixGRPO's moving window (``window_stride``) starts and its ODE
tail is longest; as it moves later, the tail shortens and every windowed arm approaches ``window``.

    OMP_NUM_THREADS=1 python benchmarks/flow_window.py                # 3 rounds of 6 timed steps per arm

Reports trained steps per rollout and the median step time (rollout + update) of each arm, and their ratios to
``full``. Whether the reward rises as much is a training question, not measured here.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from pipeline import StepTimer, flow_data  # noqa: E402

from app.models import FlowPolicy  # noqa: E402
from app.modules import FlowGRPOModule  # noqa: E402
from app.rewards import RewardComponent  # noqa: E402
from app.settings import FlowGRPOSamplingSettings, LoRASettings, OptimizerSettings  # noqa: E402

WARMUP = 2
ARMS = {
    "full": {},
    "window": {"sde_window": (0, 2)},
    "unipc": {"sde_window": (0, 2), "ode_tail": "unipc"},
    "flash": {"sde_window": (0, 2), "ode_tail": "unipc", "ode_tail_steps": 2},
}


class Redness(RewardComponent):
    def score(self, completions, samples):
        return torch.stack([c[0].float().mean() for c in completions])


def run(arm: str, steps: int) -> tuple[list[float], list[int]]:
    """Median-able step times and trained steps per rollout of ``steps`` timed steps of ``arm``."""
    L.seed_everything(0, verbose=False)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8), resolution={"height": 64, "width": 64})
    sampling = FlowGRPOSamplingSettings(group_size=4, num_steps=8, **ARMS[arm])
    module = FlowGRPOModule(policy, [Redness()], sampling, optimizer=OptimizerSettings(learning_rate=1e-4))
    trained: list[int] = []
    draw = module.sampler.draw

    def counting(*args, **kwargs):
        out = draw(*args, **kwargs)
        trained.append(len(out.step_indices))
        return out

    module.sampler.draw = counting
    timer = StepTimer()
    trainer = L.Trainer(
        max_steps=WARMUP + steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[timer],
    )
    trainer.fit(module, flow_data(WARMUP + steps + 2, prompts=2))
    return timer.steps[WARMUP:], trained[WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    trained: dict[str, list[int]] = {arm: [] for arm in ARMS}
    for round_ in range(args.rounds):
        order = list(ARMS)[round_ % len(ARMS) :] + list(ARMS)[: round_ % len(ARMS)]
        for arm in order:
            step_times, counts = run(arm, args.steps)
            times[arm] += step_times
            trained[arm] += counts
    full = statistics.median(times["full"])
    print("| arm | trained steps / rollout | step (s), median | min / max (s) | step / full |")
    print("|---|---|---|---|---|")
    for arm in ARMS:
        step = statistics.median(times[arm])
        print(
            f"| {arm} | {statistics.mean(trained[arm]):.1f} | {step:.3f} | {min(times[arm]):.3f} / "
            f"{max(times[arm]):.3f} | {step / full:.2f} |"
        )


if __name__ == "__main__":
    main()

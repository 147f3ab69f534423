"""What the skipped old-log-prob pass would cost a flow-GRPO step: the package never recomputes them.

verl-omni saves a no-gradient pass over the trained steps when the rollout's own log-probs are exact (about 20% of a
step, it reports). This package never has that pass (tests/modules/test_flow_grpo_passes.py counts the passes): with
one update and no delay the old log-probs are the current ones detached, otherwise the rollout's stored ones. This
script measures what the pass would cost, side by side with the step: each repeat draws a rollout and makes one
update as :class:`~app.modules.FlowGRPOModule` does (``step``), and separately times the recomputation a trainer
without stored log-probs would add (``recompute``: ``FlowSampler.transition_logprobs`` under ``no_grad`` over the
trained steps). The saving is ``recompute / (step + recompute)``.

    python benchmarks/flow_old_logprobs.py                      # the flow quickstart's shapes, one trained step
    python benchmarks/flow_old_logprobs.py --sde-window 0 7     # every stochastic step trained

The tiny SD3 model of the quickstart (random weights; timing does not depend on them), on the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch
from provenance import commit, machine

from app.models import FlowPolicy
from app.modules import FlowGRPOModule
from app.rewards.color_region import ColorRegionReward
from app.settings import FlowGRPOSamplingSettings, GRPOSettings, LoRASettings
from app.tasks.dots import ShapePromptDataset


class _NoStep:
    """An optimizer that keeps the weights: every repeat times the same update."""

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32, help="B (the quickstart's batch)")
    parser.add_argument("--group", type=int, default=8, help="K")
    parser.add_argument("--steps", type=int, default=8, help="denoising steps T")
    parser.add_argument("--sde-window", type=int, nargs=2, default=(0, 1), help="the trained steps (quickstart: 0 1)")
    parser.add_argument("--micro-batch", type=int, default=None, help="rows per transformer pass (None: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=16, alpha=32))
    sampling = FlowGRPOSamplingSettings(
        group_size=args.group,
        num_steps=args.steps,
        sampler="cps",
        eta=0.7,
        sde_window=tuple(args.sde_window),
        shared_initial_noise=True,
    )
    module = FlowGRPOModule(
        policy, [ColorRegionReward()], sampling, grpo=GRPOSettings(micro_batch_size=args.micro_batch), seed=0
    )
    module.optimizers = lambda: _NoStep()
    module.lr_schedulers = lambda: None
    module.manual_backward = lambda loss: loss.backward()
    module.log_dict = module.log = lambda *a, **k: None
    samples = [ShapePromptDataset(num_samples=args.prompts, seed=0, image_size=64)[i] for i in range(args.prompts)]

    steps, recomputes = [], []
    for _ in range(args.repeats + 1):  # the first repeat warms up and is not counted
        started = time.perf_counter()
        rollout = module.rollout(samples)
        module._train_on([rollout])
        step = time.perf_counter() - started
        sampled = rollout.sampled
        started = time.perf_counter()
        with torch.no_grad():
            module.sampler.transition_logprobs(
                sampled.conditioning, sampled.sigmas, sampled.step_indices, sampled.latents, sampled.next_latents
            )
        recomputes.append(time.perf_counter() - started)
        steps.append(step)
    steps, recomputes = steps[1:], recomputes[1:]
    step, recompute = statistics.median(steps), statistics.median(recomputes)
    options = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in vars(args).items())
    print(f"# benchmarks/flow_old_logprobs.py {options}")
    print(f"# {machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"# {datetime.date.today()}, commit {commit()}")
    print(f"B={args.prompts} K={args.group} T={args.steps} trained steps={len(rollout.sampled.step_indices)}")
    print("| what | min s | median s | max s |")
    print("|---|---|---|---|")
    print(f"| step (rollout + update) | {min(steps):.3f} | {step:.3f} | {max(steps):.3f} |")
    print(f"| recompute pass (skipped) | {min(recomputes):.3f} | {recompute:.3f} | {max(recomputes):.3f} |")
    print(f"saving of the skipped pass: {recompute / (step + recompute):.1%} of a step that would recompute")


if __name__ == "__main__":
    main()

"""How much of a flow-GRPO gradient is signal: pairwise cosines of independent policy-gradient estimates.

Rolls out the same prompts ``--repeats`` times (fresh noise each time), computes the flow-GRPO loss gradient of each
rollout with :class:`app.modules.FlowGRPOModule` (no optimizer step), and prints the pairwise cosine similarities of
the gradients. Cosines near 0 mean the estimate at this batch size is mostly noise, so optimizer steps mostly
random-walk; cosines near 1 mean every batch points the same way.

    python benchmarks/flow_gradient_noise.py --model runs/quickstart_flow_pretrain/policy --prompts 16 --group 8
"""

from __future__ import annotations

import argparse

import torch

from app.models import FlowPolicy
from app.modules import FlowGRPOModule
from app.rewards.color_region import ColorRegionReward
from app.settings import FlowGRPOSamplingSettings, GRPOSettings, LoRASettings
from app.tasks.dots.shapes import ShapePromptDataset


class _NoStep:
    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="runs/quickstart_flow_pretrain/policy", help="a flow policy folder")
    parser.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="denoising steps")
    parser.add_argument("--sde-window", type=int, nargs=2, default=None, help="only these steps stochastic")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--shared-noise", action="store_true", help="one starting noise per prompt (DanceGRPO)")
    parser.add_argument("--advantage-scale", default="group", choices=["group", "batch", "none"])
    parser.add_argument("--eta", type=float, default=0.7)
    args = parser.parse_args()

    torch.manual_seed(0)
    lora = LoRASettings(r=args.lora_rank, alpha=2 * args.lora_rank) if args.lora_rank else None
    policy = FlowPolicy(args.model, lora=lora)
    if lora is not None:  # B = 0 at the start gives A no gradient; a tiny B shows both
        with torch.no_grad():
            for name, parameter in policy.model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(std=1e-3)
    module = FlowGRPOModule(
        policy,
        [ColorRegionReward()],
        seed=1,
        sampling=FlowGRPOSamplingSettings(
            group_size=args.group,
            num_steps=args.steps,
            eta=args.eta,
            shared_initial_noise=args.shared_noise,
            sde_window=tuple(args.sde_window) if args.sde_window else None,
        ),
        grpo=GRPOSettings(advantage_scale=args.advantage_scale, gradient_clip_val=0.0),
    )
    module.manual_backward = lambda loss: loss.backward()  # outside a Trainer
    data = ShapePromptDataset(num_samples=args.prompts, seed=3, image_size=64)
    samples = [data[i] for i in range(args.prompts)]
    gradients = []
    for repeat in range(args.repeats):
        trajectory = module.rollout(samples)  # a Rollout of SampledTrajectories
        for parameter in policy.trainable_parameters():
            parameter.grad = None
        module._update([trajectory], _NoStep())  # one rollout
        gradients.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
        print(f"rollout {repeat}: mean reward {float(trajectory.rewards.total.mean()):.3f}")
    stacked = torch.stack(gradients)
    cosines = torch.nn.functional.cosine_similarity(stacked[:, None], stacked[None], dim=-1)
    off_diagonal = cosines[~torch.eye(len(gradients), dtype=torch.bool)]
    print(f"{args.prompts} prompts x {args.group} samples per estimate; pairwise gradient cosines:")
    print(cosines.numpy().round(3))
    print(
        f"mean off-diagonal cosine {float(off_diagonal.mean()):.3f} (min {float(off_diagonal.min()):.3f}, "
        f"max {float(off_diagonal.max()):.3f})"
    )


if __name__ == "__main__":
    main()

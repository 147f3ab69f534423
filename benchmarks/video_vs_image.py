"""Rollout and update time of a video row vs an image row with the same number of visual tokens (issue 57 target:
the video path costs at most 1.2x the image path).

    python benchmarks/video_vs_image.py                          # tiny-qwen2.5-vl, 64 visual tokens a row: 45 s
    python benchmarks/video_vs_image.py --model tiny-qwen3-vl --image-size 128   # 16 visual tokens a row

Rows: ``--prompts`` prompts x K = ``--k`` completions. An image row holds one ``--image-size``-pixel square image; a
video row one clip of ``--frames`` frames whose side is chosen so that both give the same visual tokens (Qwen-VL
merges 2 frames into one temporal patch: ``frames / 2 x (side / 28)^2`` tokens against ``(image_size / 28)^2``; 28
is the patch side times the merge, 32 for Qwen3-VL). The script checks the counts from the processor's grids.
Qwen3-VL's video processor spreads one pixel budget over a clip's frames (the tiny one's: 224 x 224), so its clips of 8
frames keep at most 64 x 64 pixels a frame: 16 tokens, the tokens of a 128-pixel image. Qwen3-VL also writes each
temporal patch's time as text (``<0.5 seconds>``), so its video prompts are longer than the image ones by those tokens
(the table gives both lengths): that is part of the cost of its video path.

- rollout: ``encode_prompts`` (the processor once per prompt, repeated K times) then ``generate`` of exactly
  ``--max-new-tokens`` tokens a row (end-of-sequence disabled, so both kinds decode the same number of steps);
- update: the policy's log-prob forward over the K rows' prompts and fixed completions of ``--max-new-tokens`` tokens,
  a GRPO-like loss (``-(logp x advantage)`` token mean) and its backward into the LoRA adapters: the work of one
  update micro-batch without the optimizer step (which does not depend on the input).

Runs alternate image, video, image, ... so load from other processes on a shared machine falls on both alike; the
table gives the min and median of ``--runs`` runs after ``--warmup``, wall and process CPU time (with one thread the
CPU time is the work itself, whatever else runs), and the video / image ratios of each.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]


from provenance import commit, machine  # noqa: E402


def header(args: argparse.Namespace, extra: str) -> None:
    import torch

    print(f"command: python benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {machine()}; python {platform.python_version()}, torch {torch.__version__}")
    print(f"date:    {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit {commit()}")
    print(extra)


def moving_square(frames: int, side: int, seed: int):
    """A clip of a square crossing a noisy background (uint8 ``[F, side, side, 3]``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    video = rng.integers(0, 256, (frames, side, side, 3), dtype=np.uint8)
    for i in range(frames):
        x = i * (side - side // 4) // max(frames - 1, 1)
        video[i, side // 3 : side // 3 + side // 4, x : x + side // 4] = (220, 30, 30)
    return video


def rows(kind: str, args: argparse.Namespace, unit: int):
    """``--prompts`` samples of one kind with the same visual tokens (``unit``: patch side x merge, in pixels)."""
    import numpy as np
    from PIL import Image

    from app.types import Video, VisualSample

    image_tokens = (args.image_size // unit) ** 2
    per_frame_pair = image_tokens // (args.frames // 2)
    side = round(per_frame_pair**0.5) * unit
    if (side // unit) ** 2 * (args.frames // 2) != image_tokens:
        sys.exit(f"{args.frames} frames cannot hold the {image_tokens} tokens of the image in square frames")
    samples = []
    for i in range(args.prompts):
        question = f"Which way does the red square move in clip {i}? Answer left or right."
        if kind == "image":
            picture = Image.fromarray(
                np.random.default_rng(i).integers(0, 256, (args.image_size,) * 2 + (3,), np.uint8)
            )
            samples.append(VisualSample(images=[picture], question=question, task="bench"))
        else:
            clip = Video(moving_square(args.frames, side, i), fps=2.0)
            samples.append(VisualSample(images=[], videos=[clip], question=question, task="bench"))
    return samples, side


def visual_tokens(prompts) -> int:
    t = prompts.tensors
    grid = t["image_grid_thw"] if "image_grid_thw" in t else t["video_grid_thw"]
    return int(grid.prod(dim=1).sum()) // 4 // len(grid)  # per visual input, after the 2 x 2 merge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    parser.add_argument("--image-size", type=int, default=0, help="image side; 0: the largest the processor keeps")
    parser.add_argument("--frames", type=int, default=8, help="frames of the clip (even)")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--k", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from app.models import VLMPolicy
    from app.settings import LoRASettings, SamplingSettings

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    policy = VLMPolicy(args.model, lora=LoRASettings(r=args.lora_r, alpha=2 * args.lora_r, dropout=0.0))
    vision = policy.hf_model.config.vision_config
    unit = vision.patch_size * vision.spatial_merge_size
    if not args.image_size:  # the largest square the processor keeps as it is, an even number of units a side
        longest = policy.processor.image_processor.size["longest_edge"]
        args.image_size = int(longest**0.5) // unit // 2 * 2 * unit
    never = policy.hf_model.config.get_text_config().vocab_size + 1000
    policy.eos_token_ids = [never]  # no row stops early: every rollout decodes exactly --max-new-tokens tokens
    sampling = SamplingSettings(group_size=args.k, max_new_tokens=args.max_new_tokens)
    batches = {kind: rows(kind, args, unit) for kind in ("image", "video")}
    n = args.prompts * args.k
    completion = torch.randint(10, 900, (n, args.max_new_tokens), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(completion)
    advantages = torch.linspace(-1, 1, n)[:, None]

    def rollout(samples):
        prompts = policy.encode_prompts(samples, rows_per_prompt=args.k)
        batch = policy.generate(prompts, sampling, rows_per_prompt=args.k)
        return prompts, batch

    def update(prompts):
        logp = policy.sequence_logprobs(prompts, completion, mask)
        loss = -(logp * advantages * mask).sum() / mask.sum()
        loss.backward()
        policy.model.zero_grad(set_to_none=True)

    times = {(kind, phase): [] for kind in batches for phase in ("rollout", "update")}
    info = {}
    for i in range(args.warmup + args.runs):
        for kind, (samples, side) in batches.items():
            wall, cpu = time.perf_counter(), time.process_time()
            prompts, batch = rollout(samples)
            rollout_s = (time.perf_counter() - wall, time.process_time() - cpu)
            wall, cpu = time.perf_counter(), time.process_time()
            update(prompts)
            update_s = (time.perf_counter() - wall, time.process_time() - cpu)
            if i >= args.warmup:
                times[kind, "rollout"].append(rollout_s)
                times[kind, "update"].append(update_s)
            generated = int(batch.completion_mask.sum()) // n
            info[kind] = (
                side if kind == "video" else args.image_size,
                visual_tokens(prompts),
                prompts.tensors["input_ids"].shape[1],
                generated,
            )
    (image_side, image_tokens, image_len, image_gen), (side, video_tokens, video_len, video_gen) = (
        info["image"],
        info["video"],
    )
    if image_tokens != video_tokens:  # Qwen3-VL's video processor spreads one pixel budget over the frames
        sys.exit(f"unequal rows: {image_tokens} vs {video_tokens} visual tokens (try a smaller --image-size)")
    header(
        args,
        f"{args.model}, float32, LoRA r {args.lora_r}, {args.threads} thread(s), {args.prompts} prompts x K={args.k}, "
        f"{args.max_new_tokens} new tokens a row ({image_gen} / {video_gen} generated); image {image_side}x{image_side}"
        f" vs {args.frames} frames of {side}x{side}: {image_tokens} visual tokens each, prompts of {image_len} / "
        f"{video_len} tokens; {args.runs} runs after {args.warmup} warm-up",
    )
    print(
        f"{'phase':<9}{'kind':<7}{'wall min':>10}{'wall med':>10}{'cpu min':>10}{'cpu med':>10}"
        f"{'ratio wall min':>16}{'ratio wall med':>16}{'ratio cpu min':>15}{'ratio cpu med':>15}"
    )
    for phase in ("rollout", "update", "total"):
        stats = {}
        for kind in ("image", "video"):
            if phase == "total":
                pairs = [
                    (r[0] + u[0], r[1] + u[1])
                    for r, u in zip(times[kind, "rollout"], times[kind, "update"], strict=True)
                ]
            else:
                pairs = times[kind, phase]
            walls, cpus = [w for w, _ in pairs], [c for _, c in pairs]
            stats[kind] = (min(walls), statistics.median(walls), min(cpus), statistics.median(cpus))
        for kind in ("image", "video"):
            s = stats[kind]
            ratios = "".join(f"{stats['video'][j] / stats['image'][j]:>{w}.3f}" for j, w in enumerate((16, 16, 15, 15)))
            print(
                f"{phase:<9}{kind:<7}{s[0]:>10.4f}{s[1]:>10.4f}{s[2]:>10.4f}{s[3]:>10.4f}"
                + (ratios if kind == "video" else "")
            )
    print("ratio: video / image (target <= 1.2)")


if __name__ == "__main__":
    main()

"""Peak CPU memory of a video rollout and update vs an image row on the tiny Qwen-VL models, and what the policy's
``max_video_frames`` cap does to a long clip.

    python benchmarks/video_memory.py                           # tiny-qwen2.5-vl, 2-3 minutes on 2 shared cores
    python benchmarks/video_memory.py --model tiny-qwen3-vl --long-frames 128

Configurations (``--prompts`` prompts x K = ``--k`` completions of ``--max-new-tokens`` tokens, LoRA, float32):

- ``image``: one ``--size``-pixel square image a row;
- ``video (recipe)``: a clip of ``--frames`` frames of ``--size`` pixels, the motion recipe's longest in-domain clip
  (configs/vlm/video_grpo_qwen2_5_vl_3b.yaml: 6-8 frames of 224 pixels);
- ``video (= image tokens)``: ``--frames`` frames of the side that gives the image's visual tokens on Qwen2/2.5-VL
  (Qwen3-VL's video processor spreads one pixel budget over a clip's frames, so its video rows get fewer tokens than
  asked: the table's ``visual tok`` is what the processor made, from its grid);
- ``long video``: ``--long-frames`` frames of ``--size`` pixels, then the same with ``max_video_frames=--frames``
  (the policy samples it down to ``--frames`` frames).

Each configuration runs in a fresh process (this script with ``--config``): the policy is built and warmed up on a
tiny image row (one-time imports and allocations do not count), then the peak RSS (``VmHWM``) is restarted, the
rollout runs (``encode_prompts`` + ``generate``), its peak is read, the peak is restarted again and the update runs
(log-prob forward over prompt + completion and backward into the adapters, no optimizer step). The table gives each
phase's peak over the RSS before it, and the visual tokens of a row. The tiny models' weights are a few MB, so the
increments are the activations, the processor's pixel tensors and the KV cache: they show how memory grows with the
visual tokens, not a 3B model's absolute needs (there, per visual token and layer, the activations scale with the
hidden size).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("image", "video (recipe)", "video (= image tokens)", "long video", "long video, capped")


from provenance import commit, machine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    parser.add_argument("--size", type=int, default=224, help="side of the image and of the recipe's frames")
    parser.add_argument("--frames", type=int, default=8, help="the recipe's frames a clip")
    parser.add_argument("--long-frames", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--config", choices=CONFIGS, help=argparse.SUPPRESS)  # set in the subprocess
    args = parser.parse_args()
    if args.config:
        print(json.dumps(_worker(args)))
        return
    results = {}
    for config in CONFIGS:
        command = [sys.executable, os.path.abspath(__file__), "--config", config]
        for name in ("model", "size", "frames", "long_frames", "prompts", "k", "max_new_tokens", "lora_r", "threads"):
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        print(f"running {config} ...", flush=True)
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{config} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results[config] = json.loads(proc.stdout.strip().splitlines()[-1])
    import torch

    print(f"\ncommand: python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {machine()}; python {platform.python_version()}, torch {torch.__version__}")
    print(f"date:    {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit {commit()}")
    print(
        f"{args.model}, float32, LoRA r {args.lora_r}, {args.threads} thread(s), {args.prompts} prompts x "
        f"K={args.k}, {args.max_new_tokens} new tokens a row; peak RSS (VmHWM) over the RSS before each phase, one "
        "fresh process per configuration"
    )
    head = (
        f"{'configuration':<24}{'visual input':>22}{'visual tok':>11}{'prompt':>8}{'rollout MiB':>13}"
        f"{'update MiB':>12}{'base MiB':>10}{'secs':>6}"
    )
    print(head)
    print("-" * len(head))
    for config, r in results.items():
        print(
            f"{config:<24}{r['input']:>26}{r['visual_tokens']:>11}{r['prompt_tokens']:>8}"
            f"{r['rollout_kib'] / 1024:>13.1f}{r['update_kib'] / 1024:>12.1f}{r['base_kib'] / 1024:>10.0f}"
            f"{r['seconds']:>6.1f}"
        )


def _samples(args: argparse.Namespace, unit: int):
    import numpy as np
    from PIL import Image

    from app.types import Video, VisualSample

    rng = np.random.default_rng(0)
    question = "Which way does the red square move? Answer left or right."
    if args.config == "image":
        picture = Image.fromarray(rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8))
        return [VisualSample(images=[picture], question=question, task="bench")] * args.prompts, f"{args.size}^2 image"
    frames, side = args.frames, args.size
    if args.config == "video (= image tokens)":
        side = round(((args.size // unit) ** 2 / (frames // 2)) ** 0.5) * unit
    elif args.config.startswith("long video"):
        frames = args.long_frames
    clips = [Video(rng.integers(0, 256, (frames, side, side, 3), dtype=np.uint8), fps=2.0) for _ in range(args.prompts)]
    samples = [VisualSample(images=[], videos=[clip], question=question, task="bench") for clip in clips]
    capped = f" -> {args.frames}" if args.config == "long video, capped" else ""
    return samples, f"{frames}{capped} x {side}^2 frames"


def _worker(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    from PIL import Image

    from app.models import VLMPolicy
    from app.settings import LoRASettings, SamplingSettings
    from app.types import VisualSample

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    caps = {"max_video_frames": args.frames} if args.config == "long video, capped" else {}
    lora = LoRASettings(r=args.lora_r, alpha=2 * args.lora_r, dropout=0.0)
    policy = VLMPolicy(args.model, lora=lora, **caps)
    policy.eos_token_ids = [policy.hf_model.config.get_text_config().vocab_size + 1000]  # full-length completions
    vision = policy.hf_model.config.vision_config
    samples, described = _samples(args, vision.patch_size * vision.spatial_merge_size)
    sampling = SamplingSettings(group_size=args.k, max_new_tokens=args.max_new_tokens)
    n = args.prompts * args.k
    completion = torch.randint(10, 900, (n, args.max_new_tokens), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(completion)
    advantages = torch.linspace(-1, 1, n)[:, None]

    def step(rows, k):
        prompts = policy.encode_prompts(rows, rows_per_prompt=k)
        policy.generate(prompts, SamplingSettings(group_size=k, max_new_tokens=4), rows_per_prompt=k)
        ids = torch.randint(10, 900, (len(prompts), 4))
        policy.sequence_logprobs(prompts, ids, torch.ones_like(ids)).sum().backward()
        policy.model.zero_grad(set_to_none=True)

    small = Image.fromarray(np.zeros((56, 56, 3), dtype=np.uint8))
    step([VisualSample(images=[small], question="warm-up", task="bench")], 2)  # imports, first allocations

    start = time.perf_counter()
    base = _restart_peak()
    prompts = policy.encode_prompts(samples, rows_per_prompt=args.k)
    policy.generate(prompts, sampling, rows_per_prompt=args.k)
    rollout = _peak() - base
    base_update = _restart_peak()
    logp = policy.sequence_logprobs(prompts, completion, mask)
    (-(logp * advantages * mask).sum() / mask.sum()).backward()
    update = _peak() - base_update
    t = prompts.tensors
    grid = t["image_grid_thw"] if "image_grid_thw" in t else t["video_grid_thw"]
    return {
        "input": described,
        "visual_tokens": int(grid[0].prod()) // 4,
        "prompt_tokens": int(t["input_ids"].shape[1]),
        "rollout_kib": rollout,
        "update_kib": update,
        "base_kib": base,
        "seconds": time.perf_counter() - start,
    }


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _restart_peak() -> int:
    """Start the peak RSS afresh from the current RSS (``/proc/self/clear_refs``); the current RSS in KiB."""
    import gc

    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        sys.exit("cannot restart the peak RSS (/proc/self/clear_refs): Linux only")
    return _status_kib("VmRSS")


def _peak() -> int:
    return _status_kib("VmHWM")


if __name__ == "__main__":
    main()

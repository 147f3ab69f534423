"""Rollout time with and without shared prefixes: one prompt with one 448x448 image, K completions, CPU.

    python benchmarks/shared_prefix.py                      # tiny-qwen2.5-vl, K=8, 64 new tokens, float32, 1 thread
    python benchmarks/shared_prefix.py --image-tokens tiny  # the embedded processor's 224x224 cap (64 image tokens)

A rollout is what ``VLMGRPOModule`` runs per batch: ``encode_prompts(samples, group_size=K)`` then ``generate``.

- without sharing: the processor runs on the K repeated rows (the previous ``encode_prompts``), and ``generate`` encodes
  the image and prefills the prompt for every row (``shared_prefix=False``);
- with sharing: the processor runs once per prompt and its tensors are repeated; ``generate`` runs the vision tower
  and the prefill once per prompt and expands the KV cache to the K rows (the default).

Both draw from the same seed; the script checks that the completions are identical token for token. By default the
image keeps 448x448 pixels (256 image tokens after the 2x2 merge), as the real Qwen2.5-VL processor (12.8 MP cap)
would; the embedded tiny processor alone caps images at 224x224. Times: median over ``--runs`` after ``--warmup``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    parser.add_argument("--k", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument(
        "--image-tokens", choices=["full", "tiny"], default="full", help="keep the image's pixels or cap"
    )
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from PIL import Image

    from app.models import VLMPolicy
    from app.settings import SamplingSettings
    from app.types import PromptInputs, VisualSample

    torch.set_num_threads(args.threads)
    policy = VLMPolicy(args.model, dtype="float32").eval()
    if args.image_tokens == "full":
        policy.processor.image_processor.size = {"shortest_edge": 56 * 56, "longest_edge": args.image_size**2}
    samples = [
        VisualSample(
            images=[Image.effect_noise((args.image_size, args.image_size), 64 + 8 * i).convert("RGB")],
            question=f"Where is the object in picture {i}? Answer left or right.",
            task="bench",
        )
        for i in range(args.prompts)
    ]
    sampling = SamplingSettings(group_size=args.k, max_new_tokens=args.max_new_tokens)

    def encode_per_row() -> PromptInputs:  # the previous encode_prompts: the processor on every repeated row
        texts = [policy.prompt_text(s) for s in samples for _ in range(args.k)]
        images = [list(s.images) for s in samples for _ in range(args.k)]
        inputs = policy.processor(text=texts, images=images, return_tensors="pt", padding=True)
        return PromptInputs(dict(inputs), [len(row) for row in images])

    def rollout(shared: bool):
        policy.shared_prefix = shared
        start = time.perf_counter()
        prompts = policy.encode_prompts(samples, group_size=args.k) if shared else encode_per_row()
        encoded = time.perf_counter()
        torch.manual_seed(args.seed)
        completions = policy.generate(prompts, sampling, group_size=args.k)
        end = time.perf_counter()
        return completions, encoded - start, end - start

    image_tokens = None
    times = {True: [], False: []}
    outputs = {}
    for i in range(args.warmup + args.runs):
        for shared in (False, True):  # interleaved, so that load on a shared machine hits both alike
            completions, encode_s, total_s = rollout(shared)
            outputs[shared] = completions
            if i >= args.warmup:
                times[shared].append((encode_s, total_s))
    prompts = policy.encode_prompts(samples, group_size=1)
    image_tokens = int(prompts.tensors["image_grid_thw"].prod(dim=1).sum()) // 4
    same = torch.equal(outputs[True].completion_ids, outputs[False].completion_ids)
    lengths = outputs[True].completion_mask.sum(dim=1).float()

    print(
        f"{args.model}, float32, {args.threads} thread(s), {args.prompts} prompt(s) x K={args.k}, "
        f"{args.image_size}x{args.image_size} image -> {image_tokens} image tokens, prompt length "
        f"{prompts.tensors['input_ids'].shape[1]}, completions of {lengths.mean():.1f} tokens on average "
        f"(max_new_tokens={args.max_new_tokens}); median of {args.runs} runs after {args.warmup} warm-up"
    )
    print(f"{'':<16}{'encode (s)':>12}{'generate (s)':>14}{'rollout (s)':>13}")
    for shared, name in ((False, "per row"), (True, "shared prefix")):
        encode = statistics.median(e for e, _ in times[shared])
        total = statistics.median(t for _, t in times[shared])
        generate = statistics.median(t - e for e, t in times[shared])
        print(f"{name:<16}{encode:>12.4f}{generate:>14.4f}{total:>13.4f}")
    before = statistics.median(t for _, t in times[False])
    after = statistics.median(t for _, t in times[True])
    print(f"rollout time cut by {100 * (1 - after / before):.1f}%; identical completions: {same}")
    if not same:
        sys.exit("completions differ between shared and per-row prefill")


if __name__ == "__main__":
    main()

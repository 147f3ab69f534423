"""Update time and peak memory of the VLM GRPO update on completions of mixed lengths: the rows in contiguous
micro-batches padded to the rollout's longest (the layout before padding-free updates), in length-grouped micro-batches
re-padded to their own longest (the default now), and packed into one row (``VLMPolicy(padding_free=True)``).

    python benchmarks/update_padding.py                        # B 4 x K 8, lengths 16-512, micro-batches of 8
    python benchmarks/update_padding.py --micro-batch-size 4 --rounds 3

Geometry: tiny-qwen2.5-vl (random weights of the embedded config, sdpa attention), LoRA r 8 on the language model's
projections, float32 on the CPU, 4 dots prompts (64 px) x K = 8 completions of random tokens whose lengths are drawn
uniformly from ``--min-length``..``--max-length`` (seeded), random advantages, no KL, entropy computed as in training.
An update is the share-weighted loss of every micro-batch, backpropagated micro-batch by micro-batch (what
``GRPOModule._update`` does before the optimizer step, which is the same for all layouts and left out). Each layout runs
in its own subprocess (this script with ``--layout``): it builds the policy, warms up with one update, restarts the peak
RSS (``/proc/self/clear_refs``), then times ``--repeats`` updates; its peak RSS increment over the RSS after set-up is
reported. The layouts' subprocesses alternate for ``--rounds`` rounds, and the table shows the median over all of a
layout's timed updates. "max |dlogp|" compares each layout's log-probs with the padded layout's on the masked tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

LAYOUTS = {
    "padded": "contiguous micro-batches at the rollout's width (before)",
    "grouped": "length-grouped, re-padded per micro-batch (default)",
    "packed": "grouped and packed into one row (padding_free)",
}


def build(args):
    from app.models import VLMPolicy
    from app.modules import VLMGRPOModule
    from app.rewards import AccuracyReward
    from app.settings import GRPOSettings, LoRASettings, SamplingSettings
    from app.tasks.dots import DotsDataset
    from app.types import CompletionBatch, RewardOutput, Rollout, SampledCompletions

    torch.manual_seed(0)
    policy = VLMPolicy("tiny-qwen2.5-vl", lora=LoRASettings(r=8, alpha=16, dropout=0.0), instruction="")
    k, n = args.group_size, args.prompts * args.group_size
    module = VLMGRPOModule(
        policy,
        [AccuracyReward()],
        SamplingSettings(group_size=k, max_new_tokens=args.max_length),
        grpo=GRPOSettings(micro_batch_size=args.micro_batch_size),
    )
    dataset = DotsDataset(args.prompts, 0, image_size=64, dot_radius=12)
    samples = [dataset[i] for i in range(args.prompts)]
    prompts = policy.encode_prompts(samples, group_size=k)
    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(args.min_length, args.max_length + 1, (n,), generator=g)
    mask = (torch.arange(args.max_length)[None] < lengths[:, None]).long()  # [N, L]
    ids = torch.randint(10, 1000, mask.shape, generator=g).masked_fill(mask == 0, policy.pad_token_id)
    completions = CompletionBatch(ids, mask, [""] * n, torch.zeros(n, dtype=torch.bool), k)
    advantages = torch.randn(n, generator=g)
    sampled = SampledCompletions(prompts, completions, old_logprobs=None, ref_logprobs=None)
    rollout = Rollout(samples, sampled, RewardOutput(advantages, {}), advantages, mask, rows_per_prompt=k)
    return policy, module, rollout


def padded_update(module, rollout) -> torch.Tensor:
    """The update as it was: contiguous row slices, every row at the rollout's width; returns the log-probs (the
    update's own)."""
    from app.algorithms import grpo_loss
    from app.sampling.batching import micro_batches

    sampled, mask = rollout.sampled, rollout.loss_mask
    total, out = mask.sum(), []
    for rows in micro_batches(mask.shape[0], module.grpo.micro_batch_size):
        c = sampled.completions
        logprobs, _ = module.policy.sequence_logprobs_and_entropy(
            sampled.prompt_inputs.select(rows), c.completion_ids[rows], c.completion_mask[rows], 1.0
        )
        loss = grpo_loss(logprobs, logprobs.detach(), rollout.advantages[rows], mask[rows]).loss
        (loss * (mask[rows].sum() / total)).backward()
        out.append(logprobs.detach())
    return torch.cat(out)


def grouped_update(module, rollout) -> None:
    """The update now (:meth:`VLMGRPOModule.weighted_losses`)."""
    for out, share in module.weighted_losses(rollout):
        (out.loss * share).backward()


def grouped_logprobs(module, rollout) -> torch.Tensor:
    """The log-probs of the update's micro-batches in row order (recomputed without gradient, after the timing: the
    loss output does not carry them)."""
    logprobs = torch.zeros(rollout.loss_mask.shape)
    with torch.no_grad():
        for rows in module.sampler.micro_batches(rollout.sampled):
            logprobs[rows] = module.sampler.logprobs(rollout.sampled, rows)
    return logprobs


def child(args) -> None:
    policy, module, rollout = build(args)
    policy.padding_free = args.layout == "packed"
    update = padded_update if args.layout == "padded" else grouped_update
    update(module, rollout)  # warm-up
    policy.model.zero_grad(set_to_none=True)
    before_kib = _rss_kib()
    _restart_peak()
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        logprobs = update(module, rollout)
        seconds.append(time.perf_counter() - start)
        policy.model.zero_grad(set_to_none=True)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.layout != "padded":
        logprobs = grouped_logprobs(module, rollout)
    torch.save({"logprobs": logprobs, "mask": rollout.loss_mask.bool()}, args.save)
    print(json.dumps({"seconds": seconds, "peak_mib": max(peak_kib - before_kib, 0) / 1024}))


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _restart_peak() -> None:
    """Best effort: start ``ru_maxrss`` afresh from here (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--min-length", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per subprocess")
    parser.add_argument("--rounds", type=int, default=2, help="subprocesses per layout, alternating")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layout", choices=list(LAYOUTS), help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.layout:
        child(args)
        return
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"update_padding_{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {name: {"seconds": [], "peak_mib": []} for name in args.layouts}
    forwarded = [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("layout", "save", "layouts")
    ]
    forwarded = [a for a in forwarded if not a.startswith("--rounds")]
    for _ in range(args.rounds):
        for name in args.layouts:
            save = out / f"{name}.pt"
            command = [sys.executable, __file__, *forwarded, f"--layout={name}", f"--save={save}"]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"layout {name} failed:\n{done.stderr[-3000:]}")
            report = json.loads(done.stdout.strip().splitlines()[-1])
            results[name]["seconds"] += report["seconds"]
            results[name]["peak_mib"].append(report["peak_mib"])
    reference = torch.load(out / "padded.pt") if "padded" in results else None
    print(
        f"\nupdate of B {args.prompts} x K {args.group_size}, lengths {args.min_length}-{args.max_length}, "
        f"micro-batches of {args.micro_batch_size}, {args.threads} threads, {torch.get_num_threads()} here; "
        f"{len(results[args.layouts[0]]['seconds'])} timed updates per layout"
    )
    print(
        f"{'layout':<10} {'median s':>9} {'min s':>7} {'max s':>7} {'x padded':>9} {'peak MiB':>9} {'max |dlogp|':>12}"
    )
    base = statistics.median(results["padded"]["seconds"]) if "padded" in results else None
    for name in args.layouts:
        seconds = results[name]["seconds"]
        median = statistics.median(seconds)
        ratio = f"{median / base:.2f}" if base else "-"
        difference = "-"
        if reference is not None:
            saved, mask = torch.load(out / f"{name}.pt"), reference["mask"]
            difference = f"{float((saved['logprobs'] - reference['logprobs'])[mask].abs().max()):.1e}"
        peak = max(results[name]["peak_mib"])
        print(
            f"{name:<10} {median:>9.2f} {min(seconds):>7.2f} {max(seconds):>7.2f} {ratio:>9} {peak:>9.0f} "
            f"{difference:>12}"
        )
    print("\n" + "\n".join(f"  {name}: {LAYOUTS[name]}" for name in args.layouts))


if __name__ == "__main__":
    main()

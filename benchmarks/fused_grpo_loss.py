"""CPU time and peak memory of the GRPO update's loss phase: liger-kernel's fused linear GRPO loss
(``VLMGRPOModule(loss=VLMLossSettings(fused_linear=True))``) against the chunked log-prob path, on the tiny model.

    python benchmarks/fused_grpo_loss.py                          # full and LoRA, the tiny head: about 2 minutes
    python benchmarks/fused_grpo_loss.py --head-vocab 151936      # a Qwen-sized output head on the tiny body

Geometry: tiny-qwen2.5-vl (random weights of the embedded config: hidden 64, vocabulary 1,024), 4 prompts x K = 8
completions x ``--tokens`` new tokens, float32, the dots task (64-pixel images), one rollout drawn once and reused.
One timed step is the update's loss phase: every micro-batch's forward, loss and backward (``weighted_losses``, as
``GRPOModule._update`` runs it), without the clip and the optimizer step, which are the same for both paths. Each path
runs in its own subprocess (``--path``), alternating ``--repeats`` times, and reports the median step time and the peak
RSS above the RSS before its first step (RSS sampled every millisecond by a thread, so the figure is a lower bound of
the true peak). ``--head-vocab`` widens the output head after the rollout (the first 1,024 rows are the tiny model's,
the completions' ids stay below 1,024) to show the loss at a real vocabulary's size on a tiny body; it says nothing
about a GPU. Liger's loss math runs uncompiled here (``loss.fused_compiled`` false: ``torch.compile`` on CPU would
need a C++ toolchain and only pays off on GPU).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import torch  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 2**20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """The highest RSS seen by a thread polling every millisecond while the context is open."""

    def __enter__(self):
        self.peak, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def build(mode: str, fused: bool, tokens: int, micro_batch_size: int | None):
    from app.data import VisualTaskDataModule
    from app.models import VLMPolicy
    from app.modules import VLMGRPOModule
    from app.rewards import FormatReward
    from app.settings import GRPOSettings, LoRASettings, SamplingSettings, VLMLossSettings
    from app.tasks.dots import DotsDataset

    torch.manual_seed(0)
    lora = LoRASettings(r=8, alpha=16, dropout=0.0) if mode == "lora" else None
    policy = VLMPolicy("tiny-qwen2.5-vl", lora=lora)
    sampling = SamplingSettings(group_size=8, max_new_tokens=tokens)
    module = VLMGRPOModule(
        policy,
        [FormatReward()],
        sampling,
        loss=VLMLossSettings(fused_linear=fused, fused_compiled=False),
        grpo=GRPOSettings(micro_batch_size=micro_batch_size),
    )
    data = VisualTaskDataModule(
        functools.partial(DotsDataset, dot_radius=12),
        train_size=4,
        val_size=4,
        test_size=4,
        batch_size=4,
        seed=0,
        image_size=64,
    )
    data.setup("fit")
    samples = next(iter(data.train_dataloader()))
    return module, samples


def widen_head(policy, vocab: int) -> None:
    """Replace the output head by a ``vocab``-row one whose first rows are the old head's."""
    old = policy.hf_model.lm_head
    new = torch.nn.Linear(old.in_features, vocab, bias=False)
    with torch.no_grad():
        new.weight.normal_(std=old.weight.std().item())
        new.weight[: old.out_features] = old.weight
    new.weight.requires_grad_(old.weight.requires_grad)
    policy.hf_model.lm_head = new


def worker(args) -> None:
    torch.set_num_threads(args.threads)
    module, samples = build(args.mode, args.path == "fused", args.tokens, args.micro_batch_size)
    rollout = module.rollout(samples)
    if args.head_vocab:
        widen_head(module.policy, args.head_vocab)
    parameters = module.policy.trainable_parameters()

    def step():
        for out, share in module.weighted_losses(rollout):
            (out.loss * share).backward()
        for p in parameters:
            p.grad = None

    step()  # warm-up
    times = []
    with PeakRSS() as peak:
        before = rss()
        for _ in range(args.steps):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
    tokens = int(rollout.loss_mask.sum())
    Path(args.save).write_text(json.dumps({"times": times, "peak": peak.peak - before, "tokens": tokens}))


def compare(args) -> None:
    print(
        f"tiny-qwen2.5-vl (output head {args.head_vocab or 1024} x 64), 4 x 8 x {args.tokens} tokens, float32, "
        f"{args.threads} thread(s); median of {args.steps} steps x {args.repeats} alternating runs per path"
    )
    print("| mode | path | step (s), per run | peak RSS above start (MiB), per run |")
    print("|---|---|---|---|")
    for mode in args.modes:
        results: dict[str, list[dict]] = {"chunked": [], "fused": []}
        for _ in range(args.repeats):
            for path in results:
                with tempfile.NamedTemporaryFile(suffix=".json") as out:
                    command = [sys.executable, __file__, "--path", path, "--mode", mode, "--save", out.name]
                    command += [
                        "--steps",
                        str(args.steps),
                        "--tokens",
                        str(args.tokens),
                        "--threads",
                        str(args.threads),
                    ]
                    command += ["--head-vocab", str(args.head_vocab)]
                    if args.micro_batch_size:
                        command += ["--micro-batch-size", str(args.micro_batch_size)]
                    subprocess.run(command, check=True, capture_output=True)
                    results[path].append(json.loads(Path(out.name).read_text()))
        for path, runs in results.items():
            times = " / ".join(f"{statistics.median(r['times']):.3f}" for r in runs)
            peaks = " / ".join(f"{r['peak'] / MIB:.0f}" for r in runs)
            print(f"| {mode} | {path} | {times} | {peaks} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=["full", "lora"], default=["full", "lora"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per path")
    parser.add_argument("--tokens", type=int, default=32, help="max_new_tokens of the rollout")
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--head-vocab", type=int, default=0, help="widen the output head to this many rows")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--path", choices=["chunked", "fused"], help=argparse.SUPPRESS)  # set in the subprocess
    parser.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:
        worker(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()

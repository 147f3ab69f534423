"""Peak CPU memory of chunked vs naive per-token log-probs at Qwen2.5-VL-3B sizes, and whether they agree.

    python benchmarks/logprob_memory.py            # about 4 minutes on 2 cores, under 12 GiB
    python benchmarks/logprob_memory.py --modes backward --backward-completions 8   # full-size backward, 5.5 minutes

Vocabulary 151,936, hidden 2,048, float32, ``--completions`` x ``--tokens`` completion tokens. Each (path, mode) runs in
a fresh subprocess (this script with ``--path`` and ``--mode``), which reports its peak RSS (``ru_maxrss``) and the
increment over the RSS right after allocating the lm_head weight (1.2 GB) and the inputs, the baseline both paths share
(the peak is restarted there; both paths are first warmed up on a tiny input, so one-time imports do not count).

Modes: ``forward`` under ``no_grad`` (the rollout's old log-probs) and ``backward`` (grad enabled, then
``logp.sum().backward()``; by default the gradient flows to the hidden states only, as with a frozen or LoRA-adapted
head; ``--train-head`` adds the weight's gradient). Backward costs about three forward passes, so it runs at
``--backward-completions`` (default 2) to keep the run short; a naive case whose estimated need exceeds ``--max-gib``
runs at fewer completions, and the table says so. Naive memory grows with the number of tokens and chunked memory does
not, so a ratio against a smaller naive run overstates chunked's share. "max abs diff" compares the two paths' log-probs
(and, in backward, the hidden-state gradients) on the completions both ran.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=2_048)
    parser.add_argument("--completions", type=int, default=8, help="completions in forward mode")
    parser.add_argument("--backward-completions", type=int, default=2, help="completions in backward mode")
    parser.add_argument("--tokens", type=int, default=1_024, help="tokens per completion")
    parser.add_argument("--chunk-size", type=int, default=1_024)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--train-head", action="store_true", help="backward also computes the lm_head weight gradient")
    parser.add_argument("--max-gib", type=float, default=16.0, help="memory budget for one naive run")
    parser.add_argument("--modes", nargs="+", default=["forward", "backward"], choices=["forward", "backward"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--path", choices=["naive", "chunked"], help=argparse.SUPPRESS)  # set in the subprocess
    parser.add_argument("--mode", choices=["forward", "backward"], help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:
        _worker(args)
    else:
        _compare(args)


def _naive_need_gib(args: argparse.Namespace, mode: str, completions: int) -> float:
    """Rough upper estimate: baseline + [T, V] float32 buffers (about 2 in forward, 3 in backward, plus margin)."""
    logits = completions * args.tokens * args.vocab * 4 / GIB
    weight = args.vocab * args.hidden * 4 / GIB
    grad = weight if (mode == "backward" and args.train_head) else 0.0
    return 1.0 + weight + grad + (2.5 if mode == "forward" else 3.5) * logits


def _compare(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            wanted = args.completions if mode == "forward" else args.backward_completions
            runs = {}
            for path in ("naive", "chunked"):
                n = wanted
                while path == "naive" and n > 1 and _naive_need_gib(args, mode, n) > args.max_gib:
                    n -= 1
                if n < wanted:
                    print(
                        f"naive {mode} at {wanted} x {args.tokens} tokens needs about "
                        f"{_naive_need_gib(args, mode, wanted):.1f} GiB > --max-gib {args.max_gib}: "
                        f"measuring it at {n} completions instead (scaled)",
                        flush=True,
                    )
                runs[path] = _run_worker(args, path, mode, n, os.path.join(tmp, f"{path}-{mode}.pt"))
            rows += _rows(mode, runs)
    _print_table(args, rows)


def _run_worker(args: argparse.Namespace, path: str, mode: str, completions: int, save: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--path", path, "--mode", mode, "--save", save]
    cmd += ["--completions", str(completions), "--tokens", str(args.tokens), "--vocab", str(args.vocab)]
    cmd += ["--hidden", str(args.hidden), "--chunk-size", str(args.chunk_size), "--threads", str(args.threads)]
    cmd += ["--temperature", str(args.temperature)] + (["--train-head"] if args.train_head else [])
    print(f"running {path} {mode} at {completions} x {args.tokens} tokens ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{path} {mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"  peak RSS {result['peak_kib'] / 1024:.0f} MiB, baseline {result['base_kib'] / 1024:.0f} MiB, "
        f"{result['seconds']:.0f} s",
        flush=True,
    )
    return {**result, "path": path, "mode": mode, "completions": completions, "save": save}


def _rows(mode: str, runs: dict) -> list[dict]:
    naive, chunked = runs["naive"], runs["chunked"]
    a, b = torch.load(naive["save"]), torch.load(chunked["save"])
    n = min(naive["completions"], chunked["completions"])  # rows are generated per completion: a prefix is shared
    diff = {key: (a[key][:n] - b[key][:n]).abs().max().item() for key in a}
    inc = {p: (r["peak_kib"] - r["base_kib"]) / 1024 for p, r in runs.items()}
    rows = []
    for r in (naive, chunked):
        rows.append({**r, "inc_mib": inc[r["path"]], "ratio": inc["chunked"] / inc["naive"], "diff": diff})
    return rows


def _print_table(args: argparse.Namespace, rows: list[dict]) -> None:
    print(
        f"\nvocab {args.vocab}, hidden {args.hidden}, chunk {args.chunk_size}, float32, {args.threads} threads, "
        f"head {'trained' if args.train_head else 'frozen'}; increment = peak RSS - RSS after weight and inputs"
    )
    header = (
        f"{'path':8} {'mode':9} {'tokens':>9} {'peak MiB':>9} {'incr MiB':>9} {'chunked/naive':>14} "
        f"{'max|dlogp|':>11} {'max|dgrad_h|':>13} {'secs':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        scaled = any(o["mode"] == r["mode"] and o["completions"] != r["completions"] for o in rows)
        size = f"{r['completions']}x{args.tokens}" + ("*" if scaled and r["path"] == "naive" else "")
        ratio = f"{r['ratio']:.3f}" + ("*" if scaled else "") if r["path"] == "chunked" else ""
        dlogp = f"{r['diff']['logp']:.2e}" if r["path"] == "chunked" else ""
        dgrad = f"{r['diff']['grad_h']:.2e}" if r["path"] == "chunked" and "grad_h" in r["diff"] else ""
        print(
            f"{r['path']:8} {r['mode']:9} {size:>9} {r['peak_kib'] / 1024:9.0f} {r['inc_mib']:9.0f} {ratio:>14} "
            f"{dlogp:>11} {dgrad:>13} {r['seconds']:5.0f}"
        )
    if any(r["completions"] != o["completions"] for r in rows for o in rows if r["mode"] == o["mode"]):
        print("* naive scaled down to fit --max-gib; the ratio is against that smaller naive run (an upper bound)")


def _worker(args: argparse.Namespace) -> None:
    from app.algorithms import chunked_token_logprobs, token_logprobs_naive

    torch.set_num_threads(args.threads)
    n, length, h, v = args.completions, args.tokens, args.hidden, args.vocab
    fn = token_logprobs_naive if args.path == "naive" else chunked_token_logprobs
    tiny = torch.randn(1, 4, 8, requires_grad=True)  # warm-up: the first checkpoint call imports ~160 MiB of modules
    fn(tiny, nn.Linear(8, 16), torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    torch.manual_seed(0)
    lm_head = nn.Linear(h, v, bias=False, device="meta")
    weight = torch.empty(v, h).normal_(0.0, 2 / h**0.5)  # [V, H] in place (no transient copy); logits' std about 2
    lm_head.weight = nn.Parameter(weight, requires_grad=args.mode == "backward" and args.train_head)
    gen = torch.Generator()
    hidden = torch.empty(n, length, h)  # [N, L, H] one generator seed per completion, so runs share a prefix
    targets = torch.empty(n, length, dtype=torch.long)  # [N, L]
    for i in range(n):
        hidden[i].normal_(generator=gen.manual_seed(1 + i))
        targets[i].random_(v, generator=gen.manual_seed(10_001 + i))
    hidden.requires_grad_(args.mode == "backward")
    base_kib = _current_rss_kib()
    _reset_peak_rss()

    start = time.perf_counter()
    with torch.set_grad_enabled(args.mode == "backward"):
        kwargs = {} if args.path == "naive" else {"chunk_size": args.chunk_size}
        logp = fn(hidden, lm_head, targets, temperature=args.temperature, **kwargs)  # [N, L]
        if args.mode == "backward":
            logp.sum().backward()
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux

    saved = {"logp": logp.detach()} | ({"grad_h": hidden.grad} if args.mode == "backward" else {})
    torch.save(saved, args.save)
    print(json.dumps({"peak_kib": peak_kib, "base_kib": base_kib, "seconds": seconds}))


def _reset_peak_rss() -> None:
    """Best effort: start ``ru_maxrss`` afresh from here, so set-up transients cannot count as the path's peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _current_rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


if __name__ == "__main__":
    main()

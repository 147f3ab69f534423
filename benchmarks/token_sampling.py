"""Time of one next-token draw: ``torch.multinomial`` (what ``generate(do_sample=True)`` runs) against the
inverse-transform sampler this package's rollouts use (``app.models.token_sampling``), CPU.

    python benchmarks/token_sampling.py                  # 32 rows; the tiny models' 1,024 tokens and Qwen's 151,936
    python benchmarks/token_sampling.py --rows 8 --threads 1

Both columns start from the same float32 scores and include the softmax: transformers' sampled step is
``softmax`` + ``multinomial(probs, 1)``; ours is the logits processor (softmax, float64 cumulative sums, one uniform per
row, a search, the one-hot scores greedy's argmax reads). Medians over ``--repeats`` timings of ``--calls`` calls each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import torch  # noqa: E402

from app.models.token_sampling import InverseCDFSampling  # noqa: E402


def per_call_ms(fn, calls: int, repeats: int) -> float:
    fn()
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        timings.append((time.perf_counter() - started) / calls * 1e3)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32, help="rows decoded together (B x K)")
    parser.add_argument("--vocab", type=int, nargs="+", default=[1024, 151936])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sampler = InverseCDFSampling()
    print(f"{args.rows} rows, float32 scores, {args.threads} threads; ms per decoding step, medians of {args.repeats}")
    print("| vocabulary | softmax + torch.multinomial | inverse transform (processor) | ratio |")
    print("|---:|---:|---:|---:|")
    input_ids = torch.zeros(args.rows, 1, dtype=torch.long)  # what generate passes; the sampler does not read it
    for vocab in args.vocab:
        scores = torch.randn(args.rows, vocab, generator=torch.Generator().manual_seed(0))
        calls = max(2, 200_000 // vocab)
        multinomial = per_call_ms(lambda s=scores: torch.multinomial(torch.softmax(s, dim=-1), 1), calls, args.repeats)
        inverse = per_call_ms(lambda s=scores: sampler(input_ids, s), calls, args.repeats)
        print(f"| {vocab:,} | {multinomial:.3f} | {inverse:.3f} | {inverse / multinomial:.2f}x |")


if __name__ == "__main__":
    main()

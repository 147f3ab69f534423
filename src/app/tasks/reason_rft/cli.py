"""``python -m app.tasks reason_rft``: the Reason-RFT suites (Reason-RFT Appendix A, docs/algorithms.md#papers) as
WebDataset shards, one split of one suite per run.

    python -m app.tasks reason_rft --suite counting --split train --num 35000 --out data/rrft
    python -m app.tasks reason_rft --suite transformation --split test_left --num 6000 --out data/rrft

Shards are named ``rrft_{suite}-{split}-000000.tar``, ... (``--prefix`` overrides), so all splits can share a folder.
``--unlabeled`` writes label-free shards (no answers, reasoning or label meta). Each suite's ``make_samples(num, seed,
split, image_size)`` does the work; the same seed gives the same shards.
"""

from __future__ import annotations

import argparse
import importlib

SUITES = {
    "counting": "app.tasks.reason_rft.counting",
    "structure": "app.tasks.reason_rft.structure",
    "transformation": "app.tasks.reason_rft.transformation",
}
"""Suite name -> module with ``SPLITS`` and ``make_samples(num, seed, split, image_size)``."""
ALL_SPLITS = ("train", "test_in_domain", "test_domain_shift", "test_left", "test_right", "cot_sft")


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "reason_rft", help="Reason-RFT visual counting, structure perception and spatial transformation suites"
    )
    parser.add_argument("--suite", required=True, choices=list(SUITES))
    parser.add_argument(
        "--split", default="train", choices=ALL_SPLITS, help="test_left / test_right: transformation only"
    )
    parser.add_argument("--out", required=True, help="output folder for the .tar shards")
    parser.add_argument("--num", type=int, default=1000, help="number of samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=192, help="side of the square images in pixels")
    parser.add_argument("--max-per-shard", type=int, default=1000)
    parser.add_argument("--prefix", default=None, help="shard and key prefix (default: rrft_{suite}-{split})")
    parser.add_argument("--unlabeled", action="store_true", help="write label-free shards")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from app.data.shards import write_samples

    module = importlib.import_module(SUITES[args.suite])
    if args.split not in module.SPLITS:
        raise SystemExit(f"suite {args.suite!r} has no split {args.split!r}; its splits: {', '.join(module.SPLITS)}")
    if args.num < 1:
        raise SystemExit(f"--num must be >= 1, got {args.num}")
    prefix = args.prefix or f"rrft_{args.suite}-{args.split}"
    samples = module.make_samples(args.num, args.seed, args.split, args.image_size)
    paths = write_samples(
        samples, args.out, prefix, args.max_per_shard, strip_labels=args.unlabeled, progress=True, total=args.num
    )
    print(f"wrote {args.num} {args.suite} samples ({args.split}) in {len(paths)} shard(s) to {args.out}")

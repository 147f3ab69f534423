"""``python -m app.tasks vbvr``: the procedural visual reasoning suite (VBVR-Pro, docs/algorithms.md#papers) as
WebDataset shards, per split."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("vbvr", help="procedural visual reasoning tasks with verifiable scorers")
    parser.add_argument("--out", required=True, help="output folder for the .tar shards")
    parser.add_argument("--num", type=int, default=100, help="instances per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=["in_domain", "out_of_domain"], default="in_domain")
    parser.add_argument("--tasks", nargs="*", default=None, help="task names (default: all)")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--max-per-shard", type=int, default=256)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from app.tasks.vbvr.shards import write_shards

    paths = write_shards(
        args.out, args.num, args.seed, args.split, args.tasks, args.image_size, args.max_per_shard, progress=True
    )
    print(f"wrote {len(paths)} shard(s) to {args.out}")

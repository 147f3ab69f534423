"""Data generators: ``python -m app.data <generator> --out DIR --num N --seed S`` (deterministic for a seed).

Generators:
    vbvr    the procedural visual reasoning suite (papers/003) as WebDataset shards, per split
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.data", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="generator", required=True)
    vbvr = commands.add_parser("vbvr", help="procedural visual reasoning tasks with verifiable scorers")
    vbvr.add_argument("--out", required=True, help="output folder for the .tar shards")
    vbvr.add_argument("--num", type=int, default=100, help="instances per task")
    vbvr.add_argument("--seed", type=int, default=0)
    vbvr.add_argument("--split", choices=["in_domain", "out_of_domain"], default="in_domain")
    vbvr.add_argument("--tasks", nargs="*", default=None, help="task names (default: all)")
    vbvr.add_argument("--image-size", type=int, default=128)
    vbvr.add_argument("--max-per-shard", type=int, default=256)
    args = parser.parse_args(argv)
    if args.generator == "vbvr":
        from app.vbvr.shards import write_shards

        paths = write_shards(
            args.out, args.num, args.seed, args.split, args.tasks, args.image_size, args.max_per_shard, progress=True
        )
        print(f"wrote {len(paths)} shard(s) to {args.out}")


if __name__ == "__main__":
    main()

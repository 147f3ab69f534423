"""``python -m app.tasks dots``: the rendered dots task (:class:`~app.tasks.dots.DotsDataset`) as WebDataset shards.

``--strip-labels`` writes label-free shards (no answer, no reasoning) for consistency training, whose pairs are made on
the fly by :class:`~app.tasks.dots.pairs.DotsPairAugmenter`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("dots", help="the red/blue dots left-of task (quickstart, consistency recipes)")
    parser.add_argument("--out", required=True, help="output folder for the .tar shards")
    parser.add_argument("--num", type=int, default=2000, help="number of samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--dot-radius", type=int, default=None, help="dot radius in pixels (image size / 14)")
    parser.add_argument("--num-distractors", type=int, default=0)
    parser.add_argument("--strip-labels", action="store_true", help="write no answer or reasoning (label-free)")
    parser.add_argument("--prefix", default="dots", help="shard and key prefix")
    parser.add_argument("--max-per-shard", type=int, default=500)
    parser.add_argument(
        "--format",
        choices=("shards", "jsonl"),
        default="shards",
        help="shards, or a JSONL of questions and answers with PNGs beside it (docs/your_data.md); jsonl names the "
        "file after --prefix",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from app.data.shards import write_samples
    from app.tasks.dots.dots import DotsDataset

    dataset = DotsDataset(
        args.num, args.seed, args.image_size, num_distractors=args.num_distractors, dot_radius=args.dot_radius
    )
    if args.format == "jsonl":
        from app.data.files import write_folder
        from app.data.shards import without_labels

        samples = (without_labels(s) if args.strip_labels else s for s in (dataset[i] for i in range(len(dataset))))
        path = write_folder(samples, args.out, args.prefix)
        print(f"wrote {len(dataset)} rows to {path} (images in {Path(args.out) / 'images'})")
        return
    paths = write_samples(
        (dataset[i] for i in range(len(dataset))),
        args.out,
        args.prefix,
        max_per_shard=args.max_per_shard,
        strip_labels=args.strip_labels,
        progress=True,
        total=len(dataset),
    )
    print(f"wrote {len(dataset)} samples in {len(paths)} shard(s) to {args.out}")

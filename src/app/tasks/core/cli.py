"""``python -m app.tasks core``: CoRe comparison triplets (CoRe section 3.2, docs/algorithms.md#papers) as WebDataset
shards.

``--num`` triplets in all, cycling over ``--tasks``; deterministic for ``--seed``. Besides the shards, writes
``{prefix}-quality.json``: the quality-control counts (accepted and rejected triplets per task, by reason).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.tasks.core.metrics import TASKS


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "core", help="CoRe cross-image comparison triplets (counting, depth, distance, spatial)"
    )
    parser.add_argument("--out", required=True, help="output folder for the .tar shards")
    parser.add_argument("--num", type=int, default=2000, help="triplets in all, spread evenly over the tasks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="task dimensions (default: all)")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--max-per-shard", type=int, default=1000)
    parser.add_argument("--prefix", default="core", help="shard and sample key prefix")
    parser.add_argument(
        "--unlabeled", action="store_true", help="write label-free shards (no answers, no ground truth)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from app.data.shards import write_samples
    from app.tasks.core.dataset import CoreTripletDataset

    if args.num < 1:
        raise SystemExit(f"--num must be >= 1, got {args.num}")
    dataset = CoreTripletDataset(args.num, args.seed, args.image_size, args.tasks, labeled=not args.unlabeled)
    samples = (dataset[i] for i in range(len(dataset)))
    paths = write_samples(samples, args.out, args.prefix, args.max_per_shard, progress=True, total=len(dataset))
    summary = dataset.stats.summary()
    (Path(args.out) / f"{args.prefix}-quality.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {len(dataset)} triplets in {len(paths)} shard(s) to {args.out}")
    for task, counts in summary.items():
        print(f"  {task}: {counts['accepted']} accepted, {counts['rejected']} rejected {counts['reasons']}")

"""``python -m app.tasks spatial``: spatial VQA from 3D boxes (OT-GRPO, Appendix D, docs/algorithms.md#papers) as
WebDataset shards.

Procedural scenes by default; ``--omni3d PATH.json --image-root DIR`` builds the questions from real Omni3D
annotations instead. ``--strip-labels`` writes label-free shards (no answer, reasoning or ground truth in meta), for
consistency training; twins are made on the fly by :class:`app.tasks.spatial.SpatialPairAugmenter`.

    python -m app.tasks spatial --out data/spatial --num 2000 --seed 0 --domain indoor
"""

from __future__ import annotations

import argparse

from app.tasks.spatial.tasks import BOOL_TASKS, TASK_NAMES


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("spatial", help="spatial VQA from 3D boxes (orientation, depth, size, distance, ...)")
    parser.add_argument("--out", required=True, help="output folder for the .tar shards")
    parser.add_argument("--num", type=int, default=2000, help="number of samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--domain", choices=["indoor", "outdoor", "both"], default="indoor", help="procedural scenes")
    parser.add_argument("--tasks", nargs="+", choices=TASK_NAMES, default=list(BOOL_TASKS), help="tasks, taking turns")
    parser.add_argument("--image-size", type=int, default=256, help="side of the procedural images in pixels")
    parser.add_argument("--omni3d", default=None, help="an Omni3D JSON file to build questions from")
    parser.add_argument("--image-root", default=None, help="folder the Omni3D file_path entries are relative to")
    parser.add_argument("--strip-labels", action="store_true", help="write label-free shards")
    parser.add_argument("--max-per-shard", type=int, default=1000)
    parser.add_argument("--prefix", default="spatial", help="shard file prefix")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from app.data.shards import write_samples
    from app.tasks.spatial.dataset import SpatialVQADataset, omni3d_samples
    from app.tasks.spatial.omni3d import load_omni3d

    if args.num < 0:
        raise SystemExit(f"--num must be >= 0, got {args.num}")
    if args.omni3d is not None:
        records = load_omni3d(args.omni3d)
        samples = omni3d_samples(records, args.num, args.seed, args.tasks, args.image_root)
    else:
        dataset = SpatialVQADataset(args.num, args.seed, args.image_size, args.tasks, args.domain)
        samples = (dataset[i] for i in range(len(dataset)))
    paths = write_samples(
        samples,
        args.out,
        args.prefix,
        max_per_shard=args.max_per_shard,
        strip_labels=args.strip_labels,
        progress=True,
        total=args.num,
    )
    print(f"wrote {len(paths)} shard(s) to {args.out}")

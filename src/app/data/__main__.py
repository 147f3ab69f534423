"""``python -m app.data``: your own data files to shards, and an example data set to start from.

- ``convert IN OUT --format PRESET``: stream the rows of ``IN`` (a ``.json``, ``.jsonl``, ``.parquet``, ``.csv`` or
  ``.txt`` file or a saved ``datasets`` folder, read by :class:`~app.data.files.RowReader`) into WebDataset shards in
  the package's schema (:mod:`app.data.shards`), printing a progress bar and a summary of what was written and skipped.
- ``example OUT``: write a folder of dots images with ``train.jsonl`` and ``val.jsonl`` beside it, the layout the
  newcomer page (docs/your_data.md) trains on.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from app.data.files import PRESETS, BadRowError, RowCheck, RowReader, TableRows, load_table
from app.data.shards import write_samples


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.data", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="a data file to WebDataset shards")
    convert.add_argument("input", help="data file or saved datasets folder")
    convert.add_argument("out", help="output folder for the .tar shards")
    convert.add_argument("--format", default="default", choices=sorted(PRESETS), help="field layout (preset)")
    convert.add_argument("--prefix", default=None, help="shard and key prefix (default: the input's name)")
    convert.add_argument("--max-per-shard", type=int, default=1000, help="samples per shard (the shard size limit)")
    convert.add_argument("--image-dir", default=None, help="folder of relative image paths (default: the input's)")
    convert.add_argument("--allow-outside-image-dir", action="store_true")
    convert.add_argument("--max-image-pixels", type=int, default=4096 * 4096)
    convert.add_argument("--on-bad-row", choices=("stop", "skip"), default="stop")
    convert.add_argument("--strip-labels", action="store_true", help="write no answer or reasoning (label-free)")
    for field in ("question", "images", "answer", "reasoning", "task", "key"):
        convert.add_argument(f"--{field}", default=None, help=f"the {field} field (default: the preset's)")
    convert.set_defaults(run=run_convert)

    example = commands.add_parser("example", help="dots images with train.jsonl and val.jsonl")
    example.add_argument("out", help="output folder")
    example.add_argument("--train", type=int, default=64, help="training rows")
    example.add_argument("--val", type=int, default=16, help="validation rows")
    example.add_argument("--seed", type=int, default=0)
    example.add_argument("--image-size", type=int, default=64)
    example.set_defaults(run=run_example)
    return parser


def _prefix(path: str) -> str:
    name = Path(path.rstrip("/")).name.split(".")[0]
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "data"


def convert(args: argparse.Namespace) -> tuple[list[Path], RowCheck]:
    """Write the shards of ``args.input``; the shard paths and the row counts."""
    fields = {name: getattr(args, name) for name in ("question", "images", "answer", "reasoning", "task", "key")}
    reader = RowReader(
        preset=args.format,
        image_dir=args.image_dir,
        allow_outside_image_dir=args.allow_outside_image_dir,
        max_image_pixels=args.max_image_pixels,
        on_bad_row=args.on_bad_row,
        **fields,
    )
    rows = TableRows(load_table(args.input))
    check = RowCheck(reader, args.input)
    samples = (sample for index, row in rows.iter() if (sample := check(row, index, decode=True)) is not None)
    shards = write_samples(
        samples,
        args.out,
        args.prefix or _prefix(args.input),
        max_per_shard=args.max_per_shard,
        strip_labels=args.strip_labels,
        progress=True,
        total=len(rows),
    )
    return shards, check


def run_convert(args: argparse.Namespace) -> None:
    try:
        shards, check = convert(args)
    except BadRowError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"wrote {check.good} samples to {len(shards)} shards in {args.out}")
    print(check.summary())
    for bad in check.bad_rows:
        print(f"  skipped {bad}")


def run_example(args: argparse.Namespace) -> None:
    from app.tasks.dots.dots import DotsDataset

    out = Path(args.out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    for split, num, seed in (("train", args.train, args.seed), ("val", args.val, args.seed + 1)):
        dataset = DotsDataset(num, seed, args.image_size, dot_radius=max(1, args.image_size // 5))
        with open(out / f"{split}.jsonl", "w") as file:
            for i in range(num):
                sample = dataset[i]
                name = f"images/{split}-{i:06d}.png"
                sample.images[0].save(out / name)
                row = {"question": sample.question, "answer": sample.answer, "images": [name], "task": sample.task}
                if sample.reasoning is not None:
                    row["reasoning"] = sample.reasoning
                file.write(json.dumps(row) + "\n")
        print(f"wrote {num} rows to {out / f'{split}.jsonl'} (images in {out / 'images'})")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])

"""``python -m app.data convert``: your own data files to shards.

- ``convert IN OUT --format PRESET``: stream the rows of ``IN`` (a ``.json``, ``.jsonl``, ``.parquet``, ``.csv`` or
  ``.txt`` file or a saved ``datasets`` folder, read by :class:`~app.data.rows.RowReader`) into WebDataset shards in
  the package's schema (:mod:`app.data.shards`), printing a progress bar and a summary of what was written and skipped.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from app.data.row_fields import PRESETS
from app.data.rows import BadRowError, RowCheck, RowReader
from app.data.shards import write_samples
from app.data.tables import TableRows, load_table


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.data", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="a data file to WebDataset shards")
    convert.add_argument("input", help="data file or saved datasets folder")
    convert.add_argument("out", help="output folder for the .tar shards")
    convert.add_argument("--format", default="default", choices=sorted(PRESETS), help="field layout (preset)")
    convert.add_argument("--prefix", default=None, help="shard and key prefix (default: the input's name)")
    convert.add_argument("--max-per-shard", type=int, default=1000, help="samples per shard")
    convert.add_argument(
        "--max-shard-bytes",
        type=int,
        default=None,
        help="close a shard once its files hold this many bytes (default: no limit)",
    )
    convert.add_argument("--image-dir", default=None, help="folder of relative image paths (default: the input's)")
    convert.add_argument("--allow-outside-image-dir", action="store_true")
    convert.add_argument("--max-image-pixels", type=int, default=4096 * 4096)
    convert.add_argument("--video-fps", type=float, default=2.0, help="video frames kept per second of a clip")
    convert.add_argument("--max-video-frames", type=int, default=32, help="most frames kept of a video")
    convert.add_argument("--max-video-pixels", type=int, default=448 * 448, help="most pixels of a kept video frame")
    convert.add_argument("--on-bad-row", choices=("stop", "skip"), default="stop")
    convert.add_argument("--strip-labels", action="store_true", help="write no answer or reasoning (label-free)")
    for field in ("question", "images", "videos", "answer", "reasoning", "task", "key"):
        convert.add_argument(f"--{field}", default=None, help=f"the {field} field (default: the preset's)")
    convert.set_defaults(run=run_convert)

    return parser


def _prefix(path: str) -> str:
    name = Path(path.rstrip("/")).name.split(".")[0]
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "data"


def convert(args: argparse.Namespace) -> tuple[list[Path], RowCheck]:
    """Write the shards of ``args.input``; the shard paths and the row counts."""
    names = ("question", "images", "videos", "answer", "reasoning", "task", "key")
    fields = {name: getattr(args, name) for name in names}
    reader = RowReader(
        preset=args.format,
        image_dir=args.image_dir,
        allow_outside_image_dir=args.allow_outside_image_dir,
        max_image_pixels=args.max_image_pixels,
        video_fps=args.video_fps,
        max_video_frames=args.max_video_frames,
        max_video_pixels=args.max_video_pixels,
        on_bad_row=args.on_bad_row,
        **fields,
    )
    if reader.fields.twin is not None:
        raise SystemExit(
            f"error: the {args.format!r} layout reads each row as a prompt pair, and shards hold single prompts; "
            "train on the file itself (app.data.files.FileDataset)"
        )
    rows = TableRows(load_table(args.input))
    check = RowCheck(reader, args.input)
    samples = (sample for index, row in rows.iter() if (sample := check(row, index, decode=True)) is not None)
    shards = write_samples(
        samples,
        args.out,
        args.prefix or _prefix(args.input),
        max_per_shard=args.max_per_shard,
        max_shard_bytes=args.max_shard_bytes,
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


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])

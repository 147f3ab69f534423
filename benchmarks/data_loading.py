"""Cost of reading your own data files: rows/s of the file data set and of the converter, against reading the same
rows with ``datasets`` and PIL alone, and the converter's peak memory as the number of rows grows.

    python benchmarks/data_loading.py                 # 10^4 rows with 64-px PNGs: about a minute on one core
    python benchmarks/data_loading.py --rows 1000     # a few seconds
    python benchmarks/data_loading.py --memory        # + converter peak RSS at 10^3 and 10^5 rows (subprocesses)

Rows are JSONL (``question``, ``answer``, ``images`` a path, ``level``) with one distinct 64-pixel PNG each. Timed:

- ``datasets + PIL``: ``Dataset.from_json`` and, per row, open the image and convert it to RGB (the floor: what any
  reader of these files must do).
- ``FileDataset build``: the data set's check of every row (fields, image headers and structure, duplicate keys).
- ``FileDataset read``: every sample read back (images decoded), as a data loader would.
- ``convert``: ``python -m app.data convert`` in process (read, check, decode, PNG-encode, write shards).

Each is the median of ``--repeats`` runs (the ``datasets`` cache is warm after the first). ``--memory`` runs the
converter in a fresh process on 10^3 and 10^5 rows (the rows of the large file name 100 images over and over, so only
the row count grows) and prints each peak RSS (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from PIL import Image  # noqa: E402


def write_rows(folder: Path, rows: int, distinct_images: int | None = None) -> Path:
    """``rows`` JSONL rows under ``folder``, each naming one of ``distinct_images`` PNGs (default: one per row)."""
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    count = distinct_images or rows
    for i in range(count):
        Image.new("RGB", (64, 64), (i % 256, (i // 256) % 256, 7)).save(images / f"{i}.png")
    path = folder / "rows.jsonl"
    with open(path, "w") as file:
        for i in range(rows):
            row = {
                "question": f"How many dots in image {i}?",
                "answer": str(i % 10),
                "images": [f"images/{i % count}.png"],
            }
            file.write(json.dumps({**row, "level": i % 3}) + "\n")
    return path


def median_time(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def datasets_alone(path: Path) -> None:
    import datasets

    table = datasets.Dataset.from_json(str(path))
    for row in table:
        for name in row["images"]:
            with Image.open(path.parent / name) as image:
                image.convert("RGB")


def file_dataset_read(path: Path) -> None:
    from app.data.files import FileDataset

    data = FileDataset(10**9, 0, 64, str(path))
    for i in range(len(data)):
        data[i]


def convert(path: Path, out: Path) -> None:
    from app.data.__main__ import main

    main(["convert", str(path), str(out), "--max-per-shard", "1000"])


def peak_rss_mib(rows: int, folder: Path) -> float:
    """Peak RSS of a fresh process converting ``rows`` rows."""
    path = write_rows(folder, rows, distinct_images=100)
    code = (
        "import resource, sys; from app.data.__main__ import main; "
        f"main(['convert', {str(path)!r}, {str(folder / 'shards')!r}]); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return int(done.stdout.strip().splitlines()[-1]) / 1024  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="also the converter's peak RSS at 10^3 and 10^5 rows")
    args = parser.parse_args()

    import datasets

    from app.data.files import FileDataset

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = write_rows(folder / "data", args.rows)
        datasets_alone(path)  # warm the datasets cache and the page cache
        timings = {
            "datasets + PIL": median_time(lambda: datasets_alone(path), args.repeats),
            "FileDataset build": median_time(lambda: FileDataset(10**9, 0, 64, str(path)), args.repeats),
            "FileDataset build + read": median_time(lambda: file_dataset_read(path), args.repeats),
            "convert": median_time(lambda: convert(path, folder / "shards"), args.repeats),
        }
        print(f"\n{args.rows} rows, 64-px PNGs, median of {args.repeats}")
        print(f"{'reader':<26}{'seconds':>10}{'rows/s':>12}")
        for name, seconds in timings.items():
            print(f"{name:<26}{seconds:>10.2f}{args.rows / seconds:>12.0f}")
        per_batch = timings["FileDataset build + read"] - timings["FileDataset build"]
        print(f"reading a batch of 8 samples: {1000 * 8 * per_batch / args.rows:.2f} ms")
        if args.memory:
            for rows in (1_000, 100_000):
                print(f"convert {rows} rows: peak RSS {peak_rss_mib(rows, folder / f'mem{rows}'):.0f} MiB")
    print(f"(this process: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()

"""Streaming throughput of ``ShardDataModule``: shards -> decoded ``VisualSample`` batches with an augmented twin.

    python benchmarks/loader.py                      # 2048 dots samples, 256 x 256, about 30 s on 2 cores
    python benchmarks/loader.py --texture            # noisy images, closer to photos: bigger PNGs, slower decoding
    python benchmarks/loader.py --workers 0 2 4

Writes ``--samples`` samples (``DotsDataset``, ``--size`` pixels, optionally with a noise texture) to shards in a
temporary folder, then streams one epoch through ``ShardDataModule.train_dataloader()`` for each worker count: tar
reading, a 1000-record shuffle buffer, PNG decoding to RGB, and a horizontally flipped twin of every sample (as in
``app.tasks.dots.pairs``), batched into lists of 2 x ``--batch-size`` prompts. The first ``--warmup`` batches (worker
start-up) are left out of the rate. The CPU columns (per streamed sample, start-up included) do not depend on what else
runs on the machine, unlike the rate: their sum bounds the rate on a quiet machine (two cores: ``2000 / (main +
workers)``).
Target: >= 500 samples/s with 2 workers on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from app.data import ShardDataModule, write_samples  # noqa: E402
from app.tasks.dots import DotsDataset  # noqa: E402
from app.tasks.dots.pairs import make_twin  # noqa: E402
from app.types import VisualSample  # noqa: E402


class HFlipTwin:
    """The sample and its mirrored twin (answer negated), like ``PairedDotsDataset`` with the hflip transform."""

    def __call__(self, sample: VisualSample, rng: random.Random) -> tuple[VisualSample, VisualSample]:
        return sample, make_twin(sample, ("hflip",), pair_id=str(rng.getrandbits(32)))


def make_samples(n: int, size: int, texture: bool):
    dataset = DotsDataset(num_samples=n, seed=0, image_size=size)
    rng = np.random.default_rng(0)
    for i in range(n):
        sample = dataset[i]
        if texture:
            pixels = np.asarray(sample.images[0], dtype=np.int16) + rng.integers(-12, 13, (size, size, 3))
            sample.images = [Image.fromarray(pixels.clip(0, 255).astype(np.uint8))]
        yield sample


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def stream(urls: str, workers: int, batch_size: int, warmup: int) -> dict[str, float]:
    """Seconds to the first batch, source samples per second after the warm-up, CPU ms per sample by process."""
    dm = ShardDataModule(train_urls=urls, batch_size=batch_size, num_workers=workers, augment=HFlipTwin())
    dm.setup("fit")
    main_cpu, workers_cpu = cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    first = timed_start = None
    seen = timed = 0
    for i, batch in enumerate(dm.train_dataloader()):
        now = time.perf_counter()
        first = now - start if first is None else first
        seen += len(batch) // 2
        if i == warmup - 1:
            timed_start = now
        elif i >= warmup:
            timed += len(batch) // 2
    rate = timed / (time.perf_counter() - timed_start) if timed_start is not None and timed else float("nan")
    # Finished workers have been joined, so their CPU time is in RUSAGE_CHILDREN.
    main_cpu = cpu_seconds(resource.RUSAGE_SELF) - main_cpu
    workers_cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - workers_cpu
    return {"first": first, "rate": rate, "main_ms": 1e3 * main_cpu / seen, "workers_ms": 1e3 * workers_cpu / seen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2048, help="samples written and streamed")
    parser.add_argument("--size", type=int, default=256, help="image side in pixels")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per batch (twice as many prompts)")
    parser.add_argument("--per-shard", type=int, default=256, help="samples per shard")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="worker counts to time")
    parser.add_argument("--warmup", type=int, default=8, help="batches left out of the rate")
    parser.add_argument("--texture", action="store_true", help="add noise to the images (photo-like PNG sizes)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
        start = time.perf_counter()
        paths = write_samples(make_samples(args.samples, args.size, args.texture), tmp, "bench", args.per_shard)
        written = time.perf_counter() - start
        megabytes = sum(p.stat().st_size for p in paths) / 2**20
        load = os.getloadavg()[0]
        print(
            f"\n{args.samples} samples, {args.size}x{args.size}{' textured' if args.texture else ''}: {len(paths)} "
            f"shards, {megabytes:.1f} MiB, written in {written:.1f} s; {os.cpu_count()} CPUs, load {load:.2f}"
        )
        print(
            f"{'workers':>8}{'first batch (s)':>17}{'samples/s':>12}{'prompts/s':>12}"
            f"{'CPU ms/sample: main':>22}{'workers':>9}"
        )
        rates = {}
        for workers in args.workers:
            r = stream(f"{tmp}/bench-*.tar", workers, args.batch_size, args.warmup)
            rates[workers] = r["rate"]
            print(
                f"{workers:>8}{r['first']:>17.2f}{r['rate']:>12.0f}{2 * r['rate']:>12.0f}"
                f"{r['main_ms']:>22.2f}{r['workers_ms']:>9.2f}"
            )
        if 2 in rates:
            print(f"target: >= 500 samples/s with 2 workers -> {'met' if rates[2] >= 500 else 'MISSED'}")


if __name__ == "__main__":
    main()

"""OCR reward throughput: images per second at 256x256 through ``OCRReward.score`` (RapidOCR PP-OCRv4 on the CPU).

    python benchmarks/ocr_reward.py [--images 32] [--repeats 3] [--size 256]

Two kinds of picture: a word rendered with PIL's default font (size 40) on white, which the detector finds and the
recogniser reads, and uniform noise, on which the detector finds nothing (what an untrained generator draws). Each row
scores ``--images`` pictures ``--repeats`` times after a warm-up batch (the engine loads in it) and reports the median
rate. ``detection_side`` 320 is the reward's default, 736 RapidOCR's own; ONNX Runtime runs on one thread per process
(``num_threads: 1``). The last row splits each batch over a process pool of ``cpu_count`` workers, as the rollout
queue's reward workers would (``workers: process``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from app.rewards import WeightedReward  # noqa: E402
from app.rewards.ocr import OCRReward  # noqa: E402
from app.types import VisualSample  # noqa: E402

WORDS = ("Hello", "river", "OPEN", "Zebra", "cat", "lamp", "STOP", "music")


from provenance import machine  # noqa: E402


def render(word: str, size: int) -> torch.Tensor:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=max(10, size * 40 // 256))
    left, top, right, bottom = draw.textbbox((0, 0), word, font=font)
    draw.text(((size - right + left) / 2 - left, (size - bottom + top) / 2 - top), word, font=font, fill="black")
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1)


def rate(score, images, samples, repeats: int) -> float:
    score(images, samples)  # warm-up: the engine loads here
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        values = score(images, samples)
        rates.append(len(images) / (time.perf_counter() - start))
    assert len(values) == len(images)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    words = [WORDS[i % len(WORDS)] for i in range(args.images)]
    samples = [VisualSample([], f'A sign that says "{w}"', "text_render") for w in words]
    text = [render(w, args.size) for w in words]
    noise = list(torch.rand(args.images, 3, args.size, args.size, generator=torch.Generator().manual_seed(0)))
    print(f"command: python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {machine()}; python {platform.python_version()}, torch {torch.__version__}")
    print(f"date:    {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {args.images} images of {args.size} px per batch")
    print(f"{'pictures':<10}{'detection_side':>16}{'processes':>11}{'images/s':>10}{'mean score':>12}")
    for side in (320, 736):
        reward = OCRReward(detection_side=side)
        for name, images in (("text", text), ("noise", noise)):
            images_per_s = rate(reward.score, images, samples, args.repeats)
            mean = float(reward.score(images, samples).mean())
            print(f"{name:<10}{side:>16}{1:>11}{images_per_s:>10.1f}{mean:>12.3f}")
    workers = os.cpu_count() or 1
    rewards = WeightedReward([OCRReward()])
    with ProcessPoolExecutor(workers) as executor:
        chunk = -(-len(text) // workers)

        def pooled(images, samples):
            pending = [
                rewards.submit(images[i : i + chunk], samples[i : i + chunk], executor=executor)
                for i in range(0, len(images), chunk)
            ]
            return torch.cat([rewards.gather(p).total for p in pending])

        images_per_s = rate(pooled, text, samples, args.repeats)
        mean = float(pooled(text, samples).mean())
    print(f"{'text':<10}{320:>16}{workers:>11}{images_per_s:>10.1f}{mean:>12.3f}")


if __name__ == "__main__":
    main()

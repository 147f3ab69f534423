"""Scorer throughput per core: images per second at 256x256 and 81-frame videos per second, for every task.

    python benchmarks/scorers.py [--repeats 50]

Each task renders one solved instance at 256x256; the image case scores its last frame, the video case an 81-frame
video made by resampling the rendered frames. One thread (OpenCV and torch limited to 1), so the figures are per core.
Target (issue): at least 200 images/s per core for every scorer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from app.tasks.vbvr import TASKS, get_task  # noqa: E402


def per_second(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return repeats / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--video-repeats", type=int, default=3)
    args = parser.parse_args()
    cv2.setNumThreads(1)
    print(f"{'task':<24}{'images/s':>10}{'81-frame videos/s':>20}")
    slowest = float("inf")
    for name in sorted(TASKS):
        task = get_task(name, image_size=256)
        instance = task.generate(0)
        video = instance.frames[np.linspace(0, len(instance.frames) - 1, 81).round().astype(int)]
        last, config = instance.last_frame, instance.config
        images = per_second(lambda t=task, x=last, c=config: t.score(x, c), args.repeats)
        videos = per_second(lambda t=task, x=video, c=config: t.score(x, c), args.video_repeats)
        slowest = min(slowest, images)
        print(f"{name:<24}{images:>10.0f}{videos:>20.1f}")
    print(f"slowest scorer: {slowest:.0f} images/s per core (target >= 200): {'met' if slowest >= 200 else 'NOT met'}")


if __name__ == "__main__":
    main()

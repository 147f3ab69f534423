"""What a reward served by another process costs beyond the reward itself (docs/remote_rewards.md, docs/performance.md).

Starts ``python -m app.rewards.serve`` on the loopback address serving a reward that costs nothing (its values still
depend on every input), then times ``RemoteReward.checked_score`` of one batch of 64 completions (one request) against
the same reward's ``checked_score`` in this process. The difference is the request overhead: encoding, JSON, HTTP,
decoding on the server, and back. Target: <= 5 ms per batch.

    OMP_NUM_THREADS=1 python benchmarks/remote_reward.py              # text and 64 x 64 images, 50 requests each
    OMP_NUM_THREADS=1 python benchmarks/remote_reward.py --requests 200 --sizes 64 128

Each payload is timed in alternating rounds (remote, then in-process) after 3 warm-up requests; medians, with the
min and max of the remote round trips.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from app.rewards import FormatReward, RemoteReward, RewardComponent  # noqa: E402
from app.rewards.serve import ServerProcess  # noqa: E402
from app.types import VisualSample  # noqa: E402

HERE = Path(__file__).resolve().parent
BATCH = 64
WARMUP = 3


class MeanRed(RewardComponent):
    """The mean of a rendering's first channel: next to no work, but it reads every value it is sent."""

    def score(self, completions, samples):
        return torch.stack([c[0].float().mean() for c in completions])


@contextlib.contextmanager
def served(rewards_yaml: str) -> Iterator[str]:
    """The URL of a ``python -m app.rewards.serve`` process serving ``rewards_yaml`` (class paths may name this
    folder's modules); stopped on exit."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "rewards.yaml"
        config.write_text(rewards_yaml)
        with ServerProcess(config, pythonpath=[HERE]) as server:
            yield server.url


def payloads(sizes: list[int]) -> dict[str, tuple[RewardComponent, str, list, list[VisualSample]]]:
    """name -> (the reward in-process, its served name, 64 completions, their samples)."""
    generator = torch.Generator().manual_seed(0)
    prompt = VisualSample([], "How many dots are there?", "dots", answer="3")
    texts = [f"<think>{'counting the dots one by one ' * 6}#{i}</think><answer>{i % 5}</answer>" for i in range(BATCH)]
    out = {"text (format reward)": (FormatReward(), "format", texts, [prompt] * BATCH)}
    for size in sizes:
        images = [torch.rand(3, size, size, generator=generator) for _ in range(BATCH)]
        out[f"images 3x{size}x{size} float32"] = (MeanRed(), "mean_red", images, [prompt] * BATCH)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50, help="timed requests per payload")
    parser.add_argument("--sizes", type=int, nargs="*", default=[64], help="image sides to time")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    config = "rewards:\n  - class_path: app.rewards.FormatReward\n  - class_path: remote_reward.MeanRed\n"
    print(f"| payload ({BATCH} completions, one request) | in-process (ms) | remote (ms) | min / max remote (ms) "
          "| overhead (ms) |")  # fmt: skip
    print("|---|---|---|---|---|")
    with served(config) as url:
        for name, (local, served_name, completions, samples) in payloads(args.sizes).items():
            reward = RemoteReward(url, served_name, concurrency=1, max_batch=BATCH)
            for _ in range(WARMUP):
                reward.checked_score(completions, samples)
            remote_times, local_times = [], []
            for _ in range(args.requests):
                start = time.perf_counter()
                remote_values, _ = reward.checked_score(completions, samples)
                remote_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                local_values, _ = local.checked_score(completions, samples)
                local_times.append(time.perf_counter() - start)
                if not torch.equal(remote_values, local_values):
                    raise AssertionError(f"{name}: the served reward gave other values than the reward in-process")
            remote_ms, local_ms = statistics.median(remote_times) * 1e3, statistics.median(local_times) * 1e3
            print(
                f"| {name} | {local_ms:.2f} | {remote_ms:.2f} | {min(remote_times) * 1e3:.2f} / "
                f"{max(remote_times) * 1e3:.2f} | {remote_ms - local_ms:.2f} |"
            )


if __name__ == "__main__":
    main()

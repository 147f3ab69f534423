"""What a reward served by another process costs beyond the reward itself (docs/remote_rewards.md, docs/performance.md).

Starts ``python -m app.rewards.serve`` on the loopback address serving a reward that costs nothing (its values still
depend on every input), then times ``RemoteReward.checked_score`` of one batch of 64 completions (one request) against
the same reward's ``checked_score`` in this process. The difference is the request overhead: encoding, JSON, HTTP,
decoding on the server, and back. Targets: <= 2 ms per request of 64 text completions (<= 5 ms for 3 MB of images).
Then ``--clients`` clients (100 by default), each its own ``RemoteReward`` with its own connection and no retries,
send ``--burst_requests`` text batches each at once: every request must be answered (target: 0 connection resets).

    OMP_NUM_THREADS=1 python benchmarks/remote_reward.py              # text and 64 x 64 images, 50 requests each
    OMP_NUM_THREADS=1 python benchmarks/remote_reward.py --requests 200 --sizes 64 128

Each payload is timed in alternating rounds (remote, then in-process) after 3 warm-up requests; medians, with the
min and max of the remote round trips.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import tempfile
import threading
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


def burst(url: str, clients: int, requests: int) -> tuple[list[float], list[str]]:
    """Seconds of each request of ``clients`` concurrent clients sending ``requests`` text batches each, started
    together, and the failures (a reset connection among them); no client retries."""
    _, served_name, completions, samples = payloads([])["text (format reward)"]
    rewards = [RemoteReward(url, served_name, concurrency=1, retries=0, timeout_s=60) for _ in range(clients)]
    for reward in rewards:
        reward.served_reward()  # asked once each, before the burst
    start, lock = threading.Barrier(clients), threading.Lock()
    seconds: list[float] = []
    failures: list[str] = []

    def client(reward: RemoteReward) -> None:
        start.wait()
        for _ in range(requests):
            began = time.perf_counter()
            try:
                reward.checked_score(completions, samples)
            except Exception as error:  # counted, not raised: the table says how many
                with lock:
                    failures.append(f"{type(error).__name__}: {error}")
                continue
            with lock:
                seconds.append(time.perf_counter() - began)

    threads = [threading.Thread(target=client, args=(reward,)) for reward in rewards]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for reward in rewards:
        reward.close()
    return seconds, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50, help="timed requests per payload")
    parser.add_argument("--sizes", type=int, nargs="*", default=[64], help="image sides to time")
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients of the burst (0: no burst)")
    parser.add_argument("--burst_requests", type=int, default=5, help="text batches each client sends in the burst")
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
        if args.clients:
            began = time.perf_counter()
            seconds, failures = burst(url, args.clients, args.burst_requests)
            wall = time.perf_counter() - began
            resets = sum("Reset" in f or "BrokenPipe" in f or "RemoteDisconnected" in f for f in failures)
            quantiles = statistics.quantiles(seconds, n=100) if len(seconds) > 1 else [math.nan] * 99
            print(
                f"\n| concurrent clients | requests | answered | resets | other failures | median (ms) | p99 (ms) "
                f"| wall (s) |\n|---|---|---|---|---|---|---|---|\n| {args.clients} | "
                f"{args.clients * args.burst_requests} | {len(seconds)} | {resets} | {len(failures) - resets} | "
                f"{statistics.median(seconds) * 1e3:.1f} | {quantiles[98] * 1e3:.1f} | {wall:.2f} |"
            )
            for failure in sorted(set(failures))[:5]:
                print(f"  failure: {failure}")


if __name__ == "__main__":
    main()

"""What a benchmark's table names besides its numbers: the machine it ran on and the code it timed."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    """The CPU model, its count and the load average when the benchmark started."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{model}, {os.cpu_count()} CPUs, load {load:.2f}"


def commit() -> str:
    """The checkout's short commit, marked when ``src/`` differs from it."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True)
        return out.stdout.strip() + (" (src modified)" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"

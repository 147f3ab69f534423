"""Fixtures of the multi-process tests: the probe scripts beside them run in processes of their own, one process
(``python``) or several (``torchrun``), and leave what the tests read in the output folder they are given."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

LOG_TAIL = 4000
"""Characters of a failed launch's output shown in the test's failure: the end, where the traceback is."""


@dataclass(frozen=True)
class ProbeLauncher:
    """Runs a probe script with arguments (an output folder, the cases) and returns its output (stdout + stderr); a
    launch that exits non-zero fails the test with the end of that output. ``timeout`` (seconds) only guards against a
    hang: ``subprocess.TimeoutExpired`` names the command."""

    env: Callable[..., dict[str, str]]

    def python(self, probe: Path, *args: object, timeout: float = 540) -> str:
        """One plain process: the probe runs without a process group's environment."""
        return self._run([sys.executable, str(probe), *map(str, args)], timeout)

    def torchrun(self, probe: Path, processes: int, *args: object, timeout: float = 540) -> str:
        """``processes`` processes on this machine (``torch.distributed.run --standalone``, gloo on CPU)."""
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
        return self._run([*launcher, str(probe), *map(str, args)], timeout)

    def _run(self, command: list[str], timeout: float) -> str:
        # one OpenMP thread per rank: the ranks share the machine's few cores (see tests/conftest.py)
        env = self.env(OMP_NUM_THREADS="1")
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        log = result.stdout + result.stderr
        assert result.returncode == 0, log[-LOG_TAIL:]
        return log


@pytest.fixture(scope="session")
def probes(app_env) -> ProbeLauncher:
    """Launches the probe scripts: ``probes.python(probe, *args)``, ``probes.torchrun(probe, processes, *args)``."""
    return ProbeLauncher(app_env)

"""The fits of a rehearsal, in order, in one process (under ``torchrun``: on every rank; the process group stays up
between the fits): ``python -m app.rehearsal.worker CONFIG [CONFIG ...]``."""

from __future__ import annotations

import os
import sys
import time

from app.command_line.commands import AppCLI, _destroy_process_group
from app.command_line.console import quiet_known_noise


def main(configs: list[str]) -> None:
    quiet_known_noise()
    sys.argv = sys.argv[:1]  # the configs are passed to each fit as args; LightningCLI warns about leftover argv
    try:
        for config in configs:
            start = time.perf_counter()
            AppCLI(args=["fit", "--config", config])
            if os.environ.get("RANK", "0") == "0":
                print(f"rehearsal fit {config}: {time.perf_counter() - start:.1f} s", flush=True)
    finally:
        _destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])

"""Building an embedded model once into the on-disk cache, safely under concurrent processes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def check_embedded_name(name_or_path: str, known: dict, kind: str) -> bool:
    """True for a known embedded name; False for a hub id or folder; a clear error for a misspelt ``tiny-*`` name
    (which would otherwise be sent to the hub)."""
    if name_or_path in known:
        return True
    if name_or_path.startswith("tiny-") and not Path(name_or_path).exists():
        raise ValueError(f"unknown embedded {kind} {name_or_path!r}; known: {sorted(known)}")
    return False


def build_once(target: Path, marker: str, write: Callable[[Path], None]) -> Path:
    """Return ``target``, first calling ``write(folder)`` to build it if ``target / marker`` is missing.

    ``write`` fills a private staging folder that is then renamed atomically, so concurrent processes (DDP ranks) never
    see a half-written one; if another process wins the race, its identical copy is kept.
    """
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    write(staging)
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target

"""Building an embedded model once into the on-disk cache, safely under concurrent processes."""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

# Libraries whose version changes what a builder writes (random initialisation, serialisation formats).
_BUILDER_LIBRARIES = ("torch", "transformers", "tokenizers", "diffusers")


def check_embedded_name(name_or_path: str, known: dict, kind: str) -> bool:
    """True for a known embedded name; False for a hub id or folder; a clear error for a misspelt ``tiny-*`` name
    (which would otherwise be sent to the hub)."""
    if name_or_path in known:
        return True
    if name_or_path.startswith("tiny-") and not Path(name_or_path).exists():
        raise ValueError(f"unknown embedded {kind} {name_or_path!r}; known: {sorted(known)}")
    return False


@cache
def builder_fingerprint() -> str:
    """A short hash of the code that builds embedded models and of the libraries it builds them with.

    Cached models live under a folder named by it, so a changed builder (or library) builds anew instead of loading a
    stale model; no version string needs bumping by hand.
    """
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    for library in _BUILDER_LIBRARIES:
        digest.update(f"{library}=={importlib.metadata.version(library)}".encode())
    return digest.hexdigest()[:12]


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

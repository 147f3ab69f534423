"""Building an embedded model once into the on-disk cache, safely under concurrent processes."""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

# Libraries whose version changes what a builder writes (random initialisation, serialisation formats).
_BUILDER_LIBRARIES = ("torch", "transformers", "tokenizers", "diffusers")
WAIT_FOR_RANK_ZERO_S = 600.0  # how long a rank > 0 waits for rank 0 to build an embedded model


def check_tiny_name(name_or_path: str, known: dict, kind: str) -> bool:
    """True for a known embedded name; False for a hub id or folder; a clear error for a misspelt ``tiny-*`` name
    (with the closest known name) and for a missing local folder, either of which would otherwise be sent to the hub.

    >>> check_tiny_name("tiny-qwen9-vl", {"tiny-qwen2-vl": 0, "tiny-sd3": 0}, "model")
    Traceback (most recent call last):
    ValueError: unknown embedded model 'tiny-qwen9-vl'; did you mean 'tiny-qwen2-vl'?
    known: ['tiny-qwen2-vl', 'tiny-sd3']
    """
    if name_or_path in known:
        return True
    if Path(name_or_path).exists():
        return False
    if name_or_path.startswith("tiny-"):
        close = difflib.get_close_matches(name_or_path, list(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown embedded {kind} {name_or_path!r}; {hint}known: {sorted(known)}")
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:  # a path, never a hub id (org/name)
        raise ValueError(f"no such folder {name_or_path!r} (a {kind} is an embedded name, a hub id or a folder)")
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
    see a half-written one; if another process wins the race, its identical copy is kept. Once a process group is
    initialised, transformers' ``save_pretrained`` writes only on rank 0, so the other ranks wait for rank 0's copy
    instead of renaming a folder with empty model subfolders into place.
    """
    if (target / marker).exists():
        return target
    if _is_nonzero_rank():
        return _wait_for(target, marker)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    write(staging)
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _is_nonzero_rank() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_rank() != 0


def _wait_for(target: Path, marker: str, timeout_s: float = WAIT_FOR_RANK_ZERO_S) -> Path:
    deadline = time.monotonic() + timeout_s
    while not (target / marker).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"waited {timeout_s:.0f} s for rank 0 to build the embedded model {target.name} into {target.parent}; "
                "every rank must build the same embedded models (rank 0 writes them, the others read its copy)"
            )
        time.sleep(0.2)
    return target

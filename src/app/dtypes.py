"""The weight dtypes a config may name, as one table: ``dtype: bfloat16`` in a policy, ``param_dtype`` of FSDP2."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str, field: str = "dtype") -> torch.dtype:
    """The torch dtype a config names; a ``ValueError`` naming ``field`` and the accepted names otherwise.

    >>> parse_dtype("bfloat16")
    torch.bfloat16
    """
    if name not in DTYPES:
        raise ValueError(f"{field} must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")

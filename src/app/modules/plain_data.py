"""Pending rollouts as plain data, for checkpoints: tensors, numbers, strings, lists and dicts only, what
``torch.load(weights_only=True)`` reads, and back; and moving what a rollout holds to a device."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from PIL import Image

from app.types import (
    CompletionBatch,
    Generation,
    PromptInputs,
    RewardOutput,
    SampledCompletions,
    SampledImages,
    SampledTrajectories,
    Video,
    VisualSample,
)

_CONTAINERS = (
    PromptInputs,
    CompletionBatch,
    RewardOutput,
    VisualSample,
    Video,
    SampledCompletions,
    SampledTrajectories,
    SampledImages,
    Generation,
)
_TYPES = {cls.__name__: cls for cls in _CONTAINERS}
"""The containers a pending rollout holds; checkpoints store them as plain data (they load with weights_only=True)."""

_RENAMED = {"CompletionBatch": {"group_size": "rows_per_prompt"}}
"""Fields renamed since a checkpoint may have stored them: container -> {old name: new name}."""


def to_plain(value: Any) -> Any:
    """``value`` as tensors, numbers, strings, lists and dicts only (what ``torch.load(weights_only=True)`` reads)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, Image.Image):
        return {"__type__": "Image", "mode": value.mode, "pixels": torch.from_numpy(np.array(value))}
    if isinstance(value, np.ndarray):
        return {"__type__": "ndarray", "data": torch.from_numpy(np.ascontiguousarray(value))}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"cannot store a dict with non-string keys in a checkpoint: {list(value)[:3]}")
        return {"__type__": "dict", "items": {k: to_plain(v) for k, v in value.items()}}
    if type(value).__name__ in _TYPES and dataclasses.is_dataclass(value):
        fields = {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__type__": type(value).__name__, "fields": fields}
    raise TypeError(f"cannot store a {type(value).__name__} of a pending rollout in a checkpoint")


def from_plain(value: Any) -> Any:
    """The inverse of :func:`to_plain` (tensors stay on the host)."""
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value["__type__"]
    if kind == "dict":
        return {k: from_plain(v) for k, v in value["items"].items()}
    if kind == "Image":
        return Image.fromarray(value["pixels"].numpy(), mode=value["mode"])
    if kind == "ndarray":
        return value["data"].numpy()
    renamed = _RENAMED.get(kind, {})
    return _TYPES[kind](**{renamed.get(k, k): from_plain(v) for k, v in value["fields"].items()})


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor it holds (in dicts, lists and the pipeline's containers) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and type(value).__name__ in _TYPES:
        return dataclasses.replace(
            value, **{f.name: to_device(getattr(value, f.name), device) for f in dataclasses.fields(value)}
        )
    return value

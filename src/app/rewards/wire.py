"""The reward server's wire format (:mod:`app.rewards.serve`, :class:`~app.rewards.remote.RemoteReward`): JSON over
HTTP, lossless for everything a reward reads.

``POST /score`` takes one batch, a JSON document (``Content-Type: application/json``)::

    {"version": 1,
     "reward": "accuracy",                  # which served reward scores it (null: the only one served)
     "group_size": 8,                       # K, or null
     "samples": [{"question": ..., "task": ..., "answer": ..., "reasoning": ..., "meta": {...},
                  "images": [<array>, ...]}, ...],       # the distinct prompts
     "rows": [{"sample": 0, "completion": <completion>}, ...]}   # one per completion, in order

A ``<completion>`` is ``{"text": "..."}`` for a VLM's text, or an ``<array>``: ``{"png": "<base64>"}`` for a PIL image
(mode and pixels kept), ``{"npy": "<base64>"}`` for a numpy array and ``{"pt": "<base64>"}`` for a tensor, which the
server hands the reward as a CPU tensor again (both ``numpy.save`` bytes: dtype, shape, memory order and every value
kept, so a diffusers decode in [0, 1] arrives bit for bit; a bfloat16 tensor travels as its exact float32 values).
Base64 inside JSON costs about 6 ms per MB each way, so :class:`RemoteReward` sends a framed body instead
(``Content-Type: application/x-reward-batch``, :func:`pack`): the magic ``RWB1``, then the JSON document and each
array's bytes, each preceded by its length as a little-endian uint64. In the document an array refers to its
attachment: ``{"pt": {"blob": 3, "dtype": "<f4", "shape": [3, 64, 64]}, "dims": [1, 2, 0]}`` (the raw C-order buffer
of the array in its memory order) or ``{"png": {"blob": 0}}``. The server reads both kinds of body.

Rows that answer the same prompt name the same sample, and the server gives them the same
:class:`~app.types.VisualSample` object, as the trainer does (group rewards find a group by it). ``meta`` must be
JSON: numbers, strings, booleans, null, lists and string-keyed objects (tuples travel as lists).

The answer to a scored batch::

    {"version": 1, "reward": "accuracy", "values": [1.0, 0.0, null, ...],
     "side_state": {"num_malformed": 2, "failed_checks/maze/path": 1}, "seconds": 0.004}

``values`` has one entry per row; ``null`` is a non-finite value the reward itself returned (NaN, inf), which the
client counts and replaces by 0 exactly as it would in-process; a bare ``NaN`` token is not JSON and is a malformed
answer. ``side_state`` is what the reward's :attr:`~app.rewards.RewardComponent.side_state` counters gained while
scoring this batch, flattened to ``name`` or ``name/key`` -> number. ``GET /info`` lists the served rewards
(``{"rewards": [{"name", "scope", "value_range", "side_state"}]}``, an unbounded end of a range as null) and ``GET /health`` answers ``{"ok": true}``.
An error is ``{"error": "<what is wrong>"}`` with status 400 (a malformed request), 401 (a missing or wrong token),
404 (an unknown reward or path), 413 (a body over the server's limit) or 500 (the reward raised).
"""

from __future__ import annotations

import base64
import io
import json
import math
import numbers
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from app.types import VisualSample

VERSION = 1
"""The wire format's version: requests and answers carry it; a server refuses another."""


class WireError(ValueError):
    """A request or an answer that does not follow the wire format; the message says which field and why."""


FRAMED_TYPE = "application/x-reward-batch"
"""The content type of a framed body (:func:`pack`)."""
_MAGIC = b"RWB1"
_LENGTH = struct.Struct("<Q")


class Blobs:
    """The binary attachments of a framed body: the arrays' bytes, referenced from the JSON as ``{"blob": i}`` (with
    ``dtype`` and ``shape`` for an array's raw buffer, read back without a copy)."""

    def __init__(self, parts: Sequence[bytes | bytearray | memoryview] = ()) -> None:
        self.parts = list(parts)

    def add(self, data: bytes | memoryview, **about: Any) -> dict[str, Any]:
        self.parts.append(data)
        return {"blob": len(self.parts) - 1, **about}

    def get(self, reference: Any, where: str) -> bytes | bytearray | memoryview:
        index = reference.get("blob") if isinstance(reference, Mapping) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.parts):
            raise WireError(f"{where}: blob must index the {len(self.parts)} attachments, got {_brief(reference)}")
        return self.parts[index]


def pack(document: Mapping[str, Any], blobs: Blobs) -> bytes:
    """A framed body: ``RWB1``, then the JSON document and every blob, each after its uint64 length."""
    head = json.dumps(document, allow_nan=False).encode()
    parts = [_MAGIC, _LENGTH.pack(len(head)), head]
    for blob in blobs.parts:
        parts += [_LENGTH.pack(len(blob)), blob]
    return b"".join(parts)


def unpack(body: bytes) -> tuple[Any, Blobs]:
    """The JSON document and the blobs of a framed body; a :class:`WireError` when it is truncated or not one."""
    if body[:4] != _MAGIC:
        raise WireError(f"a framed body starts with {_MAGIC!r}, this one with {bytes(body[:4])!r}")
    view, position, pieces = memoryview(body), 4, []
    while position < len(view):
        if position + 8 > len(view):
            raise WireError(f"the framed body is truncated at byte {position}")
        (length,) = _LENGTH.unpack_from(view, position)
        if position + 8 + length > len(view):
            raise WireError(f"the framed body is truncated: a part of {length} bytes at byte {position}")
        pieces.append(bytearray(view[position + 8 : position + 8 + length]))  # writable: arrays are read in place
        position += 8 + length
    if not pieces:
        raise WireError("the framed body holds no JSON document")
    try:
        document = json.loads(pieces[0])
    except (UnicodeDecodeError, ValueError) as error:
        raise WireError(f"the framed body's document is not JSON: {error}") from None
    return document, Blobs(pieces[1:])


# ---------------------------------------------------------------------------------------------------- arrays
ARRAY_KINDS = ("png", "npy", "pt")
"""How an array travels: a PIL image as PNG, a numpy array and a tensor as ``.npy`` bytes."""


def encode_array(value: Any, blobs: Blobs | None = None) -> dict[str, Any]:
    """A PIL image as PNG, a numpy array or a tensor as ``.npy`` bytes under its kind: base64, or a reference to
    their place in ``blobs`` when given. An array whose memory
    is laid out in another order than its dimensions (an ``[H, W, 3]`` image viewed as ``[3, H, W]``) is sent in its
    memory order with ``"dims"``, the permutation that restores its view: it comes back with the same strides, so
    reductions over it add in the same order and give the same bits."""
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return {"png": _payload(buffer.getvalue(), blobs)}
    kind = "npy"
    if isinstance(value, torch.Tensor):
        kind, value = "pt", value.detach().cpu()
        value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    if not isinstance(value, np.ndarray):
        raise WireError(f"cannot send a {type(value).__name__} as an array (a PIL image, a numpy array or a tensor)")
    if value.dtype == object:
        raise WireError("an object array cannot travel; send numbers")
    order = sorted(range(value.ndim), key=lambda d: -value.strides[d])  # outermost in memory first (stable)
    dense = value.transpose(order)
    dense = dense if dense.flags.c_contiguous else dense.copy(order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
    if blobs is not None:  # the raw buffer, described beside it
        encoded: dict[str, Any] = {
            kind: blobs.add(
                memoryview(dense.reshape(-1).view(np.uint8)), dtype=dense.dtype.str, shape=list(dense.shape)
            )
        }
    else:
        buffer = io.BytesIO()
        np.save(buffer, dense, allow_pickle=False)
        encoded = {kind: base64.b64encode(buffer.getvalue()).decode("ascii")}
    if order != list(range(value.ndim)):
        encoded["dims"] = order
    return encoded


def _payload(data: bytes, blobs: Blobs | None) -> str | dict[str, int]:
    return blobs.add(data) if blobs is not None else base64.b64encode(data).decode("ascii")


def _raw_array(raw: bytes | bytearray, about: Mapping[str, Any], where: str) -> np.ndarray:
    """The array of a raw buffer described by ``about`` (``dtype``, ``shape``), without a copy."""
    try:
        dtype = np.dtype(about["dtype"])
    except (TypeError, ValueError) as error:
        raise WireError(f"{where}: dtype {_brief(about['dtype'])} is not a numpy dtype ({error})") from None
    shape = about.get("shape")
    if (
        dtype.kind not in "biufc"
        or not isinstance(shape, list)
        or not all(isinstance(n, int) and n >= 0 for n in shape)
    ):
        raise WireError(f"{where}: a raw array needs a numeric dtype and a shape of sizes, got {_brief(dict(about))}")
    if math.prod(shape) * dtype.itemsize != len(raw):
        raise WireError(f"{where}: {len(raw)} bytes do not hold a {dtype} array of shape {shape}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def decode_array(value: Any, where: str, blobs: Blobs | None = None) -> Image.Image | np.ndarray | torch.Tensor:
    """The PIL image, numpy array or tensor of :func:`encode_array`'s object (its bytes in ``blobs`` when it refers
    to them); ``where`` names the field in errors."""
    kinds = set(ARRAY_KINDS) & set(value) if isinstance(value, Mapping) else set()
    if len(kinds) != 1 or set(value) - kinds - {"dims"}:
        raise WireError(f"{where}: expected one of {{'png' | 'npy' | 'pt': base64}}, got {_brief(value)}")
    (kind,) = kinds
    if isinstance(value[kind], Mapping):
        raw = (blobs or Blobs()).get(value[kind], where)
    else:
        try:
            raw = base64.b64decode(value[kind], validate=True)
        except (TypeError, ValueError) as error:
            raise WireError(f"{where}: {kind} data is not base64 ({error})") from None
    try:
        if kind == "png":
            with Image.open(io.BytesIO(raw)) as image:
                image.load()
                return image.copy()
        if isinstance(value[kind], Mapping) and "dtype" in value[kind]:
            array = _raw_array(raw, value[kind], where)
        else:
            array = np.load(io.BytesIO(raw), allow_pickle=False)
    except WireError:
        raise
    except Exception as error:  # PIL and numpy raise many kinds on corrupt bytes
        raise WireError(f"{where}: unreadable {kind} ({type(error).__name__}: {error})") from None
    order = value.get("dims", list(range(array.ndim)))
    if not isinstance(order, list) or sorted(order) != list(range(array.ndim)):
        raise WireError(f"{where}: dims must be a permutation of the {array.ndim} dimensions, got {_brief(order)}")
    array = array.transpose(np.argsort(order))
    return torch.from_numpy(array) if kind == "pt" else array


# ------------------------------------------------------------------------------------------------ the request
def encode_completion(completion: Any, blobs: Blobs | None = None) -> dict[str, Any]:
    if isinstance(completion, str):
        return {"text": completion}
    return encode_array(completion, blobs)


def decode_completion(value: Any, where: str, blobs: Blobs | None = None) -> str | Image.Image | np.ndarray:
    if isinstance(value, Mapping) and set(value) == {"text"}:
        if not isinstance(value["text"], str):
            raise WireError(f"{where}: text must be a string, got {_brief(value['text'])}")
        return value["text"]
    return decode_array(value, where, blobs)


def plain_json(value: Any, where: str) -> Any:
    """``value`` as JSON types (numpy scalars as numbers, tuples as lists), or a :class:`WireError` naming the field
    that is not JSON."""
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise WireError(f"{where}: key {key!r} is not a string")
            out[key] = plain_json(item, f"{where}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [plain_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise WireError(f"{where} is a {type(value).__name__}, which JSON cannot hold")


def encode_request(
    reward: str | None,
    completions: Sequence[Any],
    samples: Sequence[VisualSample],
    group_size: int | None,
    blobs: Blobs | None = None,
) -> dict[str, Any]:
    """The ``POST /score`` document of a batch; the distinct sample objects are sent once each. With ``blobs`` the
    arrays' bytes go there (a framed body, :func:`pack`), else inline as base64."""
    if len(completions) != len(samples):
        raise WireError(f"{len(completions)} completions but {len(samples)} samples")
    index: dict[int, int] = {}
    distinct: list[dict[str, Any]] = []
    rows = []
    for i, (completion, sample) in enumerate(zip(completions, samples, strict=True)):
        if id(sample) not in index:
            index[id(sample)] = len(distinct)
            distinct.append(_encode_sample(sample, f"samples[{i}]", blobs))
        rows.append({"sample": index[id(sample)], "completion": encode_completion(completion, blobs)})
    return {"version": VERSION, "reward": reward, "group_size": group_size, "samples": distinct, "rows": rows}


def _encode_sample(sample: VisualSample, where: str, blobs: Blobs | None) -> dict[str, Any]:
    return {
        "question": sample.question,
        "task": sample.task,
        "answer": sample.answer,
        "reasoning": sample.reasoning,
        "meta": plain_json(sample.meta, f"{where}.meta"),
        "images": [encode_array(image, blobs) for image in sample.images],
    }


def decode_request(
    body: Any, blobs: Blobs | None = None
) -> tuple[str | None, list[Any], list[VisualSample], int | None]:
    """``(reward, completions, samples, group_size)`` of a ``POST /score`` document (and the blobs of its framed
    body); one sample object per distinct prompt, repeated for its rows."""
    if not isinstance(body, Mapping):
        raise WireError(f"the request must be a JSON object, got {_brief(body)}")
    if body.get("version") != VERSION:
        raise WireError(f"version must be {VERSION}, got {_brief(body.get('version'))}")
    reward, group_size = body.get("reward"), body.get("group_size")
    if reward is not None and not isinstance(reward, str):
        raise WireError(f"reward must be a name or null, got {_brief(reward)}")
    if group_size is not None and (not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1):
        raise WireError(f"group_size must be a positive integer or null, got {_brief(group_size)}")
    raw_samples, raw_rows = body.get("samples"), body.get("rows")
    if not isinstance(raw_samples, list) or not isinstance(raw_rows, list):
        raise WireError("samples and rows must be lists")
    samples = [_decode_sample(s, f"samples[{i}]", blobs) for i, s in enumerate(raw_samples)]
    completions, row_samples = [], []
    for i, row in enumerate(raw_rows):
        if not isinstance(row, Mapping) or set(row) != {"sample", "completion"}:
            raise WireError(f"rows[{i}] must be {{'sample': index, 'completion': ...}}, got {_brief(row)}")
        which = row["sample"]
        if not isinstance(which, int) or isinstance(which, bool) or not 0 <= which < len(samples):
            raise WireError(f"rows[{i}].sample must index samples (0..{len(samples) - 1}), got {_brief(which)}")
        completions.append(decode_completion(row["completion"], f"rows[{i}].completion", blobs))
        row_samples.append(samples[which])
    return reward, completions, row_samples, group_size


def _decode_sample(value: Any, where: str, blobs: Blobs | None) -> VisualSample:
    if not isinstance(value, Mapping):
        raise WireError(f"{where} must be an object, got {_brief(value)}")
    for key in ("question", "task"):
        if not isinstance(value.get(key), str):
            raise WireError(f"{where}.{key} must be a string, got {_brief(value.get(key))}")
    for key in ("answer", "reasoning"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise WireError(f"{where}.{key} must be a string or null, got {_brief(value[key])}")
    meta, images = value.get("meta", {}), value.get("images", [])
    if not isinstance(meta, Mapping) or not isinstance(images, list):
        raise WireError(f"{where}: meta must be an object and images a list")
    decoded = [decode_array(image, f"{where}.images[{j}]", blobs) for j, image in enumerate(images)]
    if not all(isinstance(image, Image.Image) for image in decoded):
        raise WireError(f"{where}.images must be PNG images")
    return VisualSample(
        images=decoded,
        question=value["question"],
        task=value["task"],
        answer=value.get("answer"),
        reasoning=value.get("reasoning"),
        meta=dict(meta),
    )


# ------------------------------------------------------------------------------------------------- the answer
def encode_values(values: torch.Tensor) -> list[float | None]:
    """Scores as JSON numbers, a non-finite one as null."""
    return [v if math.isfinite(v) else None for v in values.detach().double().cpu().tolist()]


def decode_values(values: Any, num_rows: int) -> torch.Tensor:
    """``[num_rows]`` float32 of an answer's ``values`` (null -> NaN); a :class:`WireError` when it has the wrong
    length or holds anything but numbers and nulls (a bare NaN or Infinity token included)."""
    if not isinstance(values, list):
        raise WireError(f"values must be a list, got {_brief(values)}")
    if len(values) != num_rows:
        raise WireError(f"the answer has {len(values)} values for {num_rows} completions")
    out = []
    for i, value in enumerate(values):
        if value is None:
            out.append(math.nan)
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out.append(float(value))
        else:
            raise WireError(f"values[{i}] is {_brief(value)}, not a finite number or null")
    return torch.tensor(out, dtype=torch.float32)


def flatten_side_state(delta: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """A :meth:`~app.rewards.RewardComponent.side_state_delta` as ``attribute`` or ``attribute/key`` -> number
    (a nested reward's counters under its module path, ``path.attribute``); tuple keys are joined with ``/``."""
    flat: dict[str, float] = {}
    for path, counters in delta.items():
        for name, increment in counters.items():
            stem = f"{path}.{name}" if path else name
            if isinstance(increment, Mapping):
                for key, count in increment.items():
                    key = "/".join(map(str, key)) if isinstance(key, tuple) else str(key)
                    flat[f"{stem}/{key}"] = float(count)
            elif isinstance(increment, torch.Tensor):
                flat[stem] = float(increment.sum())
            else:
                flat[stem] = float(increment)
    return {key: count for key, count in flat.items() if count}


def decode_side_state(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in value.items()
    ):
        raise WireError(f"side_state must map names to finite numbers, got {_brief(value)}")
    return {key: float(count) for key, count in value.items()}


def _brief(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

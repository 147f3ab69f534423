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
attachment: ``{"pt": {"blob": 3, "dtype": "<f4", "shape": [64, 64, 3]}, "dims": [1, 2, 0]}`` (the raw C-order buffer
of the array in its memory order) or ``{"png": {"blob": 0}}``. ``dims`` lists the view's axes in memory order
(outermost first): the buffer holds the view transposed by ``dims``, and the receiver applies the inverse
permutation, so the example is an ``[H, W, 3]`` buffer that arrives as its ``[3, H, W]`` view. The server reads both
kinds of body. docs/wire_spec.md is the versioned specification: every field, status and limit.

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
(``{"version", "limits", "rewards": [{"name", "scope", "value_range", "side_state", "completions"}]}``, an
unbounded end of a range as null) and ``GET /health`` answers ``{"ok": true}``. An error is ``{"error": "<what is
wrong>"}``: 400 a malformed request, 401 a missing or wrong token, 404 an unknown reward or path, 408 a request
slower than the server's timeout, 411 no Content-Length, 413 a body or its decoded arrays over the server's limits,
500 the reward raised, 501 an unsupported method.
"""

from __future__ import annotations

import base64
import io
import json
import math
import numbers
import re
import reprlib
import struct
import zlib
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


class RequestTooLarge(WireError):
    """A request whose arrays would decode to more bytes than its :class:`DecodeBudget` (answered 413)."""


class DecodeBudget:
    """The bytes a request's arrays may decode to, all together; each array is charged from what its header declares
    (a PNG's ``width x height x channels x bytes per channel``, an array's ``elements x itemsize``) before it is
    decoded, so a small body declaring a huge image costs nothing."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def charge(self, num_bytes: int, what: str, where: str) -> None:
        self.used += num_bytes
        if self.used > self.limit:
            raise RequestTooLarge(
                f"{where}: {what} brings the request's decoded arrays to {self.used} bytes, over this request's "
                f"limit of {self.limit}"
            )


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
    return parse_json(pieces[0], "the framed body's document"), Blobs(pieces[1:])


def parse_json(data: bytes | bytearray, what: str) -> Any:
    """The JSON of ``data``; a :class:`WireError` naming ``what`` when it is not JSON or nests deeper than Python's
    recursion limit."""
    try:
        return json.loads(data)
    except RecursionError:
        raise WireError(f"{what} is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise WireError(f"{what} is not JSON: {error}") from None


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


_DTYPE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # IHDR colour type -> channels (3: palette indices)


def _number_dtype(value: Any, where: str) -> np.dtype:
    """The numpy dtype of a type string such as ``<f4`` or ``|u1``: numbers only, little-endian (or one byte)."""
    if not isinstance(value, str | np.dtype) or (isinstance(value, str) and not _DTYPE.fullmatch(value)):
        raise WireError(f"{where}: dtype {_brief(value)} is not a number type such as '<f4' or '|u1'")
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError) as error:
        raise WireError(f"{where}: dtype {_brief(value)} is not a numpy dtype ({error})") from None
    if dtype.kind not in "biufc":
        raise WireError(f"{where}: dtype {dtype.str!r} is not a number type such as '<f4' or '|u1'")
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
        raise WireError(f"{where}: dtype {dtype.str!r} is big-endian: send little-endian ('<')")
    return dtype


def _raw_array(raw: bytes | bytearray, about: Mapping[str, Any], where: str, budget: DecodeBudget | None) -> np.ndarray:
    """The array of a raw buffer described by ``about`` (``dtype``, ``shape``), without a copy."""
    dtype = _number_dtype(about.get("dtype"), where)
    shape = about.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise WireError(f"{where}: a raw array needs a numeric dtype and a shape of sizes, got {_brief(dict(about))}")
    if budget is not None:
        budget.charge(
            math.prod(shape) * dtype.itemsize, f"an array of {math.prod(shape) * dtype.itemsize} bytes", where
        )
    if math.prod(shape) * dtype.itemsize != len(raw):
        raise WireError(f"{where}: {len(raw)} bytes do not hold a {dtype} array of shape {shape}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _npy_array(raw: bytes | bytearray, where: str, budget: DecodeBudget | None) -> np.ndarray:
    """The array of ``numpy.save`` bytes, its header checked (a number dtype, the decoded size) before its data is
    read."""
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise ValueError(f"npy version {version[0]}.{version[1]} (1.0 or 2.0 travel)")
        shape, _, dtype = read_header[version](stream)
    except (ValueError, SyntaxError, TypeError) as error:
        raise WireError(f"{where}: unreadable npy ({type(error).__name__}: {error})") from None
    dtype = _number_dtype(dtype, where)
    if budget is not None:
        budget.charge(
            math.prod(shape) * dtype.itemsize, f"an array of {math.prod(shape) * dtype.itemsize} bytes", where
        )
    return np.load(io.BytesIO(raw), allow_pickle=False)


def png_size(raw: bytes | bytearray | memoryview, where: str) -> tuple[int, int, int, int]:
    """``(width, height, channels, bytes per channel)`` that a PNG's header (its IHDR chunk) declares; a
    :class:`WireError` when the bytes are not a PNG."""
    head = bytes(raw[:33])
    if len(head) < 33 or head[:8] != _PNG_SIGNATURE or head[12:16] != b"IHDR":
        raise WireError(f"{where}: png data is not a PNG (it must start with the PNG signature and IHDR)")
    width, height, bit_depth, colour_type = struct.unpack(">IIBB", head[16:26])
    if zlib.crc32(head[12:29]) != struct.unpack(">I", head[29:33])[0] or colour_type not in _PNG_CHANNELS:
        raise WireError(f"{where}: png data has a corrupt IHDR chunk")
    return width, height, _PNG_CHANNELS[colour_type], 2 if bit_depth == 16 else 1


def _png_image(raw: bytes | bytearray | memoryview, where: str, budget: DecodeBudget | None) -> Image.Image:
    width, height, channels, depth = png_size(raw, where)
    if budget is not None:
        size = f"{width} x {height} x {channels}" + (" x 2" if depth == 2 else "")
        budget.charge(width * height * channels * depth, f"a PNG of {size} bytes", where)
    image = Image.open(io.BytesIO(raw), formats=["PNG"])
    image.load()  # decoded now, in memory: the BytesIO is no longer read
    return image


def decode_array(
    value: Any, where: str, blobs: Blobs | None = None, budget: DecodeBudget | None = None
) -> Image.Image | np.ndarray | torch.Tensor:
    """The PIL image, numpy array or tensor of :func:`encode_array`'s object (its bytes in ``blobs`` when it refers
    to them); ``where`` names the field in errors. ``budget`` is charged with what the array declares before it is
    decoded (:class:`RequestTooLarge` past it)."""
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
            return _png_image(raw, where, budget)
        if isinstance(value[kind], Mapping) and "dtype" in value[kind]:
            array = _raw_array(raw, value[kind], where, budget)
        else:
            array = _npy_array(raw, where, budget)
        order = value.get("dims", list(range(array.ndim)))
        if (
            not isinstance(order, list)
            or not all(type(d) is int for d in order)
            or sorted(order) != [*range(array.ndim)]
        ):
            raise WireError(f"{where}: dims must be a permutation of the {array.ndim} dimensions, got {_brief(order)}")
        array = array.transpose(np.argsort(order))  # the inverse of dims: the view the sender had
        return torch.from_numpy(array) if kind == "pt" else array
    except WireError:
        raise
    except Exception as error:  # PIL, numpy and torch raise many kinds on corrupt bytes
        raise WireError(f"{where}: unreadable {kind} ({type(error).__name__}: {error})") from None


# ------------------------------------------------------------------------------------------------ the request
def encode_completion(completion: Any, blobs: Blobs | None = None) -> dict[str, Any]:
    if isinstance(completion, str):
        return {"text": completion}
    return encode_array(completion, blobs)


def decode_completion(
    value: Any, where: str, blobs: Blobs | None = None, budget: DecodeBudget | None = None
) -> str | Image.Image | np.ndarray:
    if isinstance(value, Mapping) and set(value) == {"text"}:
        if not isinstance(value["text"], str):
            raise WireError(f"{where}: text must be a string, got {_brief(value['text'])}")
        return value["text"]
    return decode_array(value, where, blobs, budget)


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


REQUEST_FIELDS = ("version", "reward", "group_size", "samples", "rows")
SAMPLE_FIELDS = ("question", "task", "answer", "reasoning", "meta", "images")


def _known_fields(value: Mapping[str, Any], fields: Sequence[str], where: str) -> None:
    unknown = sorted(str(key) for key in value if key not in fields)
    if unknown:
        raise WireError(f"{where}: unknown field(s) {_brief(unknown)}; the fields are {list(fields)}")


def decode_request(
    body: Any, blobs: Blobs | None = None, max_decoded_bytes: int | None = None
) -> tuple[str | None, list[Any], list[VisualSample], int | None]:
    """``(reward, completions, samples, group_size)`` of a ``POST /score`` document (and the blobs of its framed
    body); one sample object per distinct prompt, repeated for its rows. ``max_decoded_bytes`` bounds what the
    request's arrays decode to, all together (:class:`RequestTooLarge`), checked from their headers before decoding."""
    if not isinstance(body, Mapping):
        raise WireError(f"the request must be a JSON object, got {_brief(body)}")
    _known_fields(body, REQUEST_FIELDS, "the request")
    if body.get("version") != VERSION or isinstance(body.get("version"), bool):
        raise WireError(f"version must be {VERSION}, got {_brief(body.get('version'))}")
    reward, group_size = body.get("reward"), body.get("group_size")
    if reward is not None and not isinstance(reward, str):
        raise WireError(f"reward must be a name or null, got {_brief(reward)}")
    if group_size is not None and (not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1):
        raise WireError(f"group_size must be a positive integer or null, got {_brief(group_size)}")
    raw_samples, raw_rows = body.get("samples"), body.get("rows")
    for key, value in (("samples", raw_samples), ("rows", raw_rows)):
        if not isinstance(value, list):
            raise WireError(f"{key} must be a list, got {_brief(value)}")
    budget = DecodeBudget(max_decoded_bytes) if max_decoded_bytes is not None else None
    samples = [_decode_sample(s, f"samples[{i}]", blobs, budget) for i, s in enumerate(raw_samples)]
    completions, row_samples = [], []
    for i, row in enumerate(raw_rows):
        if not isinstance(row, Mapping) or set(row) != {"sample", "completion"}:
            raise WireError(f"rows[{i}] must be {{'sample': index, 'completion': ...}}, got {_brief(row)}")
        which = row["sample"]
        if not isinstance(which, int) or isinstance(which, bool) or not 0 <= which < len(samples):
            raise WireError(f"rows[{i}].sample must index samples (0..{len(samples) - 1}), got {_brief(which)}")
        completions.append(decode_completion(row["completion"], f"rows[{i}].completion", blobs, budget))
        row_samples.append(samples[which])
    return reward, completions, row_samples, group_size


def _decode_sample(value: Any, where: str, blobs: Blobs | None, budget: DecodeBudget | None) -> VisualSample:
    if not isinstance(value, Mapping):
        raise WireError(f"{where} must be an object, got {_brief(value)}")
    _known_fields(value, SAMPLE_FIELDS, where)
    for key in ("question", "task"):
        if not isinstance(value.get(key), str):
            raise WireError(f"{where}.{key} must be a string, got {_brief(value.get(key))}")
    for key in ("answer", "reasoning"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise WireError(f"{where}.{key} must be a string or null, got {_brief(value[key])}")
    meta, images = value.get("meta", {}), value.get("images", [])
    if not isinstance(meta, Mapping) or not isinstance(images, list):
        raise WireError(f"{where}: meta must be an object and images a list")
    for j, image in enumerate(images):
        if not (isinstance(image, Mapping) and set(image) == {"png"}):
            raise WireError(f"{where}.images[{j}] must be a PNG image ({{'png': ...}}), got {_brief(image)}")
    decoded = [decode_array(image, f"{where}.images[{j}]", blobs, budget) for j, image in enumerate(images)]
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


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxdict, _BRIEF.maxlist, _BRIEF.maxstring, _BRIEF.maxother = 3, 4, 6, 60, 60


def _brief(value: Any, limit: int = 80) -> str:
    """A short repr of untrusted input: bounded in cost whatever its size or depth."""
    text = _BRIEF.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

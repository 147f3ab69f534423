"""WebDataset shards of ``VisualSample``: the on-disk sample schema, writing, reading and URL expansion.

One tar member group per sample, all named ``<key>.<suffix>``:

- ``__key__``: ``{prefix}-{index:09d}``, unique within a shard set and deterministic (the index counts samples in the
  order they were written).
- ``<key>.json``: a UTF-8 JSON object::

      {"schema": 1, "task": str, "question": str, "answer": str, "reasoning": str, "meta": {...}, "num_images": int}

  and, for a sample with videos, ``"schema": 2`` and ``"videos": [{"fps": float}, ...]``, one entry per video.

  ``answer`` and ``reasoning`` are absent when the sample has none (or when labels are stripped). ``meta`` holds the
  question parameters, the scene metadata augmentations need, and the ground-truth fields verifiers read; label-bearing
  meta goes under the names in ``LABEL_META_KEYS``. Tuples come back as lists and numpy values as Python numbers.
- ``<key>.img0.png``, ``<key>.img1.png``, ...: ``num_images`` PNG images, RGB (other modes are converted on write,
  dropping alpha).
- ``<key>.vid0.npy``, ``<key>.vid1.npy``, ... (schema 2): each video's frames, a NumPy ``.npy`` uint8 array
  ``[F, H, W, 3]`` (read without pickle); the frames are stored as sampled, exactly, at the ``fps`` of its entry.

Schema versions: 1 holds images only; 2 adds ``videos``. A sample is written with the oldest schema that holds it (a
sample without videos is a schema 1 record, as before videos existed), and readers read every version up to
``SCHEMA_VERSION``: shards written before videos read as samples without videos.

A record is valid when ``task`` and ``question`` are strings, ``answer`` and ``reasoning`` are strings or absent,
``meta`` is an object, the ``img{i}.png`` members are exactly ``img0.png`` ... ``img{num_images - 1}.png``
(``num_images`` 0 with no image member is a prompt-only sample, as text-to-image training reads), and the
``vid{i}.npy`` members are exactly one per entry of ``videos`` (none in schema 1); readers refuse anything else, naming
the key and the field (:func:`decode_sample`).

Shards are read with :func:`tar_members`, which notices what Python's ``tarfile`` passes over in silence: a corrupt
member header in the middle of a shard (tarfile stops there as if at the end of the archive) and a shard cut short at a
member boundary (no end-of-archive marker). It skips an unreadable region and resynchronises at the next valid member
header, so only the members stored in the region are lost, and it reports each damage with the byte range and the
members on either side of it.

Label-free shards (``strip_labels=True``) carry no answers at all: no ``answer``, no ``reasoning`` and none of the
``LABEL_META_KEYS`` among the top-level keys of ``meta`` (nested dicts are not searched: generators keep labels at
the top level). A reader that sees a ``schema`` newer than ``SCHEMA_VERSION`` refuses the sample.

>>> from PIL import Image
>>> sample = VisualSample([Image.new("RGB", (8, 8))], "Is the red dot left of the blue dot?", "dots_left_of", "yes")
>>> record = encode_sample(sample, "dots-000000000")
>>> sorted(record)
['__key__', 'img0.png', 'json']
>>> decode_sample(record).answer == sample.answer
True
"""

from __future__ import annotations

import dataclasses
import glob
import io
import json
import logging
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import braceexpand
import numpy as np
import webdataset as wds
from PIL import Image
from webdataset.tariterators import group_by_keys

from app.types import Video, VisualSample

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
VIDEO_SCHEMA = 2
"""The first schema with videos."""

LABEL_META_KEYS: tuple[str, ...] = (
    "answer",
    "answers",
    "attributes",
    "ground_truth",
    "label",
    "labels",
    "pair_answers",
    "solution",
    "target",
)
"""Meta keys that carry labels; generators put anything that reveals an answer under one of these names.

``attributes`` is here because attribute values (counts, colours) answer attribute questions directly; scene geometry
that augmentations need (positions, boxes) stays.
"""

_PREFIX = re.compile(r"^[A-Za-z0-9_-]+$")
_IMAGE_MEMBER = re.compile(r"img(\d+)\.png")
_VIDEO_MEMBER = re.compile(r"vid(\d+)\.npy")
_META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's metadata members (``__key__`` files), never sample data
_REMOTE = ("pipe:", "http://", "https://", "gs://", "s3://")
_GLOB_CHARS = re.compile(r"[*?\[]")


def image_name(index: int) -> str:
    """The tar member suffix of image ``index``: ``img0.png``, ``img1.png``, ..."""
    return f"img{index}.png"


def video_name(index: int) -> str:
    """The tar member suffix of video ``index``: ``vid0.npy``, ``vid1.npy``, ..."""
    return f"vid{index}.npy"


def _npy(frames: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(frames), allow_pickle=False)
    return buffer.getvalue()


def without_labels(sample: VisualSample) -> VisualSample:
    """A copy of ``sample`` with no answer, no reasoning and none of the ``LABEL_META_KEYS`` in ``meta``."""
    meta = {k: v for k, v in sample.meta.items() if k not in LABEL_META_KEYS}
    return dataclasses.replace(sample, answer=None, reasoning=None, meta=meta)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays, torch tensors
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _png(image: Image.Image) -> bytes:
    if image.mode != "RGB":
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def encode_sample(sample: VisualSample, key: str) -> dict[str, Any]:
    """The WebDataset record of ``sample`` under ``key`` (``__key__``, ``json`` bytes, ``img{i}.png`` bytes)."""
    if not key or "." in key or "/" in key:
        raise ValueError(f"sample key must be non-empty without '.' or '/', got {key!r}")
    schema = VIDEO_SCHEMA if sample.videos else 1  # the oldest schema that holds the sample
    record: dict[str, Any] = {"schema": schema, "task": sample.task, "question": sample.question}
    if sample.answer is not None:
        record["answer"] = sample.answer
    if sample.reasoning is not None:
        record["reasoning"] = sample.reasoning
    record["meta"] = sample.meta
    record["num_images"] = len(sample.images)
    if sample.videos:
        record["videos"] = [{"fps": float(video.fps)} for video in sample.videos]
    try:
        payload = json.dumps(record, default=_json_default, ensure_ascii=False).encode()
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"sample {key!r}: cannot encode its JSON record ({err}); meta must be JSON-serialisable"
        ) from err
    out: dict[str, Any] = {"__key__": key, "json": payload}
    for i, image in enumerate(sample.images):
        out[image_name(i)] = _png(image)
    for i, video in enumerate(sample.videos):
        out[video_name(i)] = _npy(video.frames)
    return out


def _decode_image(key: str, name: str, value: Any) -> Image.Image:
    if isinstance(value, Image.Image):
        return value if value.mode == "RGB" else value.convert("RGB")
    try:
        image = Image.open(io.BytesIO(value))
        image.load()  # decode now, so a corrupt PNG fails here and not in a model's processor
    except Exception as err:
        raise ValueError(f"sample {key!r}: cannot decode image {name!r}: {err}") from err
    return image if image.mode == "RGB" else image.convert("RGB")


def _decode_video(key: str, name: str, value: Any, fps: Any) -> Video:
    """A video member: an ``.npy`` uint8 array (as bytes, read without pickle, or already decoded) at ``fps``."""
    try:
        frames = value if isinstance(value, np.ndarray) else np.load(io.BytesIO(value), allow_pickle=False)
        return Video(frames, fps=fps)
    except Exception as err:  # noqa: BLE001 - any failure to read the member is a bad video
        raise ValueError(f"sample {key!r}: cannot decode video {name!r}: {err}") from None


def _video_entries(key: str, record: dict[str, Any], schema: int) -> list[Any]:
    """The ``fps`` of each video of a record: none before :data:`VIDEO_SCHEMA`."""
    if schema < VIDEO_SCHEMA:
        return []
    entries = record.get("videos", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"sample {key!r}: JSON field 'videos' must be a list of objects, got {str(entries)[:80]}")
    fps = [entry.get("fps") for entry in entries]
    if not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in fps):
        raise ValueError(f"sample {key!r}: each entry of 'videos' needs an 'fps' > 0, got {str(entries)[:80]}")
    return fps


def _decode_record(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        record = json.loads(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"sample {key!r}: member 'json' is not valid JSON: {err}") from err
    if not isinstance(record, dict):
        raise ValueError(f"sample {key!r}: member 'json' must hold an object, got {type(record).__name__}")
    return record


def decode_sample(wds_sample: dict[str, Any]) -> VisualSample:
    """The ``VisualSample`` of a WebDataset record (raw bytes or already-decoded values).

    Raises:
        ValueError: naming the key and the problem, when the JSON member or an image is missing or undecodable, or a
            field of the record is missing or has the wrong type.
    """
    key = wds_sample.get("__key__", "<no key>")
    if "json" not in wds_sample:
        raise ValueError(
            f"sample {key!r}: missing 'json' member (has {sorted(k for k in wds_sample if k[:2] != '__')})"
        )
    record = _decode_record(key, wds_sample["json"])
    schema = record.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema > SCHEMA_VERSION:
        raise ValueError(f"sample {key!r}: unsupported schema {schema!r} (this reader knows up to {SCHEMA_VERSION})")
    for field in ("task", "question"):
        if not isinstance(record.get(field), str):
            raise ValueError(f"sample {key!r}: JSON field {field!r} missing or not a string")
    for field in ("answer", "reasoning"):  # optional: absent (or null) when the sample has none
        if record.get(field) is not None and not isinstance(record[field], str):
            raise ValueError(
                f"sample {key!r}: JSON field {field!r} must be a string, got {type(record[field]).__name__} "
                f"{record[field]!r:.80}"
            )
    num_images = record.get("num_images")
    if not isinstance(num_images, int) or isinstance(num_images, bool) or num_images < 0:
        raise ValueError(f"sample {key!r}: JSON field 'num_images' must be a non-negative int, got {num_images!r}")
    meta = record.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError(f"sample {key!r}: JSON field 'meta' must be an object, got {type(meta).__name__}")
    expected = [image_name(i) for i in range(num_images)]
    extra = sorted(k for k in wds_sample if _IMAGE_MEMBER.fullmatch(k) and k not in expected)
    if extra:
        raise ValueError(
            f"sample {key!r}: image members {extra} beyond num_images={num_images} (the record and its images disagree)"
        )
    images = []
    for name in expected:
        if name not in wds_sample:
            raise ValueError(f"sample {key!r}: missing image {name!r} (num_images={num_images})")
        images.append(_decode_image(key, name, wds_sample[name]))
    fps = _video_entries(key, record, schema)
    expected_videos = [video_name(i) for i in range(len(fps))]
    extra = sorted(k for k in wds_sample if _VIDEO_MEMBER.fullmatch(k) and k not in expected_videos)
    if extra:
        raise ValueError(f"sample {key!r}: video members {extra} beyond the {len(fps)} videos of its record")
    videos = []
    for name, rate in zip(expected_videos, fps, strict=True):
        if name not in wds_sample:
            raise ValueError(f"sample {key!r}: missing video {name!r} ({len(fps)} videos)")
        videos.append(_decode_video(key, name, wds_sample[name], rate))
    return VisualSample(
        images=images,
        question=record["question"],
        task=record["task"],
        answer=record.get("answer"),
        reasoning=record.get("reasoning"),
        meta=meta,
        videos=videos,
    )


def write_samples(
    samples: Iterable[VisualSample],
    out_dir: str | Path,
    prefix: str,
    max_per_shard: int = 1000,
    strip_labels: bool = False,
    progress: bool = False,
    total: int | None = None,
    max_shard_bytes: int | None = None,
) -> list[Path]:
    """Write ``samples`` to ``{out_dir}/{prefix}-000000.tar``, ... and return the shard paths, in order.

    Shards of an earlier run with the same prefix that this run does not overwrite are removed, so the directory holds
    exactly this shard set. Writing no samples writes no shard (and logs a warning).

    Args:
        samples: the samples, written in order; keys are ``{prefix}-{index:09d}``.
        out_dir: created if missing.
        prefix: shard and key prefix: letters, digits, ``_`` and ``-`` only.
        max_per_shard: samples per shard.
        max_shard_bytes: a shard is closed once its files hold this many bytes (so it may pass them by one sample;
            tar headers, 512 bytes a file, come on top); None: no byte limit.
        strip_labels: write label-free shards (see :func:`without_labels`).
        progress: show a tqdm progress bar.
        total: number of samples, for the progress bar.
    """
    if not _PREFIX.match(prefix):
        raise ValueError(f"prefix must hold only letters, digits, '_' and '-', got {prefix!r}")
    if max_per_shard < 1:
        raise ValueError(f"max_per_shard must be >= 1, got {max_per_shard}")
    if max_shard_bytes is not None and max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if progress:
        from tqdm import tqdm

        samples = tqdm(samples, total=total, desc=prefix, unit="sample")
    writer = None
    count = 0
    written: list[Path] = []
    try:
        for sample in samples:
            if writer is None:  # opened lazily, so that no samples means no (empty) shard
                pattern = str(out_dir / f"{prefix}-%06d.tar")
                # A fixed mtime makes shards byte-identical across rebuilds of the same samples.
                writer = wds.ShardWriter(
                    pattern,
                    maxcount=max_per_shard,
                    maxsize=max_shard_bytes or float("inf"),
                    post=lambda name: written.append(Path(name)),
                    verbose=0,
                    mtime=0.0,
                )
            if strip_labels:
                sample = without_labels(sample)
            writer.write(encode_sample(sample, f"{prefix}-{count:09d}"))
            count += 1
    finally:
        if writer is not None:
            writer.close()
    for stale in sorted(set(out_dir.glob(f"{prefix}-[0-9][0-9][0-9][0-9][0-9][0-9].tar")) - set(written)):
        log.info("removing stale shard %s from an earlier run", stale)
        stale.unlink()
    if count == 0:
        log.warning("write_samples(prefix=%r): no samples, no shard written", prefix)
    return written


class ShardDamageError(tarfile.ReadError):
    """A shard holds data that is no tar member (a corrupt header, a hole) or was cut short; the message says where."""


class _CheckedTarInfo(tarfile.TarInfo):
    """Tells its :class:`_CheckedTarFile` what each header block it fails to read held."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if not isinstance(tar, _CheckedTarFile) or tar.in_header:  # the member header after an extended one
            return super().fromtarfile(tar)
        tar.in_header = True
        try:
            return super().fromtarfile(tar)
        except tarfile.EOFHeaderError:
            tar.saw_zeros = True
            raise
        except tarfile.InvalidHeaderError:
            tar.saw_unreadable = True
            raise
        except tarfile.SubsequentHeaderError as err:
            # A valid extended (pax / GNU long name) header whose member header is corrupt or missing: tarfile would
            # stop with a ReadError. Scan on from where reading stopped instead (tarfile adds one block to `offset`).
            tar.saw_unreadable = True
            tar.offset = tar.fileobj.tell() - tarfile.BLOCKSIZE
            raise tarfile.InvalidHeaderError(str(err)) from None
        finally:
            tar.in_header = False


class _CheckedTarFile(tarfile.TarFile):
    """``tarfile`` reading with ``ignore_zeros``: it skips blocks that are no header, one at a time, up to the next
    valid header (its resynchronisation for concatenated or damaged archives), while :class:`_CheckedTarInfo` records
    what it skipped."""

    tarinfo = _CheckedTarInfo
    in_header = False
    saw_zeros = False  # zero blocks since the last member (the end-of-archive marker, or a hole)
    saw_unreadable = False  # non-zero blocks that are no header since the last member


def _gap_message(start: int, end: int, where: str, unreadable: bool) -> str:
    if unreadable:
        return (
            f"skipped {end - start} bytes at offset {start} {where} that hold no valid member header (a corrupt "
            "header); any members stored there are lost"
        )
    return (
        f"skipped {end - start} bytes of zero blocks at offset {start} {where} (a hole, or concatenated archives); "
        "any members stored there are lost"
    )


def tar_members(fileobj: Any, on_damage: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """``{"fname", "data"}`` of the regular members of a tar stream, in stored order, past damage.

    Reads with ``tarfile`` in stream mode (compressed tars too), as webdataset does, but where tarfile would end in
    silence it goes on and reports: data that is no valid member header (a corrupt header: the members stored there
    are lost, reading resumes at the next valid header), zero blocks between members, and a missing end-of-archive
    marker (the shard was cut short: whatever followed is lost). A stream with no valid member header at all is not a
    tar: ``tarfile.ReadError``.

    Args:
        fileobj: the open shard (a binary stream; read to its end).
        on_damage: called with a message per damage (byte range, members on either side, what is lost); None raises
            :class:`ShardDamageError` instead.
    """

    def report(message: str) -> None:
        if on_damage is None:
            raise ShardDamageError(message)
        on_damage(message)

    tar = _CheckedTarFile.open(fileobj=fileobj, mode="r|*", ignore_zeros=True)
    try:
        expected, previous = 0, None  # where the next header should start; the last member read
        for info in tar:
            if info.offset > expected:
                where = f"between {previous!r} and {info.name!r}" if previous else f"before {info.name!r}"
                report(_gap_message(expected, info.offset, where, tar.saw_unreadable))
            tar.saw_zeros = tar.saw_unreadable = False
            expected, previous = tar.offset, info.name
            if info.isreg() and not _META_MEMBER.match(info.name):
                yield {"fname": info.name, "data": tar.extractfile(info).read()}
            tar.members = []  # stream mode keeps every TarInfo otherwise
        if previous is None and tar.saw_unreadable:
            raise tarfile.ReadError(f"not a tar archive: no valid member header in its {tar.fileobj.tell()} bytes")
        where = f"after {previous!r}" if previous else "at the start"
        if tar.saw_unreadable:
            report(_gap_message(expected, tar.offset, where, unreadable=True))
        elif not tar.saw_zeros:
            report(
                f"no end-of-archive marker {where} (offset {expected}): the shard was cut short; any members after it "
                "are lost"
            )
    finally:
        tar.close()


def read_records(urls: str | list[str]) -> Iterator[dict[str, Any]]:
    """The raw records of the shards ``urls`` (see :func:`expand_urls`): ``__key__``, ``__url__`` and the bytes of each
    member, in stored order.

    Raises:
        ShardDamageError: naming the shard, where one is damaged (see :func:`tar_members`).
    """
    for url in expand_urls(urls):
        with wds.gopen(url) as stream:

            def damaged(message: str, url: str = url) -> None:
                raise ShardDamageError(f"shard {url}: {message}")

            members = ({**member, "__url__": url} for member in tar_members(stream, damaged))
            yield from group_by_keys(members)


def read_samples(urls: str | list[str]) -> Iterator[VisualSample]:
    """The samples of the shards ``urls`` (see :func:`expand_urls`), in stored order; errors are raised, not skipped.

    Raises:
        ShardDamageError: naming the shard, where one is damaged (see :func:`tar_members`).
        ValueError: naming the sample, where one does not decode (see :func:`decode_sample`).
    """
    for record in read_records(urls):
        yield decode_sample(record)


def _is_remote(url: str) -> bool:
    return url.startswith(_REMOTE)


def expand_urls(urls: str | list[str]) -> list[str]:
    """Shard URLs from brace patterns (``shard-{000000..000003}.tar``), globs, ``::``-separated strings or lists.

    Local files are checked at once, so a wrong pattern fails at start-up; remote ``pipe:`` / ``http(s):`` / ``gs:`` /
    ``s3:`` URLs pass through unchecked. Order is kept (globs sort their matches).

    Raises:
        ValueError: when no URL is given.
        FileNotFoundError: naming the pattern, when a glob matches nothing or a local file is missing.
    """
    patterns = urls.split("::") if isinstance(urls, str) else list(urls)
    patterns = [str(p) for p in patterns if str(p).strip()]
    if not patterns:
        raise ValueError(f"no shard URLs given: {urls!r}")
    out: list[str] = []
    for pattern in patterns:
        for url in braceexpand.braceexpand(pattern):
            if _is_remote(url):
                out.append(url)
                continue
            path = os.path.expanduser(url.removeprefix("file:"))
            if _GLOB_CHARS.search(path):
                matches = sorted(glob.glob(path))
                if not matches:
                    raise FileNotFoundError(f"shard pattern {pattern!r} matches no files ({path!r})")
                out.extend(matches)
            elif not os.path.isfile(path):
                raise FileNotFoundError(f"shard pattern {pattern!r}: no such file {path!r}")
            else:
                out.append(path)
    return out

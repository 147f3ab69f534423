"""A data file's row as a ``VisualSample``: which fields to read (:class:`RowReader`), what makes a row bad
(:class:`BadRow`) and the policy for bad rows (:class:`RowCheck`). Each row becomes a sample this way:

- ``question``: a string, or chat messages (``[{"role": "user", "content": ...}]``, content a string or a list of
  ``{"type": "text", "text": ...}`` / ``{"type": "image"}`` / ``{"type": "video"}`` parts): the user turns' text,
  image parts as ``<image>``, video parts as ``<video>``. Placeholders are checked against the number of images and
  videos and kept where the row puts them (the VLM policy puts each image and video there; generation layouts drop
  them); the system turn goes to ``meta["system"]``, assistant turns to ``meta["response"]``.
- ``images``: a path (relative to ``image_dir``), image bytes, a ``datasets`` ``Image`` value or a list of them.
- ``videos`` (the ``default``, ``verl``, ``easyr1`` and ``swift`` layouts): a video file path (relative to
  ``image_dir``, under the same rules as image paths) or a list of them, decoded with OpenCV and sampled at
  ``video_fps`` (:mod:`app.data.video`).
- ``answer``, ``reasoning`` (the SFT stage's chain of thought), ``task``: strings; a numeric answer becomes its text,
  and an answer written as a response (``<think>R</think><answer>A</answer>``) becomes ``A``, with ``R`` as the
  reasoning when the row has none.
- every other column goes to ``meta`` unchanged, where rewards read it (as TRL passes columns to reward functions).

Field names are dotted paths into a row (``reward_model.ground_truth``); presets name the anchors' and the papers'
layouts (:data:`~app.data.row_fields.PRESETS`); under a layout with a ``twin`` field (OT-GRPO's pairs) a row becomes
a prompt and its augmented twin. A bad row (see :class:`BadRow`) stops the run, naming the file, the row and the
field, unless ``on_bad_row="skip"``: then it is skipped, counted and logged. Nothing in a row is evaluated or
unpickled, and a path may not leave ``image_dir`` unless ``allow_outside_image_dir``.

>>> rows = RowReader(preset="easyr1")
>>> sample = rows.sample({"problem": "How many dots?", "answer": 3, "images": [], "level": "easy"}, 0)
>>> sample.question, sample.answer, sample.meta
('How many dots?', '3', {'level': 'easy'})
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from PIL import Image

from app.data.row_fields import PRESETS
from app.data.video import VideoError, VideoLimits, probe_video, read_video
from app.errors import ConfigError
from app.types import IMAGE_TOKEN, PAIR_RELATIONS, VIDEO_TOKEN, Video, VisualSample

log = logging.getLogger(__name__)

__all__ = ["BadRow", "BadRowError", "Item", "RowCheck", "RowReader"]

Item = VisualSample | tuple[VisualSample, VisualSample]
"""What a row becomes: a sample, or a prompt and its augmented twin (a layout with a ``twin`` field)."""

_PLACEHOLDER = re.compile(r"\s*(<image>|<video>)\s*")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_TAG = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_VIDEO_OPTIONS = {"max_source_frames": "max_video_source_frames", "max_source_pixels": "max_image_pixels"}
"""The reader's option behind each limit of a video file (:class:`~app.data.video.VideoLimits`)."""
_LOGGED_BAD_ROWS = 20  # skipped rows logged one by one; the rest only counted (a broken file must not flood the log)


@dataclasses.dataclass(frozen=True)
class BadRow:
    """A row that cannot become a sample: where it is and what is wrong."""

    file: str
    row: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: row {self.row}, field {self.field!r}: {self.reason}"


class BadRowError(ConfigError):
    """A bad row under ``on_bad_row="stop"``; ``bad_row`` says where (``python -m app`` prints the message alone)."""

    def __init__(self, bad_row: BadRow) -> None:
        super().__init__(f"{bad_row} (on_bad_row='skip' skips such rows)")
        self.bad_row = bad_row


class _Bad(Exception):
    """Raised inside a row's parsing; the reader adds the file and row."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field, self.reason = field, reason


# ------------------------------------------------------------------------------------------------------ rows
def _values(row: dict[str, Any], fields: tuple[str, ...], what: str, limit: int) -> tuple[str, list[Any]]:
    """The first of ``fields`` the row has, and its values as a list (a path, a list, or a JSON list in a CSV cell);
    at most ``limit`` of them."""
    for field in fields:
        found, value = _lookup(row, field)
        if found and value is not None:
            if isinstance(value, str) and value.startswith("["):  # a list in a CSV cell, as JSON text
                try:
                    value = json.loads(value)
                except ValueError as err:
                    raise _Bad(field, f"not a JSON list of paths: {err}") from None
            values = value if isinstance(value, list) else [value]
            if len(values) > limit:
                raise _Bad(field, f"{len(values)} {what}, more than max_{what}={limit}")
            return field, values
    return fields[0] if fields else what, []


def _lookup(row: dict[str, Any], path: str) -> tuple[bool, Any]:
    """``(found, value)`` of a dotted ``path`` in ``row``."""
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def _content_text(content: Any, field: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _Bad(field, f"message content must be a string or a list of parts, got {type(content).__name__}")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image", "image_url"):
            texts.append(IMAGE_TOKEN)
        elif kind in ("video", "video_url"):
            texts.append(VIDEO_TOKEN)
        else:
            raise _Bad(field, f"unknown message part {str(part)[:80]!r}")
    return "".join(texts)


def _chat(messages: list[Any], field: str) -> tuple[str, dict[str, str]]:
    """The question of chat ``messages`` (its user turns) and the other turns for ``meta``."""
    turns: dict[str, list[str]] = {"system": [], "user": [], "assistant": []}
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in turns:
            raise _Bad(field, f"a chat message must be a dict with role system/user/assistant, got {str(message)[:80]}")
        turns[message["role"]].append(_content_text(message.get("content"), field))
    extra = {name: "\n".join(turns[role]) for name, role in (("system", "system"), ("response", "assistant"))}
    return "\n".join(turns["user"]), {k: v for k, v in extra.items() if v}


def _untagged(answer: str | None) -> tuple[str | None, str | None]:
    """An answer written as a response, ``<think>R</think><answer>A</answer>`` (Reason-RFT's ``solution``), as
    ``(A, R)``; any other answer as ``(answer, None)``."""
    if answer is None or (match := _ANSWER_TAG.search(answer)) is None:
        return answer, None
    think = _THINK_TAG.search(answer)
    return match.group(1).strip(), think.group(1).strip() if think else None


def _related_answer(answer: str | None, relation: str, field: str) -> str | None:
    """The twin's answer implied by the prompt's: equal under ``identity``; yes and no swapped under ``negation``."""
    if answer is None or relation == "identity":
        return answer
    swapped = {"yes": "no", "no": "yes"}.get(answer.strip().lower())
    if swapped is None:
        raise _Bad(f"{field}.answer", f"a negated twin of the answer {answer[:40]!r} (not yes/no) needs its own answer")
    return swapped


class RowReader:
    """Turns a file's rows into samples: which fields to read, where images live and what a row may hold.

    Args:
        preset: a field layout of :data:`~app.data.row_fields.PRESETS` (``default``, ``trl``, ``verl``, ``easyr1``,
            ``swift``, ``flow``, ``reason_rft``, ``core``, ``ot_grpo``, ``vbvr``).
        question: the question's field (a string or chat messages); None: the preset's.
        images: the image field, or several to try in order; None: the preset's.
        answer: the answer's field; None: the preset's. A row without it has no answer (label-free).
        reasoning: the chain of thought's field (for SFT); None: the preset's.
        task: the task name's field; None: the preset's. A row without it gets ``default_task``.
        key: a field holding a unique row id (a repeat is a bad row); None: the preset's (none).
        default_task: the task name of rows without a task field.
        image_dir: the folder image paths are relative to; None: the data file's folder.
        allow_outside_image_dir: accept paths that resolve outside ``image_dir`` (absolute ones, ``..``, links).
        max_image_pixels: largest image (width x height) accepted, read from the image's header before decoding.
        max_images: most images one row may hold.
        videos: the video field, or several to try in order; None: the preset's.
        video_fps: frames sampled per second of a video (Qwen-VL's default 2).
        max_video_frames: most frames kept of a video (an even number; longer clips are sampled more sparsely).
        max_video_pixels: most pixels of a kept video frame; larger frames are scaled down.
        max_video_source_frames: longest video file accepted, in frames (read from its header before decoding).
        max_videos: most videos one row may hold.
        prompt_template: the question as the model sees it, with ``{question}`` where the row's question goes (e.g.
            ``"{question} Answer with a number."``); None: the question alone.
        on_bad_row: ``stop``: the first bad row raises :class:`BadRowError`; ``skip``: bad rows are skipped, counted
            and logged.
    """

    def __init__(
        self,
        preset: str = "default",
        question: str | None = None,
        images: str | list[str] | None = None,
        answer: str | None = None,
        reasoning: str | None = None,
        task: str | None = None,
        key: str | None = None,
        default_task: str = "custom",
        image_dir: str | None = None,
        allow_outside_image_dir: bool = False,
        max_image_pixels: int = 4096 * 4096,
        max_images: int = 16,
        videos: str | list[str] | None = None,
        video_fps: float = 2.0,
        max_video_frames: int = 32,
        max_video_pixels: int = 448 * 448,
        max_video_source_frames: int = 36_000,
        max_videos: int = 4,
        prompt_template: str | None = None,
        on_bad_row: Literal["stop", "skip"] = "stop",
    ) -> None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
        if on_bad_row not in ("stop", "skip"):
            raise ValueError(f"on_bad_row must be 'stop' or 'skip', got {on_bad_row!r}")
        if prompt_template is not None and "{question}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}")
        if max_image_pixels < 1 or max_images < 0:
            raise ValueError(f"max_image_pixels must be >= 1 and max_images >= 0, got {max_image_pixels}, {max_images}")
        overrides = {"question": question, "answer": answer, "reasoning": reasoning, "task": task, "key": key}
        if images is not None:
            overrides["images"] = (images,) if isinstance(images, str) else tuple(images)
        if videos is not None:
            overrides["videos"] = (videos,) if isinstance(videos, str) else tuple(videos)
        if max_videos < 0:
            raise ValueError(f"max_videos must be >= 0, got {max_videos}")
        self.fields = dataclasses.replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
        self.preset, self.default_task = preset, default_task
        self.image_dir = Path(image_dir) if image_dir is not None else None
        self.allow_outside_image_dir = allow_outside_image_dir
        self.max_image_pixels, self.max_images = max_image_pixels, max_images
        self.max_videos = max_videos
        self.video_limits = VideoLimits(
            fps=video_fps,
            max_frames=max_video_frames,
            max_pixels=max_video_pixels,
            max_source_frames=max_video_source_frames,
            max_source_pixels=max_image_pixels,
        )
        self.prompt_template, self.on_bad_row = prompt_template, on_bad_row

    # -------------------------------------------------------------------------------------------------- fields
    def _consumed(self, row: dict[str, Any]) -> set[str]:
        fields = self.fields
        named = [fields.question, fields.answer, fields.reasoning, fields.task, *fields.images, *fields.videos]
        named.append(fields.twin or "")
        return {name for name in named if "." not in name and name in row}

    def _question(self, row: dict[str, Any]) -> tuple[str, dict[str, str]]:
        field = self.fields.question
        found, value = _lookup(row, field)
        if not found:
            raise _Bad(field, "missing")
        if isinstance(value, list):
            value, extra = _chat(value, field)
        elif isinstance(value, str):
            extra = {}
        else:
            raise _Bad(field, f"must be a string or chat messages, got {type(value).__name__}")
        return value, extra

    def _text(self, row: dict[str, Any], field: str, numbers: bool = False) -> str | None:
        found, value = _lookup(row, field)
        if not found or value is None:
            return None
        if numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise _Bad(field, f"must be a string, got {type(value).__name__} {str(value)[:40]!r}")
        return value

    def _image_values(self, row: dict[str, Any]) -> tuple[str, list[Any]]:
        return _values(row, self.fields.images, "images", self.max_images)

    def _video_values(self, row: dict[str, Any]) -> tuple[str, list[Any]]:
        return _values(row, self.fields.videos, "videos", self.max_videos)

    def _image_path(self, path: str, field: str, base: Path, what: str = "image") -> Path:
        root = (self.image_dir or base).resolve()
        resolved = (root / path).resolve()
        if not self.allow_outside_image_dir and not resolved.is_relative_to(root):
            raise _Bad(field, f"{what} path {path!r} leaves image_dir {str(root)!r} (allow_outside_image_dir allows)")
        if not resolved.is_file():
            raise _Bad(field, f"{what} {path!r} not found (looked at {str(resolved)!r})")
        return resolved

    def _open_video(self, value: Any, field: str, base: Path, decode: bool) -> Video | None:
        """Check one video file's header (frame count, frame size); decode its sampled frames only when ``decode``."""
        if isinstance(value, dict) and "path" in value:
            value = value["path"]
        if not isinstance(value, str):
            raise _Bad(field, f"a video must be a file path, got {type(value).__name__}")
        path = self._image_path(value, field, base, what="video")
        try:
            if not decode:
                probe_video(path, self.video_limits)
                return None
            return read_video(path, self.video_limits)
        except VideoError as err:
            option = f" (the reader's {_VIDEO_OPTIONS[err.limit]})" if err.limit else ""
            raise _Bad(field, f"video {value!r}: {err.reason}{option}") from None

    def _open_image(self, value: Any, field: str, base: Path, decode: bool) -> Image.Image | None:
        """Check one image's header (size, format); decode it only when ``decode``."""
        if isinstance(value, dict) and ("bytes" in value or "path" in value):  # a datasets Image value
            value = value.get("bytes") or value.get("path")
        if isinstance(value, str):
            source: Any = self._image_path(value, field, base)
        elif isinstance(value, (bytes, bytearray)):
            source = io.BytesIO(value)
        else:
            raise _Bad(field, f"an image must be a path, bytes or an Image value, got {type(value).__name__}")
        try:
            with Image.open(source) as image:  # reads the header only
                width, height = image.size
                if width * height > self.max_image_pixels:
                    raise _Bad(
                        field, f"image of {width}x{height} pixels, over max_image_pixels={self.max_image_pixels}"
                    )
                if not decode:
                    image.verify()  # the file's structure and checksums, without decoding the pixels
                    return None
                image.load()
                return image.convert("RGB")
        except _Bad:
            raise
        except Image.DecompressionBombError as err:
            raise _Bad(field, f"image over the size limit: {err}") from None
        except Exception as err:  # noqa: BLE001 - any decoder failure is an unreadable image
            raise _Bad(field, f"unreadable image: {type(err).__name__}: {err}") from None

    # -------------------------------------------------------------------------------------------------- rows
    def sample(self, row: dict[str, Any], index: int, file: str | Path = "<row>", decode: bool = True) -> Item:
        """The sample of ``row`` (row ``index`` of ``file``), or the pair ``(x, x')`` under a layout with a ``twin``
        field; :class:`BadRowError` if it is a bad row. With ``decode=False`` every image is checked (header, size,
        structure) but ``images`` stays empty."""
        base = Path(file).parent if str(file) != "<row>" else Path.cwd()
        try:
            sample = self._sample(row, base, decode)
            return sample if self.fields.twin is None else self._pair(sample, row, index, base, decode)
        except _Bad as bad:
            raise BadRowError(BadRow(str(file), index, bad.field, bad.reason)) from None

    def _sample(self, row: dict[str, Any], base: Path, decode: bool) -> VisualSample:
        question, extra = self._question(row)
        image_field, values = self._image_values(row)
        video_field, video_values = self._video_values(row)
        placed = {IMAGE_TOKEN: (len(values), "images"), VIDEO_TOKEN: (len(video_values), "videos")}
        if any(token in question for token in placed):  # then every image and every video has its placeholder
            for token, (count, what) in placed.items():
                if question.count(token) != count:
                    raise _Bad(self.fields.question, f"{question.count(token)} {token} placeholders for {count} {what}")
        if self.fields.image_count is not None and len(values) != self.fields.image_count:
            raise _Bad(image_field, f"{len(values)} images; this layout needs {self.fields.image_count}")
        if not _PLACEHOLDER.sub(" ", question).strip():
            raise _Bad(self.fields.question, "empty question")
        question = question.strip() if self.fields.keep_placeholders else _PLACEHOLDER.sub(" ", question).strip()
        images = [self._open_image(value, image_field, base, decode) for value in values]
        videos = [self._open_video(value, video_field, base, decode) for value in video_values]
        meta = {k: v for k, v in row.items() if k not in self._consumed(row)}
        for name, value in meta.items():
            if not _is_plain(value):
                raise _Bad(name, f"meta columns must hold JSON values (no bytes), got {type(value).__name__}")
        missing = [name for name in self.fields.required_meta if name not in meta]
        if missing:
            raise _Bad(missing[0], f"missing; the {self.preset!r} layout's rewards read {list(missing)}")
        meta.update(extra)
        if self.prompt_template is not None:
            question = self.prompt_template.replace("{question}", question)
        answer, reasoning = _untagged(self._text(row, self.fields.answer, numbers=True))
        return VisualSample(
            images=[image for image in images if image is not None],
            question=question,
            task=self._text(row, self.fields.task) or self.default_task,
            answer=answer,
            reasoning=self._text(row, self.fields.reasoning) or reasoning,
            meta=meta,
            videos=[video for video in videos if video is not None],
        )

    def _pair(
        self, x: VisualSample, row: dict[str, Any], index: int, base: Path, decode: bool
    ) -> tuple[VisualSample, VisualSample]:
        """``(x, x')``: the row's prompt and its augmented twin, read from the ``twin`` field with the row's field
        names; both carry ``meta["pair_id"]``, the twin ``meta["relation"]`` (see :mod:`app.rewards.groups`)."""
        field = self.fields.twin
        found, value = _lookup(row, field)
        if not found or not isinstance(value, dict):
            raise _Bad(field, "missing" if not found else f"must be a dict (question, images, relation), got {value!r}")
        relation = value.get("relation")
        if relation not in PAIR_RELATIONS:
            raise _Bad(f"{field}.relation", f"must be one of {PAIR_RELATIONS}, got {str(relation)[:40]!r}")
        try:
            twin = self._sample(value, base, decode)
        except _Bad as bad:
            raise _Bad(f"{field}.{bad.field}", bad.reason) from None
        answer = twin.answer if twin.answer is not None else _related_answer(x.answer, relation, field)
        pair_id = f"{self.row_key(row) or index}"
        x = dataclasses.replace(x, meta={**x.meta, "pair_id": pair_id})
        twin_task = twin.task if _lookup(value, self.fields.task)[0] else x.task
        twin_meta = {**x.meta, **twin.meta, "pair_id": pair_id}
        return x, dataclasses.replace(twin, task=twin_task, answer=answer, meta=twin_meta)

    def row_key(self, row: dict[str, Any]) -> str | None:
        """The row's id under the ``key`` field, as text; None without a key field."""
        if self.fields.key is None:
            return None
        found, value = _lookup(row, self.fields.key)
        if not found or value is None or isinstance(value, (dict, list)):
            raise _Bad(self.fields.key, "missing key" if not found or value is None else "key must be a scalar")
        return str(value)


class RowCheck:
    """Reads rows one by one for a :class:`RowReader`: duplicate keys, the ``on_bad_row`` policy and the counts.

    Attributes:
        bad_rows: the bad rows seen, in order.
        good: the number of good rows.
    """

    def __init__(self, reader: RowReader, path: str | Path) -> None:
        self.reader, self.file = reader, str(path)
        self.bad_rows: list[BadRow] = []
        self.good = 0
        self._keys: dict[str, int] = {}

    def __call__(self, row: dict[str, Any], index: int, decode: bool) -> Item | None:
        """The row's sample (or pair), or None when it is a bad row being skipped."""
        try:
            key = self._key(row, index)
            sample = self.reader.sample(row, index, self.file, decode)
        except BadRowError as err:
            if self.reader.on_bad_row == "stop":
                raise
            self._skip(err.bad_row)
            return None
        if key is not None:
            self._keys[key] = index
        self.good += 1
        return sample

    def _key(self, row: dict[str, Any], index: int) -> str | None:
        try:
            key = self.reader.row_key(row)
        except _Bad as bad:
            raise BadRowError(BadRow(self.file, index, bad.field, bad.reason)) from None
        if key is not None and key in self._keys:
            reason = f"duplicate key {key!r} (first at row {self._keys[key]})"
            raise BadRowError(BadRow(self.file, index, self.reader.fields.key, reason))
        return key

    def _skip(self, bad: BadRow) -> None:
        self.bad_rows.append(bad)
        if len(self.bad_rows) <= _LOGGED_BAD_ROWS:
            log.warning("skipping bad row: %s", bad)

    def summary(self) -> str:
        """``"N good rows, M skipped (reason counts)"``."""
        text = f"{self.file}: {self.good} good rows, {len(self.bad_rows)} skipped"
        if self.bad_rows:
            kinds = Counter(f"{bad.field}: {bad.reason.split(':')[0].split(' (')[0]}" for bad in self.bad_rows)
            text += " (" + "; ".join(f"{n} x {kind}" for kind, n in kinds.most_common()) + ")"
        return text

    def finish(self) -> None:
        """Log the summary when rows were skipped."""
        if self.bad_rows:
            log.warning("%s", self.summary())

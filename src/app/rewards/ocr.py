"""Does a generated picture show the text its prompt asks for? OCR reads it; the score is Flow-GRPO's edit similarity.

The expected text of a prompt is ``sample.meta["text"]`` when the sample carries it, else the first span of the prompt
between double quotes (``A sign that says "Hello"`` -> ``Hello``; straight or curly quotes), as Flow-GRPO's OCR prompts
are written. A prompt with neither is a configuration error (``ValueError`` naming the prompt): there is nothing to
read for.

OCR is RapidOCR's PP-OCRv4 (detection + recognition, ONNX, on the CPU; the models ship inside the
``rapidocr-onnxruntime`` wheel, so nothing is downloaded): its text lines with a confidence of at least
``min_confidence`` are joined in its reading order (top to bottom, left to right). The score
(:func:`ocr_similarity`, Flow-GRPO's normalisation) compares the two after removing whitespace and lower-casing both:

- 1 if the expected text occurs in what was read (extra text elsewhere in the picture costs nothing);
- else ``1 - min(d, n) / n``, ``d`` the Levenshtein distance between what was read and the expected text, ``n`` the
  expected text's length: each missing, extra or wrong character costs ``1 / n``, and reading nothing scores 0.

Images are float tensors ``[3, H, W]`` in [0, 1] (what the flow policy decodes to) or uint8 arrays ``[H, W, 3]``; a
video scores its last frame. Untrusted images never fail the batch: one that cannot be read as an image (wrong shape or
dtype, no pixels, text) scores 0 and is counted in ``num_malformed``; one that is degenerate (a non-finite value, or
every pixel the same) scores 0 without running OCR and is counted in ``num_degenerate``; one on which OCR reads no text
(noise, a blank scene) scores 0 and is counted in ``num_unread``.

The engine is built on first use, once per process and setting (:func:`ocr_engine`), and never pickled with the reward:
a process-pool worker or a reward server (:mod:`app.rewards.serve`) builds its own.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from app.cv import to_uint8_frames
from app.rewards.base import RewardComponent
from app.types import VisualSample

log = logging.getLogger(__name__)

MISSING_ENGINE = "the OCR reward needs RapidOCR (rapidocr-onnxruntime): pip install app[ocr]"
_QUOTED = re.compile(r"\"([^\"]*)\"|\u201c([^\u201d]*)\u201d")
_ENGINES: dict[tuple[int, int], Any] = {}
_ENGINES_LOCK = threading.Lock()


def ocr_engine(detection_side: int = 320, num_threads: int = 1) -> Any:
    """This process's RapidOCR engine for these settings, built on first use (about 0.2 s; the models come from the
    wheel). ``ImportError`` naming the ``ocr`` extra when it is not installed."""
    key = (int(detection_side), int(num_threads))
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            try:
                from rapidocr_onnxruntime import RapidOCR
            except ImportError as error:
                raise ImportError(MISSING_ENGINE) from error
            _ENGINES[key] = RapidOCR(
                text_score=0.0,  # every line comes back; ocr_read filters by the reward's min_confidence
                det_limit_side_len=key[0],
                det_limit_type="min",
                intra_op_num_threads=key[1],
                inter_op_num_threads=key[1],
            )
        return _ENGINES[key]


def expected_text(prompt: Mapping[str, Any] | str) -> str:
    """The text a prompt asks for: ``prompt["text"]`` of a sample's ``meta``, or the first double-quoted span of the
    prompt text. ``ValueError`` naming the prompt when there is none, or when it is blank."""
    if isinstance(prompt, Mapping):
        text = prompt.get("text")
        if not isinstance(text, str):
            raise ValueError(f"the OCR reward needs meta['text'] as a string, got {text!r}")
    else:
        match = _QUOTED.search(prompt)
        if match is None:
            raise ValueError(
                f'the OCR reward needs the text to draw in double quotes (A sign that says "Hello") or in '
                f"meta['text']; the prompt {prompt[:80]!r} has neither"
            )
        text = match.group(1) if match.group(1) is not None else match.group(2)
    if not normalize_text(text):
        raise ValueError(f"the OCR reward's expected text is blank: {text!r}")
    return text


def normalize_text(text: str) -> str:
    """``text`` lower-cased, without whitespace: what :func:`ocr_similarity` compares."""
    return "".join(text.split()).lower()


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-character insertions, deletions and substitutions turning ``a`` into
    ``b``."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def ocr_similarity(read: str, expected: str) -> float:
    """Flow-GRPO's OCR score of the text ``read`` against the ``expected`` text, both normalised
    (:func:`normalize_text`): 1 if the expected text occurs in what was read, else ``1 - min(d, n) / n`` with ``d``
    the edit distance and ``n`` the expected text's length.

    >>> ocr_similarity("Hello", "hello"), ocr_similarity("OPEN 24 h", "open24"), ocr_similarity("Helo", "Hello")
    (1.0, 1.0, 0.8)
    >>> ocr_similarity("", "cat"), ocr_similarity("a very long caption", "cat")
    (0.0, 0.0)
    """
    read, expected = normalize_text(read), normalize_text(expected)
    if not expected:
        raise ValueError("the expected text is blank")
    if expected in read:
        return 1.0
    return 1.0 - min(edit_distance(read, expected), len(expected)) / len(expected)


def _frame(image: Any) -> np.ndarray | None:
    """The uint8 ``[H, W, 3]`` frame to read (a video's last), or None when the image is degenerate (a non-finite
    value, or one colour everywhere). ``ValueError`` when it cannot be read as an image."""
    if isinstance(image, Tensor) and image.is_floating_point() and not bool(torch.isfinite(image).all()):
        return None
    if isinstance(image, np.ndarray) and image.dtype.kind == "f" and not np.isfinite(image).all():
        return None
    frame = to_uint8_frames(image)[-1]
    if frame.min() == frame.max():
        return None
    return frame


def ocr_read(frame: np.ndarray, engine: Any, min_confidence: float = 0.5) -> str:
    """What OCR reads on a uint8 RGB ``[H, W, 3]`` frame: its lines of at least ``min_confidence`` joined in reading
    order ("" when it finds none)."""
    result, _ = engine(np.ascontiguousarray(frame[..., ::-1]), use_cls=False)  # RapidOCR reads arrays as BGR
    return "".join(line[1] for line in result or () if float(line[2]) >= min_confidence)


def _scores(
    images: Sequence[Any], texts: Sequence[str], engine: Any, min_confidence: float
) -> tuple[list[float], list[tuple[int, str]], list[int], list[int]]:
    """The scores, ``(index, why)`` of each malformed image, the indices of degenerate ones and of those OCR read no
    text on."""
    values, malformed, degenerate, unread = [], [], [], []
    for i, (image, text) in enumerate(zip(images, texts, strict=True)):
        try:
            frame = _frame(image)
        except (ValueError, TypeError) as error:
            values.append(0.0)
            malformed.append((i, f"{type(error).__name__}: {error}"))
            continue
        if frame is None:
            values.append(0.0)
            degenerate.append(i)
            continue
        read = ocr_read(frame, engine, min_confidence)
        if not read:
            unread.append(i)
        values.append(ocr_similarity(read, text))
    return values, malformed, degenerate, unread


def ocr_reward(
    images: Sequence[Any],
    prompts: Sequence[Mapping[str, Any] | str],
    min_confidence: float = 0.5,
    detection_side: int = 320,
    num_threads: int = 1,
) -> Tensor:
    """``[N]`` float32: :func:`ocr_similarity` of what OCR reads on each image against its prompt's text; 0 for an
    image that is malformed (logged as a warning), degenerate or unreadable. ``prompts[i]`` is the prompt text (the
    expected text in double quotes) or a mapping with ``"text"``."""
    texts = [expected_text(p) for p in prompts]
    engine = ocr_engine(detection_side, num_threads)
    values, malformed, _, _ = _scores(images, texts, engine, min_confidence)
    for i, why in malformed:
        log.warning("ocr reward: image %d scored 0 (malformed): %s", i, why)
    return torch.tensor(values, dtype=torch.float32)


class OCRReward(RewardComponent):
    """Flow-GRPO's OCR reward: 1 - the normalised edit distance between the prompt's text and what OCR reads on the
    picture (see the module docstring).

    Attributes:
        num_malformed: images that could not be read as images (cumulative; each logged as a warning).
        num_degenerate: images with a non-finite value or a single colour, scored 0 without OCR (cumulative).
        num_unread: images on which OCR read no text (cumulative).

    Args:
        min_confidence: recognised lines below this confidence are dropped (PaddleOCR's default, which Flow-GRPO
            keeps: 0.5).
        detection_side: the detector's input side: the image is scaled so its shorter side is this many pixels.
            RapidOCR's default, 736, reads the same words on rendered text at 64-256 px and is 5-7x slower
            (benchmarks/ocr_reward.py).
        num_threads: ONNX Runtime threads per OCR call; scale with processes (the reward process pool, more reward
            servers) rather than threads.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`).
        name: its log name (``train/reward/<name>``); None: ``"ocr"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
    """

    completion_kinds = ("image", "array")  # text scores as malformed
    side_state = ("num_malformed", "num_degenerate", "num_unread")

    def __init__(
        self,
        min_confidence: float = 0.5,
        detection_side: int = 320,
        num_threads: int = 1,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        if detection_side < 32 or num_threads < 1:
            raise ValueError(f"need detection_side >= 32 and num_threads >= 1, got {detection_side}, {num_threads}")
        super().__init__(weight=weight, name=name, **kwargs)
        self.min_confidence, self.detection_side, self.num_threads = float(min_confidence), detection_side, num_threads
        self.num_malformed = 0
        self.num_degenerate = 0
        self.num_unread = 0

    def score(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> Tensor:
        texts = [expected_text(s.meta if "text" in s.meta else s.question) for s in samples]
        engine = ocr_engine(self.detection_side, self.num_threads)
        values, malformed, degenerate, unread = _scores(completions, texts, engine, self.min_confidence)
        self.num_degenerate += len(degenerate)
        self.num_unread += len(unread)
        for i, why in malformed:
            self.num_malformed += 1
            log.warning("ocr reward: completion %d scored 0 (malformed; %d so far): %s", i, self.num_malformed, why)
        if degenerate:
            log.warning(
                "ocr reward: %d of %d images degenerate (a non-finite value or one colour), scored 0 (%d so far)",
                len(degenerate),
                len(completions),
                self.num_degenerate,
            )
        return torch.tensor(values, dtype=torch.float32)

"""Reason-RFT format reward: 1 iff the completion is exactly ``<think>...</think><answer>...</answer>``.

The tag sequence is configurable. Reason-RFT's format ablation (its Tab. 2 and Fig. 12) adds ``<summary>`` and
``<caption>`` blocks; the paper's text does not give their order, and its public reward code checks
``<summary>..</summary><caption>..</caption><think>..</think><answer>..</answer>``, which :data:`CAPTION_TAGS` follows.
See docs/algorithms.md#format-reward; Reason-RFT is listed in docs/algorithms.md#papers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from app.formats import CAPTION_TAGS as CAPTION_TAGS  # re-exported: Reason-RFT's summary / caption variant
from app.formats import REASONING_TAGS, close_tag, open_tag
from app.rewards.base import RewardComponent
from app.rewards.parsing import _TAG_NAME, MAX_PARSE_CHARS, normalize_answer
from app.types import VisualSample

DEFAULT_TAGS = REASONING_TAGS
"""Reason-RFT / DeepSeek-R1 form: reasoning, then the answer (``("think", "answer")``, :mod:`app.formats`)."""


def _allowed_set(allowed_answers: Iterable[str] | None) -> frozenset[str] | None:
    if allowed_answers is None:
        return None
    if isinstance(allowed_answers, str):
        raise ValueError(f"allowed_answers must be a list of answers, got the string {allowed_answers!r}")
    allowed = frozenset(normalize_answer(a) for a in allowed_answers) - {""}
    if not allowed:
        raise ValueError("allowed_answers must hold at least one non-empty answer (or be None to allow any)")
    return allowed


def _check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    if isinstance(tags, str):
        raise ValueError(f"tags must be a sequence of tag names such as ('think', 'answer'), got the string {tags!r}")
    tags = tuple(tags)
    if not tags:
        raise ValueError("tags must name at least one block")
    for tag in tags:
        if not isinstance(tag, str) or _TAG_NAME.fullmatch(tag) is None:
            raise ValueError(f"tags must be plain names like 'answer', got {tag!r}")
    if len(set(tags)) != len(tags):
        raise ValueError(f"tags must be distinct, got {tags}")
    return tags


def _is_well_formed(text: object, allowed: frozenset[str] | None, tags: tuple[str, ...] = DEFAULT_TAGS) -> bool:
    """Strict form, checked with ``str`` methods only (linear time; no regex to backtrack)."""
    if not isinstance(text, str) or len(text) > MAX_PARSE_CHARS:
        return False
    text = text.strip()
    markers = [marker for tag in tags for marker in (open_tag(tag), close_tag(tag))]
    if any(text.count(marker) != 1 for marker in markers):
        return False  # missing, repeated or nested
    pos = 0
    content = ""
    for tag in tags:
        opening, closing = open_tag(tag), close_tag(tag)
        rest = text[pos:]
        pos += len(rest) - len(rest.lstrip())  # whitespace between blocks
        if not text.startswith(opening, pos):
            return False  # text between blocks, or blocks out of order
        end = text.find(closing, pos + len(opening))
        if end < 0:
            return False
        content = text[pos + len(opening) : end]
        pos = end + len(closing)
    if pos != len(text) or not content.strip():
        return False  # text after the last block, or an empty last block (the answer)
    return allowed is None or normalize_answer(content) in allowed


def format_reward(
    completions: Sequence[str], allowed_answers: Iterable[str] | None = None, tags: Sequence[str] = DEFAULT_TAGS
) -> Tensor:
    """``[N]`` float32: 1.0 where a completion has the strict Reason-RFT form, else 0.0.

    The strict form is one ``<tag>...</tag>`` block per entry of ``tags``, in that order (by default
    ``<think>...</think>`` then ``<answer>...</answer>``): whitespace allowed around and between the blocks, each tag
    exactly once (so no nesting or repetition), nothing else outside the blocks, and a non-empty last block (the
    answer); the other blocks may be empty. Completions longer than :data:`~app.rewards.parsing.MAX_PARSE_CHARS`
    score 0. With ``allowed_answers``, the normalised last block must also be one of them (compared after
    :func:`~app.rewards.parsing.normalize_answer`).

    >>> format_reward(["<think>a</think>\\n<answer>Yes</answer>", "<answer>yes</answer>"])
    tensor([1., 0.])
    >>> format_reward(["<think>a</think><answer>maybe</answer>"], allowed_answers=["yes", "no"])
    tensor([0.])
    >>> format_reward(["<summary>s</summary><caption>c</caption><think>t</think><answer>4</answer>"], tags=CAPTION_TAGS)
    tensor([1.])
    """
    allowed, tags = _allowed_set(allowed_answers), _check_tags(tags)
    return torch.tensor([float(_is_well_formed(c, allowed, tags)) for c in completions], dtype=torch.float32)


class FormatReward(RewardComponent):
    """Reason-RFT format reward (see :func:`format_reward`); name ``"format"``.

    Args:
        allowed_answers: if given, also require the normalised answer to be one of these (e.g. ``["yes", "no"]``).
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"format"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
        tags: the blocks, in order; default ``("think", "answer")``. :data:`CAPTION_TAGS` =
            ``("summary", "caption", "think", "answer")`` is Reason-RFT's caption variant (give it another ``name``
            when both are used).

    Example:
        >>> from app.types import VisualSample
        >>> reward = FormatReward(allowed_answers=["yes", "no"])
        >>> sample = VisualSample(images=[], question="Is the cube left of the ball?", task="spatial")
        >>> completions = ["<think>look</think><answer>No.</answer>", "<think>look</think> no"]
        >>> reward.score(completions, [sample, sample])
        tensor([1., 0.])
        >>> captioned = FormatReward(tags=CAPTION_TAGS, name="caption_format")
        >>> captioned.score(["<summary>s</summary><caption>c</caption><think>t</think><answer>no</answer>"], [sample])
        tensor([1.])
    """

    completion_kinds = ("text",)

    def __init__(
        self,
        allowed_answers: list[str] | None = None,
        weight: float = 1.0,
        name: str | None = None,
        tags: Sequence[str] = DEFAULT_TAGS,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.allowed_answers = None if allowed_answers is None else list(allowed_answers)
        self._allowed = _allowed_set(allowed_answers)
        self.tags = _check_tags(tags)

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        return torch.tensor(
            [float(_is_well_formed(c, self._allowed, self.tags)) for c in completions], dtype=torch.float32
        )

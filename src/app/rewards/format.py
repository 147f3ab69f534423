"""Reason-RFT format reward: 1 iff the completion is exactly ``<think>...</think><answer>...</answer>``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from app.rewards.base import RewardComponent
from app.rewards.parsing import MAX_PARSE_CHARS, normalize_answer
from app.types import VisualSample

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _allowed_set(allowed_answers: Iterable[str] | None) -> frozenset[str] | None:
    if allowed_answers is None:
        return None
    if isinstance(allowed_answers, str):
        raise ValueError(f"allowed_answers must be a list of answers, got the string {allowed_answers!r}")
    allowed = frozenset(normalize_answer(a) for a in allowed_answers) - {""}
    if not allowed:
        raise ValueError("allowed_answers must hold at least one non-empty answer (or be None to allow any)")
    return allowed


def _is_well_formed(text: object, allowed: frozenset[str] | None) -> bool:
    """Strict form, checked with ``str`` methods only (linear time; no regex to backtrack)."""
    if not isinstance(text, str) or len(text) > MAX_PARSE_CHARS:
        return False
    text = text.strip()
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return False
    if any(text.count(tag) != 1 for tag in _TAGS):
        return False
    think_end = text.find("</think>")
    answer_start = text.find("<answer>")
    if answer_start < think_end or text[think_end + len("</think>") : answer_start].strip():
        return False  # reversed order, or text between the blocks
    answer = text[answer_start + len("<answer>") : -len("</answer>")].strip()
    if not answer:
        return False
    return allowed is None or normalize_answer(answer) in allowed


def format_reward(completions: Sequence[str], allowed_answers: Iterable[str] | None = None) -> Tensor:
    """``[N]`` float32: 1.0 where a completion has the strict Reason-RFT form, else 0.0.

    The strict form is ``<think>...</think>`` then ``<answer>...</answer>``: whitespace allowed around and between the
    blocks, each of the four tags exactly once (so no nesting or repetition), nothing else outside the blocks, and a
    non-empty answer; the thinking may be empty. Completions longer than
    :data:`~app.rewards.parsing.MAX_PARSE_CHARS` score 0. With ``allowed_answers``, the normalised answer must also
    be one of them (compared after :func:`~app.rewards.parsing.normalize_answer`).

    >>> format_reward(["<think>a</think>\\n<answer>Yes</answer>", "<answer>yes</answer>"])
    tensor([1., 0.])
    >>> format_reward(["<think>a</think><answer>maybe</answer>"], allowed_answers=["yes", "no"])
    tensor([0.])
    """
    allowed = _allowed_set(allowed_answers)
    return torch.tensor([float(_is_well_formed(c, allowed)) for c in completions], dtype=torch.float32)


class FormatReward(RewardComponent):
    """Reason-RFT format reward (see :func:`format_reward`); name ``"format"``.

    Args:
        allowed_answers: if given, also require the normalised answer to be one of these (e.g. ``["yes", "no"]``).
        weight, name, kwargs: see :class:`~app.rewards.RewardComponent`.

    Example:
        >>> from app.types import VisualSample
        >>> reward = FormatReward(allowed_answers=["yes", "no"])
        >>> sample = VisualSample(images=[], question="Is the cube left of the ball?", task="spatial")
        >>> completions = ["<think>look</think><answer>No.</answer>", "<think>look</think> no"]
        >>> reward.score(completions, [sample, sample])
        tensor([1., 0.])
    """

    def __init__(
        self, allowed_answers: list[str] | None = None, weight: float = 1.0, name: str | None = None, **kwargs
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.allowed_answers = None if allowed_answers is None else list(allowed_answers)
        self._allowed = _allowed_set(allowed_answers)

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        return torch.tensor([float(_is_well_formed(c, self._allowed)) for c in completions], dtype=torch.float32)

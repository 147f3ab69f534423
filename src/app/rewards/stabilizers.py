"""Training stabilisers used beside TriSR (CoRe): cosine length reward, n-gram repetition penalty, soft overlong
penalty (docs/algorithms.md#training-stabilisers).

The paper takes the first two from ms-swift ("a cosine CoT length reward that penalizes excessively verbose reasoning
chains, and a repetition penalty that discourages degenerate token repetition ... we therefore omit their
implementation details"); both go back to "Demystifying Long Chain-of-Thought Reasoning in LLMs" (Yeo et al. 2025),
and the forms here are ms-swift's. The soft overlong penalty is DAPO's (Yu et al. 2025).

Length is measured without a tokenizer (a reward sees only text): ``length_unit="words"`` counts whitespace-separated
words (``str.split``; roughly 0.75 of a BPE token count for English text), ``"chars"`` counts characters. ms-swift and
DAPO count tokens, so their thresholds translate to about 0.75x as many words.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Literal

from torch import Tensor

from app.rewards.accuracy import AccuracyReward
from app.rewards.base import RewardComponent
from app.rewards.ranges import scores_in_range
from app.types import VisualSample

LengthUnit = Literal["words", "chars"]
_WORD = re.compile(r"\S+")


def text_length(text: object, unit: LengthUnit = "words", cap: int | None = None) -> int:
    """Length of ``text`` in whitespace-separated words or characters, counted up to ``cap`` (linear, stops early).

    A non-string has length 0.

    >>> text_length("two  words\\n"), text_length("two  words\\n", "chars"), text_length("a b c d", cap=2)
    (2, 11, 2)
    """
    if not isinstance(text, str):
        return 0
    if unit == "chars":
        return len(text) if cap is None else min(len(text), cap)
    if unit != "words":
        raise ValueError(f"length_unit must be 'words' or 'chars', got {unit!r}")
    return sum(1 for _ in itertools.islice(_WORD.finditer(text), cap))


def _check_unit(unit: str) -> None:
    if unit not in ("words", "chars"):
        raise ValueError(f"length_unit must be 'words' or 'chars', got {unit!r}")


def _check_length(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------------ cosine length
def cosine_schedule(length: int, max_length: int, value_at_zero: float, value_at_max: float) -> float:
    """``v_max + (v_0 - v_max) (1 + cos(pi min(L, L_max) / L_max)) / 2``: ``v_0`` at L = 0, ``v_max`` from L_max on."""
    t = min(max(length, 0), max_length)
    return value_at_max + (value_at_zero - value_at_max) * (1.0 + math.cos(math.pi * t / max_length)) / 2.0


def cosine_length_reward(
    completions: Sequence[str],
    correct: Sequence[bool] | Tensor,
    max_length: int = 1000,
    min_len_value_correct: float = 1.0,
    max_len_value_correct: float = 0.5,
    min_len_value_wrong: float = -0.5,
    max_len_value_wrong: float = 0.0,
    length_unit: LengthUnit = "words",
) -> Tensor:
    """``[N]`` cosine length reward (Demystifying long CoT; ms-swift ``CosineReward``):

    ``r(L) = v_Lmax + (v_0 - v_Lmax) (1 + cos(pi min(L, L_max) / L_max)) / 2``, with ``(v_0, v_Lmax)`` =
    ``(min_len_value_correct, max_len_value_correct)`` for a correct completion and ``(min_len_value_wrong,
    max_len_value_wrong)`` for a wrong one. The defaults (ms-swift's) make short correct answers best (1.0 -> 0.5 as L
    grows) and let wrong answers think longer (-0.5 -> 0.0). ``L`` is the whole completion's length in
    ``length_unit``; lengths past ``max_length`` get the value at ``max_length`` (ms-swift's cosine, unclamped, would
    turn back; the soft overlong penalty handles over-length). A non-string completion gets the lowest value.

    >>> cosine_length_reward(["short answer", "x " * 1000, "short answer"], [True, True, False], max_length=1000)
    tensor([ 1.0000,  0.5000, -0.5000])
    """
    _check_length("max_length", max_length)
    _check_unit(length_unit)
    if len(correct) != len(completions):
        raise ValueError(f"got {len(completions)} completions but {len(correct)} correctness flags")
    values = [min_len_value_correct, max_len_value_correct, min_len_value_wrong, max_len_value_wrong]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"cosine length values must be finite, got {values}")
    value_range = (min(values), max(values))
    rewards = []
    for completion, is_correct in zip(completions, [bool(c) for c in correct], strict=True):
        if not isinstance(completion, str):
            rewards.append(value_range[0])
            continue
        length = text_length(completion, length_unit, cap=max_length)
        v0, vmax = (
            (min_len_value_correct, max_len_value_correct) if is_correct else (min_len_value_wrong, max_len_value_wrong)
        )
        rewards.append(cosine_schedule(length, max_length, v0, vmax))
    return scores_in_range(rewards, value_range)


class CosineLengthReward(RewardComponent):
    """Cosine length reward (see :func:`cosine_length_reward`), wrapping a correctness reward; name ``"cosine_length"``.

    A completion is correct when ``correctness`` scores it ``>= correct_threshold``; by default
    :class:`~app.rewards.AccuracyReward` (exact match of the ``<answer>`` block with ``sample.answer``, so labeled
    samples are needed). For triplets use ``TripletOverallAccuracy`` (all three sub-answers right). ``value_range`` is
    the span of the four values: (-0.5, 1.0) by default.

    Args:
        correctness: the reward that decides correctness (its weight is ignored).
        correct_threshold: correctness score from which a completion counts as correct (ms-swift: 1.0).
        max_length: L_max, in ``length_unit`` (ms-swift: 1000 tokens).
        min_len_value_correct: value of a correct completion at length 0 (ms-swift: 1.0); finite.
        max_len_value_correct: value of a correct completion at length L_max and beyond (ms-swift: 0.5); finite.
        min_len_value_wrong: value of a wrong completion at length 0 (ms-swift: -0.5); finite.
        max_len_value_wrong: value of a wrong completion at length L_max and beyond (ms-swift: 0.0); finite.
        length_unit: ``"words"`` (whitespace-separated) or ``"chars"``.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"cosine_length"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> sample = VisualSample(images=[], question="Is the cube red?", task="color", answer="yes")
        >>> reward = CosineLengthReward(max_length=4)
        >>> reward.score(["<answer>yes</answer>", "a b <answer>yes</answer>", "a b c d e <answer>no</answer>"],
        ...              [sample] * 3)
        tensor([0.9268, 0.5732, 0.0000])
    """

    completion_kinds = ("text",)

    value_range = (-0.5, 1.0)

    def __init__(
        self,
        correctness: RewardComponent | None = None,
        correct_threshold: float = 1.0,
        max_length: int = 1000,
        min_len_value_correct: float = 1.0,
        max_len_value_correct: float = 0.5,
        min_len_value_wrong: float = -0.5,
        max_len_value_wrong: float = 0.0,
        length_unit: LengthUnit = "words",
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.correctness = correctness if correctness is not None else AccuracyReward()
        self.correct_threshold = float(correct_threshold)
        self.max_length = _check_length("max_length", max_length)
        _check_unit(length_unit)
        self.length_unit = length_unit
        self.values = dict(
            min_len_value_correct=float(min_len_value_correct),
            max_len_value_correct=float(max_len_value_correct),
            min_len_value_wrong=float(min_len_value_wrong),
            max_len_value_wrong=float(max_len_value_wrong),
        )
        if not all(math.isfinite(v) for v in self.values.values()):
            raise ValueError(f"CosineLengthReward: values must be finite, got {self.values}")
        self.value_range = (min(self.values.values()), max(self.values.values()))

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        correct = self.correctness.score(completions, samples) >= self.correct_threshold  # [N]
        return cosine_length_reward(
            completions, correct.tolist(), self.max_length, length_unit=self.length_unit, **self.values
        )


# ------------------------------------------------------------------------------------------------ repetition
def repetition_penalty(
    completions: Sequence[str], ngram_size: int = 3, max_penalty: float = -1.0, max_words: int = 50_000
) -> Tensor:
    """``[N]`` n-gram repetition penalty (Demystifying long CoT; ms-swift ``RepetitionPenalty``) in
    ``[max_penalty, 0]``:

    ``max_penalty * (1 - #distinct n-grams / #n-grams)`` over the lowercased whitespace-separated words; 0 for a
    completion with fewer than ``ngram_size`` words (or a non-string). Only the first ``max_words`` words are read,
    which bounds the work on huge inputs (a 1 MB completion costs milliseconds) and is far above a usual chain of
    thought.

    >>> repetition_penalty(["the cat sat on the mat", "go go go go go", "hi"], ngram_size=2)
    tensor([ 0.0000, -0.7500,  0.0000])
    """
    _check_length("ngram_size", ngram_size)
    _check_length("max_words", max_words)
    if not (math.isfinite(max_penalty) and max_penalty <= 0):
        raise ValueError(f"max_penalty must be finite and <= 0, got {max_penalty}")
    rewards = []
    for completion in completions:
        words = completion.split(maxsplit=max_words)[:max_words] if isinstance(completion, str) else []
        if len(words) < ngram_size:
            rewards.append(0.0)
            continue
        words = [w.lower() for w in words]
        ngrams = list(zip(*(words[i:] for i in range(ngram_size)), strict=False))  # [#words - n + 1] tuples
        rewards.append(max_penalty * (1.0 - len(set(ngrams)) / len(ngrams)) + 0.0)  # + 0.0: no -0.0
    return scores_in_range(rewards, (max_penalty, 0.0))


class RepetitionPenalty(RewardComponent):
    """n-gram repetition penalty (see :func:`repetition_penalty`); name ``"repetition_penalty"``.

    Args:
        ngram_size: n (ms-swift: 3).
        max_penalty: value of a completion that is one n-gram repeated, ``<= 0`` (ms-swift: -1.0); scale it here or
            with ``weight``.
        max_words: words read per completion.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"repetition_penalty"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> sample = VisualSample(images=[], question="q", task="t")
        >>> RepetitionPenalty().score(["one two three four", "la la la la la la"], [sample] * 2)
        tensor([ 0.0000, -0.7500])
    """

    completion_kinds = ("text",)

    value_range = (-1.0, 0.0)

    def __init__(
        self,
        ngram_size: int = 3,
        max_penalty: float = -1.0,
        max_words: int = 50_000,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.ngram_size = _check_length("ngram_size", ngram_size)
        self.max_words = _check_length("max_words", max_words)
        if not (math.isfinite(max_penalty) and max_penalty <= 0):
            raise ValueError(f"RepetitionPenalty: max_penalty must be finite and <= 0, got {max_penalty}")
        self.max_penalty = float(max_penalty)
        self.value_range = (self.max_penalty, 0.0)

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        return repetition_penalty(completions, self.ngram_size, self.max_penalty, self.max_words)


# ------------------------------------------------------------------------------------------------ overlong
def overlong_value(length: int, max_length: int, cache_length: int) -> float:
    """DAPO's soft overlong punishment of one length: 0, then linear, then -1."""
    start = max_length - cache_length
    if length <= start:
        return 0.0
    if length <= max_length:
        return (start - length) / cache_length
    return -1.0


def soft_overlong_penalty(
    completions: Sequence[str], max_length: int = 1024, cache_length: int = 256, length_unit: LengthUnit = "words"
) -> Tensor:
    """``[N]`` DAPO soft overlong punishment in [-1, 0], with ``L`` the completion length in ``length_unit``:

    ``0`` if ``L <= L_max - L_cache``; ``((L_max - L_cache) - L) / L_cache`` if ``L_max - L_cache < L <= L_max``
    (reaching -1 at ``L = L_max``); ``-1`` if ``L > L_max``. DAPO uses L_max = 20480 and L_cache = 4096 tokens.
    A non-string completion has length 0 (no penalty: length is all this measures).

    >>> soft_overlong_penalty(["w " * 768, "w " * 896, "w " * 1024, "w " * 1025], max_length=1024, cache_length=256)
    tensor([ 0.0000, -0.5000, -1.0000, -1.0000])
    """
    _check_length("max_length", max_length)
    _check_length("cache_length", cache_length)
    _check_unit(length_unit)
    if cache_length > max_length:
        raise ValueError(f"cache_length ({cache_length}) must be <= max_length ({max_length})")
    lengths = [text_length(c, length_unit, cap=max_length + 1) for c in completions]
    return scores_in_range([overlong_value(n, max_length, cache_length) for n in lengths], (-1.0, 0.0))


class SoftOverlongPenalty(RewardComponent):
    """DAPO soft overlong punishment (see :func:`soft_overlong_penalty`); name ``"soft_overlong_penalty"``.

    Args:
        max_length: L_max, in ``length_unit``; keep it at or below the sampling budget (``max_new_tokens``, in tokens)
            converted to the unit, or truncated completions are never reached.
        cache_length: L_cache, the width of the linear ramp before L_max.
        length_unit: ``"words"`` (whitespace-separated) or ``"chars"``.
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None:
            ``"soft_overlong_penalty"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> sample = VisualSample(images=[], question="q", task="t")
        >>> SoftOverlongPenalty(max_length=8, cache_length=4).score(["a " * 4, "a " * 6, "a " * 9], [sample] * 3)
        tensor([ 0.0000, -0.5000, -1.0000])
    """

    completion_kinds = ("text",)

    value_range = (-1.0, 0.0)

    def __init__(
        self,
        max_length: int = 1024,
        cache_length: int = 256,
        length_unit: LengthUnit = "words",
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.max_length = _check_length("max_length", max_length)
        self.cache_length = _check_length("cache_length", cache_length)
        if cache_length > max_length:
            raise ValueError(f"SoftOverlongPenalty: cache_length ({cache_length}) must be <= max_length ({max_length})")
        _check_unit(length_unit)
        self.length_unit = length_unit

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        return soft_overlong_penalty(completions, self.max_length, self.cache_length, self.length_unit)

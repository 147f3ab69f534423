"""Discrete accuracy reward: exact match of the ``<answer>`` block with the label, after normalisation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from app.rewards.base import RewardComponent
from app.rewards.parsing import extract_answer, normalize_answer
from app.types import VisualSample


def _match(completion: object, answer: str) -> bool:
    pred = extract_answer(completion)
    if pred is None:
        return False
    pred = normalize_answer(pred)
    return bool(pred) and pred == normalize_answer(answer)


def accuracy_reward(completions: Sequence[str], answers: Sequence[str]) -> Tensor:
    """``[N]`` float32: 1.0 where the first ``<answer>`` block matches ``answers[i]`` after
    :func:`~app.rewards.parsing.normalize_answer` (case, whitespace, trailing punctuation, option letters), else 0.0.

    A completion without an answer block, or with an empty one, scores 0. Every answer must be given (not ``None``).

    >>> accuracy_reward(["<answer> (B) </answer>", "<answer>b</answer>", "B"], ["b", "B.", "B"])
    tensor([1., 1., 0.])
    """
    if len(completions) != len(answers):
        raise ValueError(f"got {len(completions)} completions but {len(answers)} answers")
    for i, answer in enumerate(answers):
        if answer is None:
            raise ValueError(f"accuracy_reward needs a label for every completion; answers[{i}] is None")
    return torch.tensor(
        [float(_match(c, str(a))) for c, a in zip(completions, answers, strict=True)], dtype=torch.float32
    )


class AccuracyReward(RewardComponent):
    """Exact-match accuracy against ``sample.answer`` (see :func:`accuracy_reward`); name ``"accuracy"``.

    Needs labeled samples: a sample with ``answer=None`` raises ``ValueError``. Label-free training uses a consistency
    reward instead.

    Args:
        weight, name, kwargs: see :class:`~app.rewards.RewardComponent`.

    Example:
        >>> from app.types import VisualSample
        >>> sample = VisualSample(images=[], question="Which is closer? (A) cup (B) lamp", task="depth", answer="A")
        >>> reward = AccuracyReward()
        >>> reward.score(["<think>..</think><answer>(a)</answer>", "<answer>B</answer>"], [sample, sample])
        tensor([1., 0.])
    """

    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        for sample in samples:
            if sample.answer is None:
                raise ValueError(
                    f"{type(self).__name__} ({self.name!r}) needs labeled samples, but a sample of task "
                    f"{sample.task!r} has answer=None; label-free training must use a consistency reward instead"
                )
        return accuracy_reward(completions, [sample.answer for sample in samples])

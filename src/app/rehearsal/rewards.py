"""Rewards a rehearsal adds so that a random tiny model's groups have a spread of rewards (see
:mod:`app.rehearsal.recipe`): deterministic functions of the completion, meaningless as a training target."""

from __future__ import annotations

import torch

from app.rewards import RewardComponent


class CharacterCountReward(RewardComponent):
    """The completion's length in characters / 64: random tokens decode to strings of different lengths."""

    value_range = (0.0, float("inf"))

    def score(self, completions, samples):
        return torch.tensor([len(str(c)) / 64 for c in completions], dtype=torch.float32)


class PixelMeanReward(RewardComponent):
    """The mean pixel value of a generated image or video (in [0, 1]): every noise draw gives another."""

    value_range = (0.0, 1.0)

    def score(self, completions, samples):
        return torch.stack([torch.as_tensor(c).float().mean().clamp(0.0, 1.0) for c in completions])

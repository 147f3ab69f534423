"""Shared checks of the learned rewards: malformed renderings, the frozen-model contract, parsing from YAML."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from jsonargparse import ArgumentParser
from PIL import Image

from app.rewards import RewardComponent, WeightedReward

MALFORMED = {
    "0x0 image": np.zeros((0, 0, 3), np.uint8),
    "video of no frames": torch.rand(0, 3, 8, 8),
    "float64 array": np.zeros((8, 8, 3), np.float64),
    "one channel": np.zeros((8, 8), np.uint8),
    "RGBA picture": Image.new("RGBA", (8, 8)),
    "None": None,
}
"""Renderings no image reward can read (a string is a text completion for the judge, malformed for the others)."""


@pytest.fixture
def parse_rewards():
    """Parse a YAML list of reward components as the trainer's ``rewards:`` argument is parsed (jsonargparse,
    ``class_path`` / ``init_args``), instantiate it and wrap it in a :class:`WeightedReward`."""

    def parse(text: str) -> WeightedReward:
        parser = ArgumentParser(exit_on_error=False)
        parser.add_argument("--rewards", type=list[RewardComponent])
        config = parser.parse_string(text)
        return WeightedReward(parser.instantiate(config).rewards)

    return parse


@pytest.fixture
def check_frozen():
    """Assert the frozen-model contract of a reward that has scored once: no parameters or weights of its model
    exposed, the model frozen and in eval mode, picklable (the copy without the model)."""

    def check(reward) -> None:
        model = reward._frozen.model
        assert model is not None, "score the reward first"
        assert list(reward.parameters()) == [] and list(WeightedReward([reward]).parameters()) == []
        assert set(reward.state_dict()) <= {"total", "count"}  # the metric's states at most, never model weights
        assert not model.training and all(not p.requires_grad for p in model.parameters())
        copy = pickle.loads(pickle.dumps(reward))
        assert copy._frozen.model is None and reward._frozen.model is model  # the copy loads its own

    return check

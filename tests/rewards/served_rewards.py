"""A reward the server and remote-reward tests both serve: a plain helper module, not a test file (pytest collects
nothing here). Test files in this folder import it as ``from served_rewards import ...``."""

from __future__ import annotations

import torch

from app.rewards import RewardComponent


class CountingReward(RewardComponent):
    """1 for completions that are digits; counts the others in its side state, and raises on the text ``boom``."""

    side_state = ("num_malformed",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.num_malformed = 0

    def score(self, completions, samples):
        if "boom" in completions:
            raise RuntimeError("the scorer fell over")
        self.num_malformed += sum(not c.isdigit() for c in completions)
        return torch.tensor([1.0 if c.isdigit() else float("nan") if c == "nan" else 0.0 for c in completions])

"""The contract a reward keeps on untrusted completions, for the untrusted-input tests of every reward family: a plain
helper module, not a test file (pytest collects nothing here). Test files in this folder import it as
``from reward_contract import ...``: pytest puts the folder of a test file outside a package on ``sys.path``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from app.rewards import RewardComponent
from app.types import VisualSample


def assert_well_behaved(
    reward: RewardComponent, completions: Sequence[Any], samples: Sequence[VisualSample]
) -> torch.Tensor:
    """``reward.score`` gives one finite float32 value per completion inside the reward's ``value_range``, without
    raising, whatever the completions hold. Returns the values, for the caller's own checks of them."""
    values = reward.score(completions, samples)
    assert isinstance(values, torch.Tensor), (reward.name, type(values))
    assert values.shape == (len(completions),) and values.dtype == torch.float32, (reward.name, values)
    low, high = reward.value_range
    assert torch.isfinite(values).all() and ((low <= values) & (values <= high)).all(), (reward.name, values)
    return values

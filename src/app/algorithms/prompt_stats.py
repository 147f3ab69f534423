"""Advantages normalised by each prompt's running statistics over steps (flow_grpo's ``per_prompt_stat_tracking``).

A prompt drawn again at a later step is centred and scaled by every reward its recent groups got, not only by its
current group's K: with small K (video models) a group's own mean and std are noisy, and a prompt the policy already
solves stops producing large advantages from rounding-level spreads. Equation: docs/algorithms.md#grpo-advantages.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import torch
from torch import Tensor


class PromptStatTracker:
    """Per prompt key, the last ``history`` rewards its groups got; advantages against them.

    Args:
        history: rewards kept per prompt (the current group's included), at least the group size.
        eps: added to the std, as in :func:`~app.algorithms.advantages.group_advantages`.

    Example:
        >>> tracker = PromptStatTracker(history=8)
        >>> tracker.advantages(["a"], torch.tensor([0.0, 1.0])).tolist()  # first sight: the group's own statistics
        [-0.9998..., 0.9998...]
        >>> tracker.advantages(["a"], torch.tensor([1.0, 1.0])).tolist()  # now against 0, 1, 1, 1
        [0.5772..., 0.5772...]
    """

    def __init__(self, history: int = 64, eps: float = 1e-4) -> None:
        if history < 1:
            raise ValueError(f"the per-prompt history must hold at least 1 reward, got {history}")
        self.history = history
        self.eps = eps
        self.rewards: dict[str, collections.deque[float]] = {}

    def advantages(self, keys: Sequence[str], rewards: Tensor) -> Tensor:
        """``[N]`` advantages of ``rewards`` (``[N]``, group-major, ``len(keys)`` groups of K) after adding each group
        to its prompt's history: ``(r - mean) / (std + eps)`` over that history (population std). A group of equal
        rewards still gets an advantage when its prompt's earlier rewards were different (better or worse than they
        were is a signal); a history of equal rewards gives 0."""
        if rewards.numel() % max(len(keys), 1) or (len(keys) == 0) != (rewards.numel() == 0):
            raise ValueError(f"{rewards.numel()} rewards do not split into {len(keys)} groups")
        k = rewards.numel() // max(len(keys), 1)
        groups = rewards.detach().double().view(len(keys), k)  # [B, K]
        out = torch.zeros_like(groups)
        for b, key in enumerate(keys):
            seen = self.rewards.setdefault(key, collections.deque(maxlen=max(self.history, k)))
            seen.extend(groups[b].tolist())
            past = torch.tensor(list(seen), dtype=torch.float64)
            out[b] = (groups[b] - past.mean()) / (past.std(unbiased=False) + self.eps)
        return out.reshape(-1).to(rewards.dtype)  # [N]

    def state(self) -> dict[str, list[float]]:
        """Plain data for a checkpoint (one per rank: each rank tracks the prompts it drew)."""
        return {key: list(values) for key, values in self.rewards.items()}

    def load(self, state: dict[str, list[float]]) -> None:
        """Take back :meth:`state`, each history with the length it was kept at: ``max(history, K)`` (a history
        shorter than the group size holds the last full group, so its saved length is that K)."""
        self.rewards = {
            key: collections.deque(values, maxlen=max(self.history, len(values))) for key, values in state.items()
        }

"""What the overlapped pipeline carries from one training step to the next on one rank.

:class:`RolloutQueue` holds the rollouts generated but not trained yet (their rewards pending with the reward workers
until collected), the policy version counter that measures their lag, the reward workers themselves and dynamic
sampling's prompt sampler. It also owns how that state goes into a checkpoint and comes back, and the rule for the
rollout still pending when fit ends: dropped, counted and logged. :class:`~app.modules.grpo.GRPOModule` decides what a
step does with it (see :mod:`app.modules.pipeline` for the settings and the order of a step).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

import torch

from app.modules.pipeline import Generation, PipelineSettings, from_plain, reward_executor, to_device, to_plain
from app.modules.prompt_drawers import PromptDrawer, prompt_drawer, saved_drawer
from app.rewards import PendingRewards, WeightedReward
from app.types import RewardOutput, VisualSample

log = logging.getLogger(__name__)


class RolloutQueue:
    """Generated rollouts waiting for their update, oldest first, with the state that travels beside them.

    Args:
        settings: the pipeline's settings (``delay``, reward workers, time limit, the prompt sampler's seed).
        rewards: the module's weighted reward: submits a generation's outputs and gathers the values.

    Attributes:
        pending: the generations not trained yet (at most ``delay + 1`` between steps).
        version: rollouts trained so far: the policy version a new generation records.
        dropped: rollouts still pending when a fit ended.
        executor: the reward workers; built from ``settings`` on first use unless one is set here.
        built_executor: the executor this queue built, the one :meth:`close` shuts down (None before it builds one).
    """

    def __init__(self, settings: PipelineSettings, rewards: WeightedReward) -> None:
        self.settings = settings
        self.rewards = rewards
        self.pending: collections.deque[Generation] = collections.deque()
        self.version = 0
        self.dropped = 0
        self.executor: Executor | None = None
        self.built_executor: Executor | None = None
        self._drawer: PromptDrawer | None = None

    # ------------------------------------------------------------------------------------------------ a step
    def submit(self, generation: Generation, samples: Sequence[VisualSample], group_size: int) -> None:
        """Stamp ``generation`` with the policy version, hand its outputs to the reward workers (scored inline with
        ``delay: 0``) and queue it. ``samples`` are the B prompts; output ``b * K + k`` answers prompt ``b``."""
        generation.version = self.version
        grouped_samples = [s for s in samples for _ in range(group_size)]
        executor = self._executor() if self.settings.delay > 0 else None
        generation.rewards = self.rewards.submit(
            generation.outputs, grouped_samples, group_size=group_size, executor=executor
        )
        self.pending.append(generation)

    def take(self, device: torch.device) -> Generation | None:
        """The oldest generation once ``delay`` newer ones are queued behind it, its tensors on ``device`` (a restored
        one comes from the host); None while the pipeline is priming."""
        if len(self.pending) <= self.settings.delay:
            return None
        generation = self.pending.popleft()
        return to_device(generation, device)  # pragma: no mutate (equivalent off CUDA: .to(None) moves nothing)

    def collect(self, generation: Generation) -> RewardOutput:
        """``generation``'s rewards, waiting for the workers if they are still scoring it (up to the time limit)."""
        if isinstance(generation.rewards, PendingRewards):
            generation.rewards = self.rewards.gather(generation.rewards, self.settings.reward_timeout_s)
        return generation.rewards

    def trained(self, generation: Generation) -> int:
        """Count one trained rollout; ``generation``'s policy lag: updates made since it was sampled."""
        lag = self.version - generation.version
        self.version += 1
        return lag

    def drawer(self, rank: int, dataset: Any = None) -> PromptDrawer:
        """Dynamic sampling's prompt sampler, made when first asked for (see :func:`prompt_drawer`): for ``dataset``,
        or map-style (seeded with ``settings.seed + rank``) while no data set is named. One that does not take
        ``dataset`` is replaced: it was made, or restored, before the data set was known, and has not drawn from it."""
        if self._drawer is None or (dataset is not None and not self._drawer.takes(dataset)):
            self._drawer = prompt_drawer(dataset, self.settings.seed, rank)
        return self._drawer

    def _executor(self) -> Executor | None:
        if (
            self.executor is None
            and self.settings.workers != "inline"  # pragma: no mutate (equivalent: inline builds no executor anyway)
        ):
            self.executor = self.built_executor = reward_executor(self.settings)
        return self.executor

    # ------------------------------------------------------------------------------------------ checkpoints
    def state(self, rank: int) -> dict[str, Any]:
        """This rank's state as plain data: the pending rollouts with their rewards collected (waiting for them if
        needed: checkpoints are rare), the policy version and the prompt sampler's state (a generator state for
        map-style data, a stream position for shards: :meth:`PromptDrawer.state`)."""
        for generation in self.pending:
            self.collect(generation)
        pending = to_plain(list(self.pending))
        return {"pending": pending, "version": self.version, "drawer": self.drawer(rank).state()}

    def load_state(self, state: dict[str, Any], rank: int) -> None:
        """Take a state saved by :meth:`state` (the pending rollouts stay on the host until :meth:`take`)."""
        self.pending = collections.deque(from_plain(state["pending"]))
        self.version = state["version"]
        self._drawer = saved_drawer(state["drawer"], self.settings.seed, rank)

    # ----------------------------------------------------------------------------------------------- the end
    def close(self) -> None:
        """The rule for the last rollout: one still pending when fit ends is dropped (its queued rewards cancelled),
        counted and logged; reward workers this queue built are shut down without waiting for a running reward."""
        if self.pending:
            self.dropped += len(self.pending)
            log.info("rollout pipeline: %d generated rollout(s) left untrained at the end of fit", len(self.pending))
            for generation in self.pending:
                if isinstance(generation.rewards, PendingRewards):
                    for future in generation.rewards.futures.values():
                        future.cancel()
            self.pending.clear()
        if self.built_executor is not None and self.executor is self.built_executor:
            self.executor.shutdown(
                wait=False,  # pragma: no mutate (equivalent: shutdown joins its threads only when wait is truthy)
                cancel_futures=True,
            )
            self.executor = self.built_executor = None

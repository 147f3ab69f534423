"""What a GRPO run carries from one training step to the next on one rank, and the order of a step's rollout.

Every training step of :class:`~app.modules.grpo.GRPOModule` goes through :class:`RolloutQueue`: it generates a
rollout, submits it (its rewards scored inline with ``delay: 0``, handed to the reward workers with ``delay: 1``),
takes the oldest rollout whose turn it is, collects its rewards and trains on it. With ``delay: 0`` that is the rollout
of this very batch (rollout -> rewards -> update). With ``delay: 1`` each step generates rollout k+1 and trains on
rollout k (VBVR-Pro's "single-step lag"): rollout k was sampled by the policy before the previous update, so its
behaviour log-probs are stored at generation time and the clipped ratio uses them
(docs/algorithms.md#the-delayed-pipeline); the policy lag is at most one rollout. The first step of a delayed pipeline
only primes it (no update); the rollout still pending when fit ends is dropped (counted in ``dropped``).

The queue also holds the policy version counter that measures the lag, the reward workers, dynamic sampling's refill
and its prompt sampler (DAPO: :meth:`RolloutQueue.refill`), and how all of that goes into a checkpoint and comes back.
Its settings are :class:`~app.settings.PipelineSettings`.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import torch

from app.algorithms import zero_std_groups
from app.modules.checkpoints import gather_rank_states
from app.modules.plain_data import from_plain, to_device, to_plain
from app.modules.prompt_drawers import PromptDrawer, prompt_drawer, refill_source, saved_drawer
from app.rewards import PendingRewards, WeightedReward
from app.settings import PipelineSettings
from app.types import Generation, RewardOutput, Rollout, VisualSample

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "rollout_pipeline"
"""Where a checkpoint holds the queue's state: one entry per rank (rollouts never cross ranks)."""


def reward_executor(settings: PipelineSettings) -> Executor | None:
    """The executor ``settings`` asks for; None for ``inline``."""
    if settings.workers == "thread":
        return ThreadPoolExecutor(settings.num_workers, thread_name_prefix="reward")
    if settings.workers == "process":
        return ProcessPoolExecutor(settings.num_workers)
    return None


class RolloutQueue:
    """Generated rollouts waiting for their update, oldest first, with the state that travels beside them.

    Args:
        settings: the pipeline's settings (``delay``, reward workers, time limit, dynamic sampling, its seed).
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
    def submit(self, generation: Generation, rows_per_prompt: int) -> None:
        """Stamp ``generation`` with the policy version, hand its outputs to the reward workers (scored inline with
        ``delay: 0``) and queue it. Output ``b * K + k`` answers prompt ``b`` of ``generation.samples``."""
        generation.version = self.version
        executor = self._executor() if self.settings.delay > 0 else None
        # group_size is K for the rewards that read it (see GRPOModule.score)
        generation.rewards = self.rewards.submit(
            generation.outputs,
            grouped(generation.samples, rows_per_prompt),
            group_size=rows_per_prompt,
            executor=executor,
        )
        self.pending.append(generation)

    def take(self, device: torch.device) -> Generation | None:
        """The oldest generation once ``delay`` newer ones are queued behind it, its tensors on ``device`` (a restored
        one comes from the host); None while the pipeline is priming."""
        if len(self.pending) <= self.settings.delay:
            return None
        return to_device(self.pending.popleft(), device)

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

    def _executor(self) -> Executor | None:
        if self.executor is None and self.settings.workers != "inline":
            self.executor = self.built_executor = reward_executor(self.settings)
        return self.executor

    # ---------------------------------------------------------------------------------------- dynamic sampling
    def refill(
        self,
        rollout: Rollout,
        loader: Any,
        rank: int,
        roll_out: Callable[[list[VisualSample]], Rollout],
        any_rank: Callable[[bool], bool],
    ) -> tuple[list[Rollout], dict[str, torch.Tensor]]:
        """DAPO's dynamic sampling: roll out and score more prompts (``roll_out``, inline) until B groups carry a
        signal or ``max_extra_rollouts`` more were made; groups past the first B informative ones are left out of the
        loss. The prompts are drawn from ``loader``'s data by :meth:`drawer`. ``any_rank(local)`` is True on every rank
        when ``local`` is on any: every rank rolls out as often as the neediest one, so ranks generate (and, sharded,
        forward) in lockstep."""
        k, num_prompts = rollout.rows_per_prompt, len(rollout.samples)
        rollouts = [rollout]
        informative = int((~zero_std_groups(rollout.rewards.total, k)).sum())
        extra_rollouts = 0
        while extra_rollouts < self.settings.max_extra_rollouts and any_rank(informative < num_prompts):
            dataset, count, collate = refill_source(loader, num_prompts)
            more = roll_out(self.drawer(rank, dataset).draw(dataset, count, collate))
            rollouts.append(more)
            informative += int((~zero_std_groups(more.rewards.total, k)).sum())
            extra_rollouts += 1
        budget = num_prompts
        for part in rollouts:  # keep the first B informative groups, in order
            for group in (~zero_std_groups(part.rewards.total, k)).nonzero().flatten().tolist():
                if budget > 0:
                    budget -= 1
                else:
                    part.loss_mask[group * k : (group + 1) * k] = 0
        logs = {
            "train/dynamic/extra_rollouts": torch.tensor(float(extra_rollouts)),
            "train/dynamic/informative_groups": torch.tensor(float(min(informative, num_prompts))),
        }
        return rollouts, logs

    def drawer(self, rank: int, dataset: Any = None) -> PromptDrawer:
        """Dynamic sampling's prompt sampler, made when first asked for (see :func:`prompt_drawer`): for ``dataset``,
        or map-style (seeded with ``settings.seed + rank``) while no data set is named. One that does not take
        ``dataset`` is replaced: it was made, or restored, before the data set was known, and has not drawn from it."""
        if self._drawer is None or (dataset is not None and not self._drawer.takes(dataset)):
            self._drawer = prompt_drawer(dataset, self.settings.seed, rank)
        return self._drawer

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

    def save(self, checkpoint: dict, rank: int) -> None:
        """Put every rank's state into ``checkpoint`` (a collective: every rank calls it) when the pipeline carries
        any (:attr:`~app.settings.PipelineSettings.carries_state`). Pending rollouts cannot be made up, so no rank
        derives its state from another's."""
        if self.settings.carries_state:
            checkpoint[CHECKPOINT_KEY] = gather_rank_states(self.state(rank))

    def load(self, checkpoint: dict, rank: int, world_size: int) -> None:
        """Take this rank's state back from ``checkpoint``.

        On another number of processes than saved: a checkpoint with queued rollouts (``delay: 1``) is refused, since
        a queued rollout belongs to the rank that generated it (its prompts, groups and behaviour log-probs) and
        trains there; without any (dynamic sampling alone) ranks that existed take their prompt sampler back, a new
        rank starts its own as a fresh run would (seeded ``seed + rank``), and every rank takes the saved version."""
        states = checkpoint.get(CHECKPOINT_KEY)
        if not states or not self.settings.carries_state:
            return
        if len(states) != world_size and any(state["pending"] for state in states):
            raise ValueError(
                f"the checkpoint was saved by {_processes(len(states))} with queued rollouts (pipeline.delay 1), this "
                f"run has {_processes(world_size)}: a queued rollout belongs to the rank that generated it (its "
                f"prompts, groups and behaviour log-probs) and cannot move to another; resume on "
                f"{_processes(len(states))}"
            )
        if rank < len(states):
            self.load_state(states[rank], rank)
        else:
            self.pending, self.version, self._drawer = collections.deque(), states[0]["version"], None

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
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = self.built_executor = None


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def grouped(samples: Sequence[VisualSample], rows_per_prompt: int) -> list[VisualSample]:
    """Each sample repeated ``rows_per_prompt`` times, group-major: the sample output ``b * K + k`` answers."""
    return [s for s in samples for _ in range(rows_per_prompt)]

"""The one-step-delayed rollout/reward pipeline: its settings, the unscored rollout it carries between steps, the reward
workers, and how a pending rollout travels in a checkpoint.

With ``delay: 1`` each training step generates rollout k+1 and hands it to the reward workers, then waits for the
rewards of rollout k and updates the policy with it (VBVR-Pro's "single-step lag"). Rollout k was sampled by the policy
before the previous update, so its behaviour log-probs are stored at generation time and the clipped ratio uses them
(docs/algorithms.md#the-delayed-pipeline): the policy lag is at most one rollout. The first step only primes the
pipeline (no update); the rollout still pending when fit ends is dropped (counted in ``dropped_rollouts``).

Dynamic sampling (DAPO) refills a batch whose groups carry no signal: see :class:`PipelineSettings`.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from app.rewards import PendingRewards
from app.types import CompletionBatch, PromptInputs, RewardOutput, VisualSample


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """How rollouts, rewards and updates overlap, and whether flat groups are refilled.

    Attributes:
        delay: 0: rollout -> rewards -> update in one step (rewards scored inline, as without a pipeline). 1: the step
            generates rollout k+1 and submits its rewards, then updates with rollout k (policy lag <= 1 rollout).
        workers: where rewards run when ``delay`` is 1: ``thread`` (cheap text rewards), ``process`` (CPU scorers; the
            reward and its inputs are pickled to the workers), ``inline`` (in the training thread, no overlap). A reward
            with its own workers (``VBVRScorerReward(num_workers > 0)``) uses them whatever this says. An executor set
            on the module (``module.reward_executor = ...``) replaces this one.
        num_workers: threads or processes of the reward executor.
        reward_timeout_s: how long a step waits for a rollout's rewards before failing with a ``RewardError`` naming
            the reward (None: no limit; a dead worker process fails at once either way).
        dynamic_sampling: DAPO's dynamic sampling: groups whose rewards are all equal are dropped, and more prompts
            are rolled out and scored until the step holds B informative groups or ``max_extra_rollouts`` more
            rollouts were made; surplus groups are left out of the loss. The extra rollouts are scored inline (they
            are on the critical path). The extra prompts come from the training data without moving the main loader:
            drawn by index from a map-style data set by a seeded sampler (``seed`` + rank; :class:`~app.modules.prompt_drawers.IndexDrawer`), or,
            for streamed shards (``ShardDataModule``), from a second, seeded pass over this rank's training stream
            that cycles through epochs (:class:`~app.modules.prompt_drawers.StreamDrawer`). Either resumes from a checkpoint where it stood. Any
            other data set (an ``IterableDataset`` of your own) is refused with a ``TypeError``.
        max_extra_rollouts: cap on extra rollouts per step (logged as ``train/dynamic/extra_rollouts``).
        seed: seeds the prompt sampler of dynamic sampling (with the rank for map-style data; for shards, the refill
            stream's seed is derived from it alone: see :class:`~app.modules.prompt_drawers.StreamDrawer`).
    """

    delay: int = 0
    workers: Literal["thread", "process", "inline"] = "thread"
    num_workers: int = 1
    reward_timeout_s: float | None = None
    dynamic_sampling: bool = False
    max_extra_rollouts: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.delay not in (0, 1):
            raise ValueError(f"pipeline.delay must be 0 or 1, got {self.delay}")
        if self.workers not in ("thread", "process", "inline"):
            raise ValueError(f"pipeline.workers must be 'thread', 'process' or 'inline', got {self.workers!r}")
        if self.num_workers < 1:
            raise ValueError(f"pipeline.num_workers must be >= 1, got {self.num_workers}")
        if self.reward_timeout_s is not None and not self.reward_timeout_s > 0:
            raise ValueError(f"pipeline.reward_timeout_s must be > 0 or null, got {self.reward_timeout_s}")
        if self.max_extra_rollouts < 0:
            raise ValueError(f"pipeline.max_extra_rollouts must be >= 0, got {self.max_extra_rollouts}")

    @property
    def overlapped(self) -> bool:
        """Whether training steps run through the pipeline instead of the plain rollout -> update."""
        return self.delay > 0 or self.dynamic_sampling


@dataclasses.dataclass
class Generation:
    """A rollout before its rewards are in.

    Attributes:
        samples: the B prompts.
        outputs: the N = B * K outputs the rewards score (texts, or decoded images / videos).
        parts: the family's container fields other than rewards, advantages and loss mask (behaviour log-probs
            included); :meth:`~app.modules.grpo.GRPOModule.finish_rollout` builds the container from them.
        version: rollouts trained before this one was generated (the policy that sampled it).
        rewards: pending while the workers score it, a :class:`RewardOutput` once collected.
    """

    samples: list[VisualSample]
    outputs: list[Any]
    parts: dict[str, Any]
    version: int
    rewards: PendingRewards | RewardOutput | None = None


def reward_executor(settings: PipelineSettings) -> Executor | None:
    """The executor ``settings`` asks for; None for ``inline``."""
    if settings.workers == "thread":
        return ThreadPoolExecutor(settings.num_workers, thread_name_prefix="reward")
    if settings.workers == "process":
        return ProcessPoolExecutor(settings.num_workers)
    return None


# ------------------------------------------------------------------------------------------------ checkpoints
_TYPES = {cls.__name__: cls for cls in (PromptInputs, CompletionBatch, RewardOutput, VisualSample, Generation)}
"""The containers a pending rollout holds; checkpoints store them as plain data (they load with weights_only=True)."""


def to_plain(value: Any) -> Any:
    """``value`` as tensors, numbers, strings, lists and dicts only (what ``torch.load(weights_only=True)`` reads)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, Image.Image):
        return {"__type__": "Image", "mode": value.mode, "pixels": torch.from_numpy(np.array(value))}
    if isinstance(value, np.ndarray):
        return {"__type__": "ndarray", "data": torch.from_numpy(np.ascontiguousarray(value))}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"cannot store a dict with non-string keys in a checkpoint: {list(value)[:3]}")
        return {"__type__": "dict", "items": {k: to_plain(v) for k, v in value.items()}}
    if type(value).__name__ in _TYPES and dataclasses.is_dataclass(value):
        fields = {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__type__": type(value).__name__, "fields": fields}
    raise TypeError(f"cannot store a {type(value).__name__} of a pending rollout in a checkpoint")


def from_plain(value: Any) -> Any:
    """The inverse of :func:`to_plain` (tensors stay on the host)."""
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value["__type__"]
    if kind == "dict":
        return {k: from_plain(v) for k, v in value["items"].items()}
    if kind == "Image":
        return Image.fromarray(value["pixels"].numpy(), mode=value["mode"])
    if kind == "ndarray":
        return value["data"].numpy()
    return _TYPES[kind](**{k: from_plain(v) for k, v in value["fields"].items()})


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor it holds (in dicts, lists and the pipeline's containers) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and type(value).__name__ in _TYPES:
        return dataclasses.replace(
            value, **{f.name: to_device(getattr(value, f.name), device) for f in dataclasses.fields(value)}
        )
    return value

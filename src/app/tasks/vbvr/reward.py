"""The VBVR-Pro task scorers (:mod:`app.tasks.vbvr`) as a TorchMetrics-style reward for generated images and videos,
optionally in a process pool.

A sample names its task in ``sample.meta["vbvr"] = {"task": name, "params": {...}, "config": {...}}`` (what the shard
writer stores); ``completions[i]`` is the generated rendering: a uint8 ``[H, W, 3]`` image or ``[T, H, W, 3]`` video
(numpy), a PIL image, or a float tensor in [0, 1] shaped ``[3, H, W]`` or ``[T, 3, H, W]`` (what a diffusers VAE decodes
to). Scoring is pure CPU work, so with ``num_workers > 0`` it runs in a process pool and :meth:`score_async` lets the
trainer overlap it with model work.

Generations are untrusted: one that cannot be read (wrong shape or dtype, a 0 x 0 image, a video of no frames) or that
a task's scorer cannot measure (a size it does not expect) scores the low end of ``value_range``, is counted in
``num_malformed`` and is logged as a warning; it never fails the batch.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor

from app.cv import to_uint8_frames as to_uint8_frames  # re-exported: how renderings are read
from app.rewards.base import RewardComponent
from app.tasks.vbvr.regimes import problem_frames
from app.tasks.vbvr.registry import get_task
from app.types import VisualSample

log = logging.getLogger(__name__)


@lru_cache(maxsize=256)
def _task(name: str, params_key: tuple):
    return get_task(name, **dict(params_key))


def score_one(job: tuple[str, dict, dict, np.ndarray]) -> float:
    """Score one rendering (a module-level function so a process pool can run it)."""
    name, params, config, frames = job
    return _task(name, tuple(sorted(params.items()))).score(frames, config).score


_MEASURE_ERRORS = (ValueError, IndexError, cv2.error)
"""What a task's scorer raises on a rendering it cannot measure (a size it does not expect, a degenerate frame)."""


def _score_or_error(job: tuple[str, dict, dict, np.ndarray]) -> tuple[float, str | None, tuple[str, ...]]:
    """``(score, None, failed checks as "task/check")``, or ``(nan, why, ())`` when the scorer cannot measure the
    rendering (runs in a pool too)."""
    name, params, config, frames = job
    try:
        result = _task(name, tuple(sorted(params.items()))).score(frames, config)
    except _MEASURE_ERRORS as error:
        return float("nan"), f"{type(error).__name__}: {error}", ()
    return result.score, None, tuple(f"{name}/{check.name}" for check in result.checks if not check.passed)


class VBVRScorerReward(RewardComponent):
    """Deterministic classical-CV score of a generated image or video against its task's configuration; in [0, 1].

    Attributes:
        num_malformed: renderings scored the low end of ``value_range`` because they could not be read or measured
            (cumulative; each is logged as a warning).
        failed_checks: ``(task, check) -> count`` of scored renderings that did not fully pass that check
            (cumulative; ``callbacks.reward_breakdown`` logs it).

    Args:
        num_workers: processes for scoring (0: in this process).
        weight: this reward's weight in the weighted sum (:class:`~app.rewards.WeightedReward`); finite, and 0
            logs it without adding it to the total.
        name: its log name (``train/reward/<name>``), unique among a module's rewards; None: ``"vbvr_scorer"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
    """

    completion_kinds = ("image", "array")  # text scores as malformed
    side_state = ("num_malformed", "failed_checks")

    def __init__(self, num_workers: int = 0, weight: float = 1.0, name: str | None = None, **kwargs) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        self.num_workers = num_workers
        self._pool: ProcessPoolExecutor | None = None
        self.num_malformed = 0
        self.failed_checks: Counter[tuple[str, str]] = Counter()  # (task, check) -> renderings that failed it

    def _jobs(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> list[tuple | None]:
        jobs = []
        for i, (rendering, sample) in enumerate(zip(completions, samples, strict=True)):
            spec = sample.meta.get("vbvr")
            if not spec or "task" not in spec or "config" not in spec:
                raise ValueError(f"sample {i} ({sample.task!r}) has no meta['vbvr'] with task and config")
            try:
                frames = problem_frames(rendering, spec)
            except ValueError as error:  # a malformed generation scores low; counted and logged, never a crash
                self._malformed(i, str(error))
                jobs.append(None)
                continue
            jobs.append((spec["task"], dict(spec.get("params", {})), spec["config"], frames))
        return jobs

    def _malformed(self, index: int, why: str) -> None:
        self.num_malformed += 1
        log.warning(
            "vbvr reward: completion %d scored %s (malformed; %d so far): %s",
            index,
            self.value_range[0],
            self.num_malformed,
            why,
        )

    def _values(self, results: list[tuple[float, str | None] | None]) -> Tensor:
        """Scores from ``results`` (None: unreadable, already counted); counts those the scorer could not measure."""
        values = []
        for i, result in enumerate(results):
            if result is not None and result[1] is not None:
                self._malformed(i, result[1])
            values.append(self.value_range[0] if result is None or result[1] is not None else result[0])
            if result is not None and len(result) > 2:
                self.failed_checks.update(tuple(failed.split("/", 1)) for failed in result[2])
        return torch.tensor(values, dtype=torch.float32)

    def score(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> Tensor:
        if self.num_workers <= 0:
            return self._values([_score_or_error(j) if j else None for j in self._jobs(completions, samples)])
        return self._pool_scores(completions, samples).result()

    def start_on_own_workers(
        self, completions: Sequence[Any], samples: Sequence[VisualSample], group_size: int | None = None
    ) -> Future | None:
        """A future of the ``[N]`` scores from this reward's own process pool when ``num_workers > 0``; else None, and
        :meth:`score_async` scores as any reward does (in its ``executor``, or at once without one)."""
        return self._pool_scores(completions, samples) if self.num_workers > 0 else None

    def _pool_scores(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> Future:
        jobs = self._jobs(completions, samples)
        result: Future = Future()
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.num_workers)
        futures = [self._pool.submit(_score_or_error, j) if j else None for j in jobs]
        pending = [f for f in futures if f is not None]
        remaining = [len(pending)]

        def done(_):
            remaining[0] -= 1
            if remaining[0] == 0:
                try:
                    result.set_result(self._values([f.result() if f is not None else None for f in futures]))
                except Exception as error:  # a scorer bug or a dead worker: the caller sees it on result()
                    result.set_exception(error)

        if not pending:
            result.set_result(self._values([None] * len(jobs)))
        for f in pending:
            f.add_done_callback(done)
        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __getstate__(self):
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state["_pool"] = None
        return state

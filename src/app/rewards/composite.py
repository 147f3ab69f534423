"""Weighted composition of reward components: ``total = sum_c weight_c * value_c``."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass

import torch
from torch import Tensor

from app.rewards.base import RewardComponent, RewardError, VerifiedScores
from app.types import RewardOutput, VisualSample


@dataclass
class PendingRewards:
    """Rewards being scored: one future of raw values per component (see :meth:`WeightedReward.submit`).

    Attributes:
        futures: component name -> ``Future`` of its raw ``[N]`` values.
        num_completions: N.
    """

    futures: dict[str, Future]
    num_completions: int

    def done(self) -> bool:
        return all(f.done() for f in self.futures.values())


class WeightedReward(torch.nn.Module):
    """Scores completions with every component and sums them with the components' weights.

    Not a ``Metric`` itself: it holds the component metrics. It is an ``nn.Module`` only so that a LightningModule
    that stores it as an attribute moves the components' states to its device (distributed sync needs them there).

    Non-finite component values (NaN, inf) are replaced by 0, counted in :attr:`num_nonfinite` (cumulative; per
    component in :attr:`nonfinite_counts`) and reported with a ``RuntimeWarning`` naming the component.

    Args:
        components: the rewards; their ``name`` values must be unique.

    Example:
        >>> from app.rewards import AccuracyReward, FormatReward
        >>> from app.types import VisualSample
        >>> rewards = WeightedReward([AccuracyReward(), FormatReward(weight=0.5)])
        >>> sample = VisualSample(images=[], question="Is the mug on the table?", task="spatial", answer="yes")
        >>> out = rewards(["<think>it is</think><answer>Yes</answer>", "<answer>yes</answer>"], [sample, sample])
        >>> out.total
        tensor([1.5000, 1.0000])
        >>> out.components["format"]
        tensor([1., 0.])
    """

    def __init__(self, components: Sequence[RewardComponent]) -> None:
        super().__init__()
        components = list(components)
        if not components:
            raise ValueError("WeightedReward needs at least one reward component")
        for component in components:
            if not isinstance(component, RewardComponent):
                raise TypeError(f"reward components must be RewardComponent instances, got {type(component).__name__}")
            component.check_side_state()  # a misnamed counter fails here, not in a worker process
        duplicates = sorted(name for name, n in Counter(c.name for c in components).items() if n > 1)
        if duplicates:
            raise ValueError(
                f"reward component names must be unique (they are log keys); duplicated: {duplicates}. "
                "Pass name=... to tell them apart"
            )
        self.components = torch.nn.ModuleList(components)
        self.num_nonfinite = 0
        self.nonfinite_counts: dict[str, int] = {c.name: 0 for c in components}

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    @property
    def weights(self) -> dict[str, float]:
        return {c.name: c.weight for c in self.components}

    def forward(
        self,
        completions: Sequence[str],
        samples: Sequence[VisualSample],
        *,
        group_size: int | None = None,
        accumulate: bool = False,
    ) -> RewardOutput:
        """Score a batch: ``total`` ``[N]`` and every unweighted component ``[N]``.

        Args:
            completions: N completion texts.
            samples: N samples, ``samples[i]`` the prompt of ``completions[i]``.
            group_size: K, when the rows are groups of K outputs per prompt (handed to group-level rewards).
            accumulate: also add the values to each component's metric state (as :meth:`update` would), without
                scoring twice.
        """
        scored: dict[str, VerifiedScores] = {}
        for component in self.components:
            raw = component.raw_score(completions, samples, group_size)
            scored[component.name] = verified = component.verified(raw, len(completions))
            if accumulate:
                component.update(completions, samples, scores=verified.values)
        return self._combine(scored, len(completions), stacklevel=6)  # the caller, above nn.Module's two frames

    def submit(
        self,
        completions: Sequence,
        samples: Sequence[VisualSample],
        *,
        group_size: int | None = None,
        executor: Executor | None = None,
    ) -> PendingRewards:
        """Start scoring a batch without waiting: each component's :meth:`~app.rewards.RewardComponent.score_async`
        (in ``executor``, in its own workers, or at once). Collect the :class:`RewardOutput` with :meth:`gather`."""
        futures: dict[str, Future] = {}
        for component in self.components:
            try:
                futures[component.name] = component.score_async(completions, samples, group_size, executor)
            except Exception as error:  # a broken pool refuses work at once: report it where it is collected
                futures[component.name] = failed = Future()
                failed.set_exception(error)
        return PendingRewards(futures, len(completions))

    def gather(self, pending: PendingRewards, timeout: float | None = None) -> RewardOutput:
        """Wait for a batch started by :meth:`submit` and combine it as :meth:`forward` does.

        A component that raised (here or in a worker, a dead worker process included) or that gave no result within
        ``timeout`` seconds fails with :class:`~app.rewards.RewardError` naming it. The side state a component scored in
        a worker process accumulated is added to it here (:meth:`~app.rewards.RewardComponent.collect`), once per batch.
        """
        scored: dict[str, VerifiedScores] = {}
        for component in self.components:
            future = pending.futures[component.name]
            try:
                raw = component.collect(future.result(timeout))
            except FutureTimeoutError:
                raise RewardError(f"reward {component.name!r} gave no result within {timeout} s") from None
            except RewardError:  # already names the reward and the cause
                raise
            except Exception as error:
                raise RewardError(f"reward {component.name!r} failed: {type(error).__name__}: {error}") from error
            scored[component.name] = component.verified(raw, pending.num_completions)
        return self._combine(scored, pending.num_completions, stacklevel=4)

    def _combine(self, scored: dict[str, VerifiedScores], num_completions: int, stacklevel: int) -> RewardOutput:
        """The :class:`RewardOutput` of every component's verified values: non-finite values counted and reported
        (the warning points ``stacklevel`` frames up), the rows any component left unscored marked."""
        nonfinite = 0
        for component in self.components:
            nonfinite += self._count_nonfinite(component, scored[component.name].num_nonfinite, stacklevel)
        unscored = None
        for component in self.components:
            rows = scored[component.name].unscored
            if rows is not None:
                unscored = rows if unscored is None else unscored | rows
        output = self._total({name: s.values for name, s in scored.items()}, num_completions, nonfinite)
        output.unscored = unscored
        return output

    def _count_nonfinite(self, component: RewardComponent, num_nonfinite: int, stacklevel: int) -> int:
        if num_nonfinite:
            self.num_nonfinite += num_nonfinite
            self.nonfinite_counts[component.name] += num_nonfinite
            warnings.warn(
                f"reward {component.name!r} returned {num_nonfinite} non-finite value(s) (NaN/inf); replaced by 0",
                RuntimeWarning,
                stacklevel=stacklevel,
            )
        return num_nonfinite

    def _total(self, values: dict[str, Tensor], num_completions: int, num_nonfinite: int) -> RewardOutput:
        device = next(iter(values.values())).device
        total = torch.zeros(num_completions, dtype=torch.float32, device=device)  # [N]
        for component in self.components:
            value = values[component.name].to(device)
            total = total + component.weight * value
        return RewardOutput(total=total, components=values, num_nonfinite=num_nonfinite)

    def update(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> None:
        """Update every component metric with this batch."""
        for component in self.components:
            component.update(completions, samples)

    def compute(self) -> dict[str, Tensor]:
        """Accumulated mean of every component, by name."""
        return {component.name: component.compute() for component in self.components}

    def reset(self) -> None:
        """Reset every component metric (the non-finite counters are kept: they are cumulative)."""
        for component in self.components:
            component.reset()

"""The reward contract: a TorchMetrics ``Metric`` that scores each completion.

A reward implements one method, ``score(completions, samples) -> Tensor[N]``; training uses those values directly and
``update``/``compute`` accumulate their mean for logging and evaluation, synchronised across processes by TorchMetrics.
Writing a new reward and composing it with the built-in ones:

>>> import torch
>>> from app.rewards import FormatReward, RewardComponent, WeightedReward
>>> from app.types import VisualSample
>>> class ShortReward(RewardComponent):  # name "short"
...     def score(self, completions, samples):
...         return torch.tensor([float(len(c) < 200) for c in completions])
>>> rewards = WeightedReward([FormatReward(), ShortReward(weight=0.5)])
>>> sample = VisualSample(images=[], question="Is the cube red?", task="color", answer="yes")
>>> rewards(["<think>It is.</think><answer>yes</answer>"], [sample]).total
tensor([1.5000])
"""

from __future__ import annotations

import math
import re
import warnings
from abc import abstractmethod
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from typing import Any, ClassVar

import torch
from torch import Tensor
from torchmetrics import Metric

from app.types import VisualSample

SCOPES = ("completion", "group_pair", "triplet")


class RewardError(RuntimeError):
    """A reward failed while scoring asynchronously (in a worker thread or process); the message names the reward."""


def _score_in_worker(component: RewardComponent, completions, samples, grouping: dict[str, Any]):
    """Run ``component.score`` where an executor puts it (a module-level function, so process pools can pickle it)."""
    values = component.score(completions, samples, **grouping)
    return values.result() if isinstance(values, Future) else values


def default_name(cls: type) -> str:
    """Snake-case class name without a trailing ``Reward``: ``FormatReward`` -> ``format``, ``OTConsistencyReward`` ->
    ``ot_consistency``."""
    stem = cls.__name__.removesuffix("Reward") or cls.__name__
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", stem).lower()


class RewardComponent(Metric):
    """Base class of every reward: one float per completion, accumulated as a mean.

    Subclasses implement :meth:`score`. ``samples[i]`` is the prompt of ``completions[i]``: the trainer repeats each
    sample K times, group-major (row ``b * K + k``), and passes K as ``group_size`` to rewards of scope
    ``"group_pair"`` (their ``score`` takes it as a keyword; without it they find a group as the consecutive rows
    holding the same sample object). Completions are untrusted model text: ``score`` must map
    anything malformed to a value in :attr:`value_range` (usually its lower end) and never raise on it; raising is for
    misconfiguration (for example labels missing for a reward that needs them).

    Class attributes a subclass may override:

    - ``scope``: which rows one value may depend on. ``"completion"``: only its own row. ``"group_pair"``: the rows of
      its group and of the paired group (a prompt and its augmented twin, for consistency rewards). ``"triplet"``: the
      rows of the three related prompts (TriSR). Whatever the scope, ``score`` returns one value per row.
    - ``value_range``: ``(low, high)`` bounds of every value ``score`` returns.

    Args:
        weight: weight of this component in a :class:`~app.rewards.WeightedReward` total.
        name: log name (``train/reward/<name>``); default: the snake-case class name without ``Reward``.
        kwargs: passed to :class:`torchmetrics.Metric` (``dist_sync_on_step``, ``compute_on_cpu``, ...).

    Example:
        >>> import torch
        >>> from app.types import VisualSample
        >>> class LengthReward(RewardComponent):
        ...     def score(self, completions, samples):
        ...         return torch.tensor([min(len(c) / 10, 1.0) for c in completions])
        >>> reward = LengthReward(weight=0.1)
        >>> reward.name, reward.weight
        ('length', 0.1)
        >>> sample = VisualSample(images=[], question="?", task="demo")
        >>> reward.update(["12345", "1234567890"], [sample, sample])
        >>> reward.compute()
        tensor(0.7500)
    """

    higher_is_better: ClassVar[bool] = True
    full_state_update: ClassVar[bool] = False
    is_differentiable: ClassVar[bool] = False
    scope: ClassVar[str] = "completion"
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    total: Tensor
    count: Tensor

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.scope not in SCOPES:
            raise TypeError(f"{cls.__name__}.scope must be one of {SCOPES}, got {cls.scope!r}")
        low, high = cls.value_range
        if not low <= high:
            raise TypeError(f"{cls.__name__}.value_range must be (low, high) with low <= high, got {cls.value_range}")

    def __init__(self, weight: float = 1.0, name: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        weight = float(weight)
        if not math.isfinite(weight):
            raise ValueError(f"{type(self).__name__}: weight must be finite, got {weight}")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"{type(self).__name__}: name must be a non-empty string, got {name!r}")
        self.weight = weight
        self.name = name if name is not None else default_name(type(self))
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0), dist_reduce_fx="sum")

    @abstractmethod
    def score(self, completions: Sequence[str], samples: Sequence[VisualSample]) -> Tensor:
        """One value per completion, ``[N]`` float32, each within :attr:`value_range` (or a ``Future`` of them: a
        reward may be asynchronous by contract, see :meth:`score_async`)."""

    def _grouping(self, group_size: int | None) -> dict[str, int]:
        return {"group_size": group_size} if group_size is not None and self.scope == "group_pair" else {}

    def score_async(
        self,
        completions: Sequence[Any],
        samples: Sequence[VisualSample],
        group_size: int | None = None,
        executor: Executor | None = None,
    ) -> Future:
        """Start scoring and return a ``Future`` of the raw values (checked by :meth:`check_values` when collected).

        By default :meth:`score` runs in ``executor`` (a thread pool, or a process pool: then the reward and its inputs
        are pickled to the worker), or at once in this thread without one; a ``score`` that itself returns a future is
        passed through. A reward with workers of its own (:class:`~app.rewards.VBVRScorerReward`) overrides this.
        """
        grouping = self._grouping(group_size)
        if executor is not None:
            return executor.submit(_score_in_worker, self, completions, samples, grouping)
        future: Future = Future()
        try:
            values = self.score(completions, samples, **grouping)
        except Exception as error:  # surfaces, named, where the future is collected
            future.set_exception(error)
            return future
        if isinstance(values, Future):
            return values
        future.set_result(values)
        return future

    def checked_score(
        self, completions: Sequence[str], samples: Sequence[VisualSample], group_size: int | None = None
    ) -> tuple[Tensor, int]:
        """:meth:`score` with its contract enforced: ``([N] float32 values, number of non-finite values)``.

        ``group_size`` (K) reaches :meth:`score` for rewards of scope ``"group_pair"``, the ones that compare groups.

        Non-finite values (NaN, inf) are replaced by 0 and counted; the caller decides how to report them.
        A wrong length or shape is a bug in the reward and raises ``ValueError``.
        """
        if len(completions) != len(samples):
            raise ValueError(
                f"reward {self.name!r}: got {len(completions)} completions but {len(samples)} samples; "
                "pass one sample per completion (repeat each prompt's sample K times)"
            )
        values = self.score(completions, samples, **self._grouping(group_size))
        if isinstance(values, Future):
            values = values.result()
        return self.check_values(values, len(completions))

    def check_values(self, values: Any, num_completions: int) -> tuple[Tensor, int]:
        """The contract of :meth:`checked_score` on values already computed: ``([N] float32, number non-finite)``."""
        values = torch.as_tensor(values, dtype=torch.float32)
        if values.shape != (num_completions,):
            raise ValueError(
                f"reward {self.name!r}: score must return shape [{num_completions}] (one value per completion), "
                f"got {list(values.shape)}"
            )
        finite = torch.isfinite(values)
        num_nonfinite = int((~finite).sum())
        if num_nonfinite:
            values = torch.where(finite, values, torch.zeros_like(values))
        return values, num_nonfinite

    def update(self, completions: Sequence[str], samples: Sequence[VisualSample], scores: Tensor | None = None) -> None:
        """Accumulate the scores of a batch.

        Args:
            completions: N completion texts.
            samples: N samples, ``samples[i]`` the prompt of ``completions[i]``.
            scores: the ``[N]`` values already computed for this batch (as :class:`~app.rewards.WeightedReward`
                does), to avoid scoring twice; by default :meth:`score` is called.
        """
        if scores is None:
            scores, num_nonfinite = self.checked_score(completions, samples)
            if num_nonfinite:
                warnings.warn(
                    f"reward {self.name!r} returned {num_nonfinite} non-finite value(s); counted as 0",
                    RuntimeWarning,
                    stacklevel=3,  # pragma: no mutate (the caller of update(), above torchmetrics' wrapper; a trampoline adds frames)
                )
        elif scores.shape != (len(completions),):
            raise ValueError(f"reward {self.name!r}: scores must have shape [{len(completions)}], got {scores.shape}")
        self.total += scores.sum().to(self.total)
        self.count += scores.numel()

    def compute(self) -> Tensor:
        """Mean score over everything accumulated since the last reset (0 before any update)."""
        return self.total / self.count.clamp(min=1)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, weight={self.weight}"

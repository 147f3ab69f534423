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

import copy
import difflib
import math
import numbers
import re
import warnings
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor
from torchmetrics import Metric

from app.types import VisualSample

SCOPES = ("completion", "group_pair", "triplet")
COMPLETION_KINDS = ("text", "image", "array")
"""What a completion can be: a VLM's ``text`` (a string), an ``image`` (a PIL image), an ``array`` (a rendering or
video as a tensor or numpy array)."""


class RewardError(RuntimeError):
    """A reward failed while scoring asynchronously (in a worker thread or process); the message names the reward."""


@dataclass
class WorkerResult:
    """What scoring a copy of a reward gave (in a worker process): the raw values and the side state the copy
    accumulated meanwhile, ``{module path: {attribute: increment}}`` (see :attr:`RewardComponent.side_state`).
    :meth:`RewardComponent.collect` merges it into the caller's reward and sets it to None, so it counts once."""

    values: Any
    side_state: dict[str, dict[str, Any]] | None


class _Shipment:
    """A reward as handed to an executor. ``copied`` stays False while the worker holds the caller's own object (a
    thread pool: ``score`` updates the side state in place) and turns True when it is unpickled (a process pool, or
    any executor that serialises its work): only then must the side state travel back."""

    def __init__(self, component: RewardComponent) -> None:
        self.component = component
        self.copied = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.copied = True


def _score_in_worker(shipment: _Shipment, completions, samples, grouping: dict[str, Any]):
    """Run ``component.score`` where an executor puts it (a module-level function, so process pools can pickle it):
    the raw values, or on a copy of the reward a :class:`WorkerResult` with its side state's increments."""
    component = shipment.component
    before = None
    if shipment.copied:
        component.own_side_state()
        before = component.side_state_snapshot()
    values = component.score(completions, samples, **grouping)
    values = values.result() if isinstance(values, Future) else values
    if before is None:  # the caller's own object: its side state is already there
        return values
    return WorkerResult(values, component.side_state_delta(before))


@dataclass
class PartialScores:
    """What a reward returns when it could score only some rows of a batch and was asked to skip the rest rather than
    fail (:class:`~app.rewards.remote.RemoteReward` with ``on_failure: skip``).

    Attributes:
        values: ``[N]``; the rows in ``unscored`` hold placeholders that nothing trains on.
        unscored: ``[N]`` bool, the rows it could not score. The trainer leaves their groups out of the loss and counts
            them (``train/skipped_groups``).
    """

    values: Tensor
    unscored: Tensor


class VerifiedScores(NamedTuple):
    """A reward's values for a batch with its contract enforced (:meth:`RewardComponent.verified`)."""

    values: Tensor  # [N] float32, finite
    num_nonfinite: int  # values that were NaN or inf, replaced by 0
    unscored: Tensor | None  # [N] bool, rows the reward skipped (PartialScores), or None: it scored every row


_MISSING = object()


def _side_value_error(owner: RewardComponent, name: str, value: Any) -> str | None:
    """Why ``value`` cannot be side state (None if it can): a number, a mapping of numbers, or a tensor."""
    if isinstance(value, Tensor) or (isinstance(value, numbers.Number) and not isinstance(value, bool)):
        return None
    if isinstance(value, Mapping):
        bad = [key for key, count in value.items() if not isinstance(count, numbers.Number) or isinstance(count, bool)]
        if not bad:
            return None
        return f"{type(owner).__name__}.{name}[{bad[0]!r}] is {type(value[bad[0]]).__name__}, not a number"
    return (
        f"{type(owner).__name__}.{name} is a {type(value).__name__}: side state must be a number, a mapping of "
        "name -> number (a Counter) or a tensor, whose increments add up"
    )


def _copy_counter(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().clone()
    return dict(value) if isinstance(value, Mapping) else value


def _increment(after: Any, before: Any) -> Any:
    """``after - before`` of one counter (a mapping: the keys that changed)."""
    if isinstance(after, Mapping):
        return {key: count - before.get(key, 0) for key, count in after.items() if count != before.get(key, 0)}
    if isinstance(after, Tensor) and after.shape != before.shape:
        raise ValueError(f"side state tensor changed shape while scoring: {list(before.shape)} -> {list(after.shape)}")
    return after - before


def _added(current: Any, increment: Any) -> Any:
    """``current + increment`` as a new object: the caller's counter is never changed in place, so that an executor
    pickling this reward for its next batch (a process pool does that in a thread of its own) never sees it change."""
    if isinstance(current, Mapping):
        merged = copy.copy(current)
        for key, count in increment.items():
            merged[key] = merged.get(key, 0) + count
        return merged
    if isinstance(current, Tensor):
        return current + increment.to(current)
    return current + increment


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
    - ``completion_kinds``: the kinds of completion :meth:`score` reads (:data:`COMPLETION_KINDS`; all of them by
      default); any other kind scores as malformed. A reward server reports it (``GET /info``).
    - ``side_state``: names of the attributes ``score`` accumulates beside the values (counters such as
      ``num_malformed``, or ``failed_checks`` of :class:`~app.tasks.vbvr.VBVRScorerReward`): each a number, a mapping of
      name -> number (a ``Counter``) or a tensor, set in ``__init__``. Scored in a worker process, a reward is a
      pickled copy; its increments to these come back with the values and :meth:`collect` adds them to this object,
      so the counts are the same inline, in threads and in processes. An attribute not named here is lost there.

    Args:
        weight: weight of this component in a :class:`~app.rewards.WeightedReward` total.
        name: log name (``train/reward/<name>``); default: the snake-case class name without ``Reward``.
        sync_on_compute: all-reduce the accumulated mean across processes in ``compute`` (evaluation over ranks);
            False: each process's own mean.
        dist_sync_on_step: also all-reduce on every ``forward`` (slower; the trainer does not need it).
        compute_on_cpu: move the accumulated states to the CPU after each ``update``.
        compute_with_cache: ``compute`` returns the cached value until the next ``update``.

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
    completion_kinds: ClassVar[tuple[str, ...]] = COMPLETION_KINDS
    side_state: ClassVar[tuple[str, ...]] = ()

    total: Tensor
    count: Tensor

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.scope not in SCOPES:
            raise TypeError(f"{cls.__name__}.scope must be one of {SCOPES}, got {cls.scope!r}")
        low, high = cls.value_range
        if not low <= high:
            raise TypeError(f"{cls.__name__}.value_range must be (low, high) with low <= high, got {cls.value_range}")
        if not set(cls.completion_kinds) <= set(COMPLETION_KINDS) or not cls.completion_kinds:
            raise TypeError(
                f"{cls.__name__}.completion_kinds must be some of {COMPLETION_KINDS}, got {cls.completion_kinds!r}"
            )
        names = cls.side_state
        if not isinstance(names, tuple | list) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise TypeError(f"{cls.__name__}.side_state must be a tuple of attribute names, got {names!r}")

    def __init__(
        self,
        weight: float = 1.0,
        name: str | None = None,
        *,
        sync_on_compute: bool = True,
        dist_sync_on_step: bool = False,
        compute_on_cpu: bool = False,
        compute_with_cache: bool = True,
    ) -> None:
        # torchmetrics' options, named here so that a config (and ``--model.rewards.help``) sees them documented; the
        # callables and process group Metric also takes have no YAML form
        super().__init__(
            sync_on_compute=sync_on_compute,
            dist_sync_on_step=dist_sync_on_step,
            compute_on_cpu=compute_on_cpu,
            compute_with_cache=compute_with_cache,
        )
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

        A reward with workers of its own (:meth:`start_on_own_workers` gives a future) scores there. Otherwise
        :meth:`score` runs in ``executor`` (a thread pool, or a process pool: then the reward and its inputs are
        pickled to the worker), or at once in this thread without one; a ``score`` that itself returns a future is
        passed through. From a process the future gives a :class:`WorkerResult` carrying the copy's
        :attr:`side_state` increments: pass what the future gives to :meth:`collect`
        (:meth:`~app.rewards.WeightedReward.gather` does).
        """
        own = self.start_on_own_workers(completions, samples, group_size)
        if own is not None:
            return own
        grouping = self._grouping(group_size)
        if executor is not None:
            return executor.submit(_score_in_worker, _Shipment(self), completions, samples, grouping)
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

    def start_on_own_workers(
        self, completions: Sequence[Any], samples: Sequence[VisualSample], group_size: int | None = None
    ) -> Future | None:
        """A future of the raw values when this reward scores on workers of its own (its own threads or process pool,
        whatever ``executor`` :meth:`score_async` is given), or None: the default, it has none."""
        return None

    def checked_score(
        self, completions: Sequence[str], samples: Sequence[VisualSample], group_size: int | None = None
    ) -> tuple[Tensor, int]:
        """:meth:`score` with its contract enforced: ``([N] float32 values, number of non-finite values)``.

        ``group_size`` (K) reaches :meth:`score` for rewards of scope ``"group_pair"``, the ones that compare groups.

        Non-finite values (NaN, inf) are replaced by 0 and counted; the caller decides how to report them.
        A wrong length or shape is a bug in the reward and raises ``ValueError``.
        """
        values, num_nonfinite, _ = self.verified(self.raw_score(completions, samples, group_size), len(completions))
        return values, num_nonfinite

    def raw_score(
        self, completions: Sequence[str], samples: Sequence[VisualSample], group_size: int | None = None
    ) -> Any:
        """What :meth:`score` gives for the batch (a future's result once it is done), not checked yet: pass it to
        :meth:`verified`."""
        if len(completions) != len(samples):
            raise ValueError(
                f"reward {self.name!r}: got {len(completions)} completions but {len(samples)} samples; "
                "pass one sample per completion (repeat each prompt's sample K times)"
            )
        values = self.score(completions, samples, **self._grouping(group_size))
        return values.result() if isinstance(values, Future) else values

    def collect(self, raw: Any) -> Any:
        """The raw values in ``raw``, what a future of :meth:`score_async` gave. A :class:`WorkerResult` (scored on a
        copy in another process) also brings the copy's :attr:`side_state` increments: they are added to this reward
        here, in the caller's thread, once (collecting the same result again adds nothing)."""
        if not isinstance(raw, WorkerResult):
            return raw
        increments, raw.side_state = raw.side_state, None
        if increments:
            self.merge_side_state(increments)
        return raw.values

    def _side_state_owners(self):
        """``(module path, reward)`` of this reward and of every reward it holds (a correctness reward inside a length
        reward, say) that declares :attr:`side_state`."""
        for path, module in self.named_modules():
            if isinstance(module, RewardComponent) and module.side_state:
                yield path, module

    def check_side_state(self) -> None:
        """Raise if an attribute named in :attr:`side_state` is missing or is not a counter (a number, a mapping of
        numbers, a tensor). :class:`~app.rewards.WeightedReward` checks its components when it is built."""
        for _, owner in self._side_state_owners():
            for name in owner.side_state:
                value = getattr(owner, name, _MISSING)
                if value is _MISSING:
                    close = difflib.get_close_matches(name, [a for a in vars(owner) if not a.startswith("_")], n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise AttributeError(
                        f"{type(owner).__name__}.side_state names {name!r}, but the reward has no attribute {name!r} "
                        f"(side state is set in __init__){hint}"
                    )
                why = _side_value_error(owner, name, value)
                if why is not None:
                    raise TypeError(why)

    def own_side_state(self) -> None:
        """Give this reward tensors of its own for its :attr:`side_state` tensors. A process pool pickles a tensor by
        moving it to shared memory: unpickled in a worker, the copy would write into the caller's tensor, and its
        increments would count twice once :meth:`collect` adds them."""
        for _, owner in self._side_state_owners():
            for name in owner.side_state:
                value = getattr(owner, name, None)
                if isinstance(value, Tensor):
                    setattr(owner, name, value.clone())

    def side_state_snapshot(self) -> dict[str, dict[str, Any]]:
        """Copies of the :attr:`side_state` counters now, ``{module path: {attribute: value}}`` (``""``: this
        reward)."""
        self.check_side_state()
        return {
            path: {name: _copy_counter(getattr(owner, name)) for name in owner.side_state}
            for path, owner in self._side_state_owners()
        }

    def side_state_delta(self, before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """What the :attr:`side_state` counters gained since ``before`` (a :meth:`side_state_snapshot`)."""
        self.check_side_state()
        return {
            path: {name: _increment(getattr(owner, name), before[path][name]) for name in owner.side_state}
            for path, owner in self._side_state_owners()
        }

    def merge_side_state(self, delta: dict[str, dict[str, Any]]) -> None:
        """Add ``delta`` (a :meth:`side_state_delta` of a copy of this reward) to its :attr:`side_state` counters."""
        for path, increments in delta.items():
            owner = self.get_submodule(path) if path else self
            for name, increment in increments.items():
                setattr(owner, name, _added(getattr(owner, name), increment))

    def check_values(self, values: Any, num_completions: int) -> tuple[Tensor, int]:
        """The contract of :meth:`checked_score` on values already computed: ``([N] float32, number non-finite)``.
        A :class:`WorkerResult` is collected first (:meth:`collect`)."""
        values, num_nonfinite, _ = self.verified(values, num_completions)
        return values, num_nonfinite

    def verified(self, raw: Any, num_completions: int) -> VerifiedScores:
        """``raw`` (what :meth:`score` or a future of :meth:`score_async` gave) with the contract enforced: one
        finite float32 per completion (non-finite ones replaced by 0 and counted) and, for :class:`PartialScores`,
        the rows left unscored (their placeholders set to 0, not counted as non-finite)."""
        raw = self.collect(raw)
        unscored = None
        if isinstance(raw, PartialScores):
            unscored = torch.as_tensor(raw.unscored, dtype=torch.bool).flatten()
            if unscored.shape != (num_completions,):
                raise ValueError(
                    f"reward {self.name!r}: the unscored mask must have shape [{num_completions}], "
                    f"got {list(unscored.shape)}"
                )
            raw = raw.values
        values = torch.as_tensor(raw, dtype=torch.float32)
        if values.shape != (num_completions,):
            raise ValueError(
                f"reward {self.name!r}: score must return shape [{num_completions}] (one value per completion), "
                f"got {list(values.shape)}"
            )
        if unscored is not None:
            values = torch.where(unscored.to(values.device), torch.zeros_like(values), values)
        finite = torch.isfinite(values)
        num_nonfinite = int((~finite).sum())
        if num_nonfinite:
            values = torch.where(finite, values, torch.zeros_like(values))
        return VerifiedScores(values, num_nonfinite, unscored if unscored is not None and unscored.any() else None)

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
                    stacklevel=3,  # the caller of update(), above torchmetrics' wrapper
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

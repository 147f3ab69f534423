"""What the learned rewards share: a frozen scorer model loaded lazily and kept out of the module tree, and reading
untrusted renderings.

The scorer is held in a :class:`FrozenModel`, a plain object rather than an ``nn.Module`` attribute: a LightningModule
that holds the reward (inside its :class:`~app.rewards.WeightedReward`) then neither trains, moves, shards nor
checkpoints it with the policy, and ``reward.parameters()`` / ``reward.state_dict()`` stay free of its weights. It is
loaded on the first :meth:`~FrozenModelReward.score` (building a config stays cheap), frozen
(``requires_grad_(False)``, ``eval()``), and dropped when the reward is pickled (to a process pool) or deep-copied: a
copy loads its own on first use.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from app.cv import to_uint8_frames
from app.rewards.base import RewardComponent

log = logging.getLogger(__name__)


class FrozenModel:
    """A frozen model and its processor, outside any ``nn.Module`` tree (``model`` and ``processor`` None until
    loaded)."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.processor: Any = None


def read_frames(rendering: Any) -> np.ndarray:
    """A generated rendering as uint8 ``[T, H, W, 3]`` (:func:`app.cv.to_uint8_frames`); ``ValueError`` if it cannot
    be read (a string, a wrong shape or dtype, a 0 x 0 image)."""
    if isinstance(rendering, str | bytes):
        raise ValueError(f"expected an image or video rendering, got text ({type(rendering).__name__})")
    try:
        return to_uint8_frames(rendering)
    except (TypeError, RuntimeError) as error:  # tensors of odd dtypes, objects numpy cannot read
        raise ValueError(f"{type(error).__name__}: {error}") from error


def to_pil(frame: np.ndarray) -> Image.Image:
    """One uint8 ``[H, W, 3]`` frame as an RGB PIL image (unambiguous for processors that guess channel order)."""
    return Image.fromarray(np.ascontiguousarray(frame))


class FrozenModelReward(RewardComponent):
    """Base of the rewards scored by a frozen learned model: lazy loading, device placement, malformed renderings.

    Subclasses implement :meth:`load` (the model and processor, through ``from_pretrained``) and :meth:`score`, calling
    :meth:`frozen` for the loaded model and :meth:`malformed` for each completion they cannot read.

    Attributes:
        num_malformed: completions scored the low end of ``value_range`` because they could not be read
            (cumulative; each is logged as a warning).

    Args:
        model: the scorer checkpoint: an embedded name, a hub id or a local folder.
        batch_size: most images (or prompts) per forward pass of the scorer.
        device: where the scorer runs (``"cuda:0"``, ``"cpu"``); default: the device of the first tensor completion
            of a batch, else the CPU.
        weight: weight in a :class:`~app.rewards.WeightedReward` total.
        name: log name; default: the snake-case class name without ``Reward``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
    """

    side_state = ("num_malformed",)

    def __init__(
        self,
        model: str,
        batch_size: int = 32,
        device: str | None = None,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(weight=weight, name=name, **kwargs)
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{type(self).__name__}: model must be a checkpoint name or folder, got {model!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{type(self).__name__}: batch_size must be a positive integer, got {batch_size!r}")
        if device is not None:
            try:
                torch.device(device)
            except (RuntimeError, TypeError) as error:
                raise ValueError(f"{type(self).__name__}: device {device!r} is not a torch device") from error
        self.model_name = model
        self.batch_size = batch_size
        self.device_name = device
        self.num_malformed = 0
        self._frozen = FrozenModel()

    @abstractmethod
    def load(self) -> tuple[torch.nn.Module, Any]:
        """The scorer model and its processor, loaded with ``from_pretrained``."""

    def target_device(self, completions: Sequence[Any]) -> torch.device:
        """``device`` if given, else the device of the first tensor completion, else the CPU."""
        if self.device_name is not None:
            return torch.device(self.device_name)
        first = next((c for c in completions if isinstance(c, Tensor)), None)
        return first.device if first is not None else torch.device("cpu")

    def frozen(self, completions: Sequence[Any]) -> tuple[torch.nn.Module, Any, torch.device]:
        """The loaded scorer (loaded and frozen on first use), its processor and the device it now sits on."""
        device = self.target_device(completions)
        if self._frozen.model is None:
            model, processor = self.load()
            model.requires_grad_(False)
            self._frozen.model, self._frozen.processor = model.eval(), processor
        model = self._frozen.model.to(device)
        return model, self._frozen.processor, device

    def malformed(self, index: int, why: str) -> None:
        self.num_malformed += 1
        log.warning(
            "%s reward: completion %d scored %s (malformed; %d so far): %s",
            self.name,
            index,
            self.value_range[0],
            self.num_malformed,
            why,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_frozen"] = FrozenModel()  # never shipped: a copy loads its own on first use
        return state

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, model={self.model_name!r}"

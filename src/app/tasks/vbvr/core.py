"""The task contract: sample a configuration from a seed, solve it, render it, score a generated rendering.

Every task subclasses :class:`VisualTask`; :mod:`app.tasks.vbvr.registry` names the built-in ones. A
:class:`TaskInstance` is what a generator writes to shards and what a scorer compares against: the configuration (the
spec the scorer checks), the solver's solution, the rendered frames of the problem and its solution, and the prompt the
generator model receives.

Image regimes (VBVR-Pro, docs/algorithms.md#papers): **Last-Frame** is the solved state (one image), **Key-Frame** the
frames at the task's key steps, **Multi-Frame** every frame of the video.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from app.tasks.vbvr.scoring import ScoreResult

FACULTIES = ("perception", "spatial", "transformation", "physics", "abstraction", "planning")


@dataclass
class TaskInstance:
    """One sampled problem with its solution and renderings.

    Attributes:
        task: task name.
        seed: the seed the configuration was sampled from.
        config: the sampled configuration (JSON-serialisable): what the scorer checks against.
        solution: the solver's solution (JSON-serialisable).
        frames: ``[T, H, W, 3]`` uint8 video from the problem state to the solved state.
        key_frame_indices: indices of the key frames in ``frames`` (always includes the first and the last).
        prompt: the instruction the generator model receives.
        metadata: anything else worth storing (task parameters, split).
    """

    task: str
    seed: int
    config: dict[str, Any]
    solution: dict[str, Any]
    frames: np.ndarray
    key_frame_indices: list[int]
    prompt: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def last_frame(self) -> np.ndarray:
        return self.frames[-1]

    @property
    def key_frames(self) -> np.ndarray:
        return self.frames[self.key_frame_indices]

    @property
    def first_frame(self) -> np.ndarray:
        return self.frames[0]


class VisualTask(ABC):
    """A parameterised procedural task.

    Subclasses set ``name`` and ``faculty`` and implement :meth:`sample_config`, :meth:`solve`, :meth:`render` and
    :meth:`score`; they may override :meth:`prompt`. Constructor keyword arguments are the task's parameters (image
    size, grid size, object count, ...); :meth:`out_of_domain_params` returns the parameters of its out-of-domain split.
    """

    name: ClassVar[str]
    faculty: ClassVar[str]
    # Smallest image side the task's layouts fit in (both splits), with a margin over where generation was seen to
    # fail; tasks with crowded layouts raise it.
    min_image_size: ClassVar[int] = 32

    def __init__(self, image_size: int = 128, **params: Any) -> None:
        if image_size < self.min_image_size:
            raise ValueError(
                f"{self.name}: image_size must be >= {self.min_image_size} (smaller images cannot hold the task's "
                f"layout), got {image_size}"
            )
        self.image_size = image_size
        self.params = params

    @abstractmethod
    def sample_config(self, rng: random.Random) -> dict[str, Any]:
        """A random problem configuration (JSON-serialisable)."""

    @abstractmethod
    def solve(self, config: dict[str, Any]) -> dict[str, Any]:
        """The ground-truth solution of ``config``."""

    @abstractmethod
    def render(self, config: dict[str, Any], solution: dict[str, Any]) -> tuple[np.ndarray, list[int]]:
        """Frames ``[T, H, W, 3]`` uint8 from the problem to the solved state, and the key-frame indices."""

    @abstractmethod
    def score(self, frames: np.ndarray, config: dict[str, Any]) -> ScoreResult:
        """Score a generated rendering (``[H, W, 3]`` last frame or ``[T, H, W, 3]`` video) against ``config``."""

    @abstractmethod
    def perturbations(self, config: dict[str, Any], solution: dict[str, Any]) -> dict[str, np.ndarray]:
        """Wrong renderings of the solved state (last frame, ``[H, W, 3]``), keyed by what is wrong: e.g.
        ``"wrong_hue"`` (violet for purple), ``"wrong_position"``, ``"wrong_count"``, ``"broken_path"``. Each must
        score clearly lower than the solver's rendering; validation checks it."""

    def prompt(self, config: dict[str, Any]) -> str:
        """The instruction for the generator model."""
        return f"Solve the {self.name.replace('_', ' ')} task shown in the image."

    def out_of_domain_params(self) -> dict[str, Any]:
        """Parameters of the out-of-domain split (larger grids, more objects, ...); in-domain by default."""
        return {}

    def generate(self, seed: int) -> TaskInstance:
        """Sample, solve and render one instance, deterministically for ``seed``."""
        config = self.sample_config(random.Random(f"{self.name}:{seed}"))
        solution = self.solve(config)
        frames, key_frames = self.render(config, solution)
        frames = np.ascontiguousarray(frames, dtype=np.uint8)
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"{self.name}: render must return [T, H, W, 3] frames, got {frames.shape}")
        key_frames = sorted({0, len(frames) - 1, *key_frames})
        metadata = {"faculty": self.faculty, "params": {"image_size": self.image_size, **self.params}}
        return TaskInstance(self.name, seed, config, solution, frames, key_frames, self.prompt(config), metadata)


def as_frames(rendering: np.ndarray) -> np.ndarray:
    """A rendering as ``[T, H, W, 3]`` uint8 (a single image becomes one frame)."""
    array = np.asarray(rendering)
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"expected an RGB image [H, W, 3] or video [T, H, W, 3], got shape {array.shape}")
    return array.astype(np.uint8, copy=False)

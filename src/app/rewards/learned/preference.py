"""Learned human-preference score of a generated image for its prompt: PickScore (Kirstain et al., 2023) and
HPS-v2-style CLIP models fine-tuned on human choices.

Such a checkpoint is a CLIP model trained so that ``s(prompt, image) = logit_scale.exp() * cos(E_image, E_prompt)``
is the logit of a human preferring the image (two images' preference probabilities are the softmax of their scores;
PickScore's ``logit_scale.exp()`` is 100, so its raw scores lie in [-100, 100], real images at about 18-23).
:class:`PreferenceScoreReward` returns that score, affinely normalised: ``(s - offset) / scale``. The defaults
``offset = 0, scale = 26`` are Flow-GRPO's PickScore reward (``s / 26``, about 0.7-0.9 on real images). The logit scale
is capped at 100, CLIP's training clamp, so that ``value_range`` holds for every CLIP checkpoint:
``((-100 - offset) / scale, (100 - offset) / scale)``. A video scores the mean over its frames.

Unlike :class:`~app.rewards.learned.CLIPScoreReward` (text-image agreement of a general CLIP model, clamped at 0) this
measures what people preferred, so it rewards aesthetics and detail as well as prompt fidelity; it needs a preference
checkpoint, e.g. ``model: yuvalkirstain/PickScore_v1`` with ``processor: laion/CLIP-ViT-H-14-laion2B-s32B-b79K``
(PickScore ships its processor separately). Unreadable renderings score ``value_range[0]`` and are counted in
``num_malformed``, as for the other image rewards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from app.rewards.learned.clip_score import ImageTextSimilarityReward
from app.types import VisualSample

MAX_LOGIT_SCALE = 100.0
"""Cap of ``logit_scale.exp()``: CLIP clamps it there in training (PickScore's is exactly 100)."""


class PreferenceScoreReward(ImageTextSimilarityReward):
    """A preference model's score, ``(min(logit_scale.exp(), 100) * cos(E_image, E_prompt) - offset) / scale``, a
    video's mean over its frames (see the module docstring); name ``"preference_score"``.

    ``value_range`` is the instance's ``((-100 - offset) / scale, (100 - offset) / scale)``; the class declares the
    defaults' ``(-100 / 26, 100 / 26)``.

    Attributes:
        num_malformed: renderings scored ``value_range[0]`` because they could not be read (cumulative; each is
            logged as a warning).

    Args:
        model: the preference checkpoint (a ``transformers.CLIPModel``): ``"tiny-pickscore"`` (embedded, random
            weights: for tests), a hub id such as ``"yuvalkirstain/PickScore_v1"``, or a local folder.
        processor: the checkpoint holding its processor, when it ships separately (PickScore:
            ``"laion/CLIP-ViT-H-14-laion2B-s32B-b79K"``); default: ``model``.
        offset: subtracted from the raw score before scaling.
        scale: the raw score minus ``offset`` is divided by it (positive; 26 is Flow-GRPO's).
        prompt_source: the text each image is scored with: ``"question"`` (the generation prompt) or
            ``"meta:<key>"`` (``sample.meta[key]``).
        batch_size: most images (or texts) per forward pass of the model.
        device: where the model runs; default: the device of the first tensor completion, else the CPU.
        weight: weight in a :class:`~app.rewards.WeightedReward` total.
        name: log name; default ``"preference_score"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
    """

    value_range = (-MAX_LOGIT_SCALE / 26.0, MAX_LOGIT_SCALE / 26.0)

    def __init__(
        self,
        model: str = "tiny-pickscore",
        processor: str | None = None,
        offset: float = 0.0,
        scale: float = 26.0,
        prompt_source: str = "question",
        batch_size: int = 32,
        device: str | None = None,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(model, processor, prompt_source, batch_size, device, weight, name, **kwargs)
        offset, scale = float(offset), float(scale)
        if not math.isfinite(offset):
            raise ValueError(f"PreferenceScoreReward: offset must be finite, got {offset}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"PreferenceScoreReward: scale must be positive and finite, got {scale}")
        self.offset, self.scale = offset, scale
        self.value_range = ((-MAX_LOGIT_SCALE - offset) / scale, (MAX_LOGIT_SCALE - offset) / scale)

    def score(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> Tensor:
        cosines = self.frame_cosines(completions, samples)
        if all(c is None for c in cosines):
            return torch.full((len(cosines),), self.value_range[0], dtype=torch.float32)
        logit_scale = min(self.logit_scale(), MAX_LOGIT_SCALE)
        values = [
            self.value_range[0] if c is None else (logit_scale * float(c.double().mean()) - self.offset) / self.scale
            for c in cosines
        ]
        return torch.tensor(values, dtype=torch.float32)

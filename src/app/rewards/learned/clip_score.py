"""CLIPScore (Hessel et al., 2021): how well a generated image matches its prompt, by a frozen CLIP model.

The paper defines ``CLIPScore(c, v) = w * max(cos(E_v, E_c), 0)`` with ``w = 2.5``, a constant that only stretches the
scale; :class:`CLIPScoreReward` returns ``max(cos(E_v, E_c), 0)`` itself, in [0, 1] (give the reward a ``weight`` for
any scale). ``E_v`` and ``E_c`` are the CLIP model's projected image and text embeddings
(``get_image_features`` / ``get_text_features``). A video scores the mean over its frames of the per-frame value.

Images are read as the other image rewards read them (:func:`app.cv.to_uint8_frames`: a float tensor in [0, 1]
``[3, H, W]`` / ``[T, 3, H, W]``, a uint8 array ``[H, W, 3]`` / ``[T, H, W, 3]``, a PIL image) and go through the
checkpoint's own processor (resize, centre crop, normalisation). A rendering that cannot be read (text, a wrong shape
or dtype, a 0 x 0 image) scores 0, is counted in ``num_malformed`` and is logged as a warning; it never fails the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from app.rewards.learned._frozen import FrozenModelReward, read_frames, to_pil
from app.tiny.cache import check_tiny_name
from app.types import VisualSample


def _features(output: Any) -> Tensor:
    """The projected embeddings of ``get_*_features`` (a tensor, or an output whose ``pooler_output`` holds them)."""
    return output if isinstance(output, Tensor) else output.pooler_output


def _prompt_key(prompt_source: str) -> str | None:
    """None for ``"question"``, the key for ``"meta:<key>"``; ``ValueError`` for anything else."""
    if prompt_source == "question":
        return None
    if isinstance(prompt_source, str) and prompt_source.startswith("meta:") and prompt_source[5:].strip():
        return prompt_source[5:]
    raise ValueError(f"prompt_source must be 'question' or 'meta:<key>', got {prompt_source!r}")


class ImageTextSimilarityReward(FrozenModelReward):
    """Base of the CLIP-model rewards: the cosine similarity of each frame's image embedding with its prompt's text
    embedding; subclasses map the cosines of a completion's frames to its value (:meth:`score`).

    Args:
        model: the CLIP checkpoint (``transformers.CLIPModel``): an embedded name, a hub id or a local folder.
        processor: the checkpoint holding its processor, when it ships separately; default: ``model``.
        prompt_source: the text each image is compared with: ``"question"`` (the sample's prompt) or
            ``"meta:<key>"`` (``sample.meta[key]``, a string).
        batch_size: most images (or texts) per forward pass of the CLIP model.
        device: where the CLIP model runs; default: the device of the first tensor completion, else the CPU.
        weight: weight in a :class:`~app.rewards.WeightedReward` total.
        name: log name; default: the snake-case class name without ``Reward``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).
    """

    completion_kinds = ("image", "array")

    def __init__(
        self,
        model: str,
        processor: str | None = None,
        prompt_source: str = "question",
        batch_size: int = 32,
        device: str | None = None,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(model, batch_size=batch_size, device=device, weight=weight, name=name, **kwargs)
        from app.tiny.scorers import TINY_SCORERS

        for checkpoint in (model, processor):  # a misspelt tiny-* name fails here, not on the first score
            if checkpoint is not None:
                check_tiny_name(checkpoint, TINY_SCORERS, "scorer")
        self.prompt_key = _prompt_key(prompt_source)
        self.prompt_source = prompt_source
        self.processor_name = processor

    def load(self):
        from transformers import AutoProcessor, CLIPModel

        from app.tiny.scorers import resolve_scorer

        model = CLIPModel.from_pretrained(resolve_scorer(self.model_name))
        processor = AutoProcessor.from_pretrained(resolve_scorer(self.processor_name or self.model_name))
        return model, processor

    def prompt(self, index: int, sample: VisualSample) -> str:
        text = sample.question if self.prompt_key is None else sample.meta.get(self.prompt_key)
        if not isinstance(text, str):
            raise ValueError(
                f"{type(self).__name__}: sample {index} ({sample.task!r}) has no text at {self.prompt_source!r} "
                f"(got {type(text).__name__})"
            )
        return text

    def logit_scale(self) -> float:
        """The loaded model's ``logit_scale.exp()`` (CLIP's inverse temperature)."""
        return float(self._frozen.model.logit_scale.exp())

    @torch.no_grad()
    def frame_cosines(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> list[Tensor | None]:
        """For each completion, float32 ``[T]``: the cosine of each frame with its prompt; None where the rendering
        cannot be read (counted in ``num_malformed``)."""
        prompts = [self.prompt(i, sample) for i, sample in enumerate(samples)]
        frames: list[Any] = []
        for i, rendering in enumerate(completions):
            try:
                frames.append(read_frames(rendering))
            except ValueError as error:
                self.malformed(i, str(error))
                frames.append(None)
        rows = [i for i, f in enumerate(frames) if f is not None]
        if not rows:
            return [None] * len(completions)
        model, processor, device = self.frozen(completions)
        texts = list(dict.fromkeys(prompts[i] for i in rows))
        text_embeddings = torch.cat(
            [
                self._embed_texts(model, processor, device, texts[s : s + self.batch_size])
                for s in range(0, len(texts), self.batch_size)
            ]
        )
        images = [frame for i in rows for frame in frames[i]]  # uint8 [H, W, 3] views, made PIL one batch at a time
        image_embeddings = torch.cat(
            [
                self._embed_images(model, processor, device, [to_pil(f) for f in images[s : s + self.batch_size]])
                for s in range(0, len(images), self.batch_size)
            ]
        )
        text_index = {text: k for k, text in enumerate(texts)}
        text_of_frame = torch.tensor([text_index[prompts[i]] for i in rows for _ in frames[i]])
        cosines = (image_embeddings * text_embeddings[text_of_frame]).sum(dim=-1).clamp(-1.0, 1.0)
        per_row = iter(cosines.split([len(frames[i]) for i in rows]))
        return [next(per_row) if f is not None else None for f in frames]

    def _embed_texts(self, model, processor, device: torch.device, texts: list[str]) -> Tensor:
        max_length = model.config.text_config.max_position_embeddings
        inputs = processor.tokenizer(  # the processor drops split_special_tokens: a prompt is text, whatever it spells
            texts,
            padding=True,
            truncation=True,
            max_length=max_length,
            split_special_tokens=True,
            return_tensors="pt",
        )
        features = _features(model.get_text_features(**{k: v.to(device) for k, v in inputs.items()}))
        return F.normalize(features.float(), dim=-1).cpu()

    def _embed_images(self, model, processor, device: torch.device, images: list) -> Tensor:
        pixels = processor(images=images, return_tensors="pt")["pixel_values"].to(device, model.dtype)
        return F.normalize(_features(model.get_image_features(pixel_values=pixels)).float(), dim=-1).cpu()


class CLIPScoreReward(ImageTextSimilarityReward):
    """CLIPScore without its 2.5 scale: ``max(cos(E_image, E_prompt), 0)`` in [0, 1], a video's mean over its frames
    (see the module docstring); name ``"clip_score"``.

    Attributes:
        num_malformed: renderings scored 0 because they could not be read (cumulative; each is logged as a warning).

    Args:
        model: the CLIP checkpoint: ``"tiny-clip"`` (embedded, random weights: for tests), a hub id such as
            ``"openai/clip-vit-large-patch14"`` (CLIPScore's ViT-B/32 is ``"openai/clip-vit-base-patch32"``), or a
            local folder.
        processor: the checkpoint holding its processor, when it ships separately; default: ``model``.
        prompt_source: the text each image is compared with: ``"question"`` (the generation prompt) or
            ``"meta:<key>"`` (``sample.meta[key]``).
        batch_size: most images (or texts) per forward pass of the CLIP model.
        device: where the CLIP model runs; default: the device of the first tensor completion, else the CPU.
        weight: weight in a :class:`~app.rewards.WeightedReward` total (CLIPScore's ``w = 2.5`` is one).
        name: log name; default ``"clip_score"``.
        kwargs: passed to :class:`~app.rewards.RewardComponent` (``sync_on_compute``, ...).

    Example:
        >>> import torch
        >>> from app.types import VisualSample
        >>> reward = CLIPScoreReward()  # loads the embedded tiny CLIP on the first score
        >>> sample = VisualSample(images=[], question="a red circle on the left", task="t2i")
        >>> values = reward.score([torch.rand(3, 32, 32), "not an image"], [sample, sample])
        >>> values.shape, bool(0 <= values[0] <= 1), values[1].item(), reward.num_malformed
        (torch.Size([2]), True, 0.0, 1)
    """

    value_range = (0.0, 1.0)

    def __init__(
        self,
        model: str = "tiny-clip",
        processor: str | None = None,
        prompt_source: str = "question",
        batch_size: int = 32,
        device: str | None = None,
        weight: float = 1.0,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(model, processor, prompt_source, batch_size, device, weight, name, **kwargs)

    def score(self, completions: Sequence[Any], samples: Sequence[VisualSample]) -> Tensor:
        cosines = self.frame_cosines(completions, samples)
        low = self.value_range[0]
        return torch.tensor(
            [low if c is None else float(c.clamp(min=0.0).mean()) for c in cosines], dtype=torch.float32
        )

"""Text conditioning of a flow policy: prompts -> the transformer's text keyword tensors, as diffusers pipelines do.

Two layouts, chosen from the text encoders a pipeline folder holds:

- **one encoder** (the embedded models, Wan): a CLIP-like encoder (its output has ``text_embeds``) gives
  ``encoder_hidden_states`` from its penultimate layer and ``pooled_projections`` from its projection, as
  ``StableDiffusion3Pipeline._get_clip_prompt_embeds`` does; a T5-like encoder gives its last hidden state with padding
  positions zeroed, as ``WanPipeline`` does (it trims each prompt and pads with zeros to ``max_sequence_length``).
- **SD3's three encoders** (``text_encoder`` CLIP-L, ``text_encoder_2`` CLIP-G, ``text_encoder_3`` T5, the last one
  optional): delegated to ``StableDiffusion3Pipeline.encode_prompt`` itself, on a pipeline holding only the text
  components (no transformer, VAE or scheduler), so the concatenation (CLIP hidden states side by side, zero-padded to
  T5's width, then T5's tokens after them; pooled CLIP-L and CLIP-G embeddings side by side) is exactly the library's.

Encoders are frozen; they live in an ``nn.ModuleDict`` so that ``.to(device)`` moves them with the policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from app.embedded.flow_models import ENCODER_SLOTS, TOKENIZER_SLOTS

DEFAULT_MAX_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline's default T5 length; Wan uses 512


class FlowTextEncoder(nn.Module):
    """Frozen text encoder(s) and tokenizer(s) of a flow pipeline.

    Args:
        encoders: the text encoders by pipeline slot (``text_encoder``, ``text_encoder_2``, ``text_encoder_3``); slots
            the pipeline lacks are absent or None.
        tokenizers: the matching tokenizers by slot (``tokenizer``, ``tokenizer_2``, ``tokenizer_3``).
        wants_pooled: the transformer takes ``pooled_projections`` (SD3-style).
        max_sequence_length: token limit of T5-like encoders (CLIP tokenizers cap themselves at their own length).
    """

    def __init__(
        self,
        encoders: dict[str, nn.Module | None],
        tokenizers: dict[str, Any],
        wants_pooled: bool,
        max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH,
    ):
        super().__init__()
        present = {slot: module for slot, module in encoders.items() if module is not None}
        unknown = sorted(set(present) - set(ENCODER_SLOTS))
        if unknown:
            raise ValueError(f"unknown text encoder slots {unknown}; expected some of {ENCODER_SLOTS}")
        if "text_encoder" not in present:
            raise ValueError(f"a flow pipeline needs a 'text_encoder'; found {sorted(present) or 'none'}")
        for slot in present:
            token_slot = TOKENIZER_SLOTS[ENCODER_SLOTS.index(slot)]
            if tokenizers.get(token_slot) is None:
                raise ValueError(f"text encoder {slot!r} has no tokenizer {token_slot!r}")
        self.encoders = nn.ModuleDict(present).requires_grad_(False).eval()
        self.tokenizers = {slot: tok for slot, tok in tokenizers.items() if tok is not None}
        self.wants_pooled = wants_pooled
        self.max_sequence_length = int(max_sequence_length)
        self._sd3_pipeline = None

    @property
    def is_sd3_triple(self) -> bool:
        """SD3's CLIP-L + CLIP-G (+ T5) layout."""
        return "text_encoder_2" in self.encoders

    def train(self, mode: bool = True):
        return super().train(False)  # frozen: no dropout, whatever the policy's mode

    @torch.no_grad()
    def forward(self, prompts: list[str]) -> dict[str, Tensor]:
        """``encoder_hidden_states`` ``[B, L, D]`` and, when ``wants_pooled``, ``pooled_projections`` ``[B, P]``."""
        if self.is_sd3_triple:
            return self._encode_sd3(prompts)
        encoder, tokenizer = self.encoders["text_encoder"], self.tokenizers["tokenizer"]
        max_length = min(tokenizer.model_max_length, self.max_sequence_length)
        device = next(encoder.parameters()).device
        tokens = tokenizer(
            prompts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
        ).to(device)
        if (
            self.wants_pooled
        ):  # CLIP as in StableDiffusion3Pipeline: penultimate layer, no attention mask, projected pool
            out = encoder(tokens.input_ids, output_hidden_states=True)
            if getattr(out, "text_embeds", None) is None:
                raise ValueError(
                    f"the transformer needs pooled text embeddings; {type(encoder).__name__} has no projection"
                )
            return {"encoder_hidden_states": out.hidden_states[-2], "pooled_projections": out.text_embeds}
        hidden = encoder(tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state  # as WanPipeline
        return {"encoder_hidden_states": hidden * tokens.attention_mask[..., None].to(hidden.dtype)}

    def _encode_sd3(self, prompts: list[str]) -> dict[str, Tensor]:
        if self._sd3_pipeline is None:
            from diffusers import StableDiffusion3Pipeline

            parts = {slot: self.encoders[slot] if slot in self.encoders else None for slot in ENCODER_SLOTS}
            parts |= {slot: self.tokenizers.get(slot) for slot in TOKENIZER_SLOTS}
            self._sd3_pipeline = StableDiffusion3Pipeline(transformer=None, scheduler=None, vae=None, **parts)
        device = next(self.encoders["text_encoder"].parameters()).device
        embeds, _, pooled, _ = self._sd3_pipeline.encode_prompt(
            prompts, None, None, device=device, do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )  # fmt: skip
        return {"encoder_hidden_states": embeds, "pooled_projections": pooled}

    def save_pretrained(self, output_dir: str | Path) -> dict[str, list[str]]:
        """Write every encoder and tokenizer under its slot's subfolder; return their ``model_index.json`` entries."""
        index: dict[str, list[str]] = {}
        for slot, part in [*self.encoders.items(), *self.tokenizers.items()]:
            part.save_pretrained(Path(output_dir) / slot)
            index[slot] = [type(part).__module__.split(".")[0], type(part).__name__]
        return index

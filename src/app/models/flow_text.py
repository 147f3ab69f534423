"""Text conditioning of a flow policy: prompts -> the transformer's text keyword tensors, as diffusers pipelines do.

The layout follows the pipeline class the transformer belongs to (``FlowTextEncoder(pipeline_class=...)``):

- **one encoder** (the embedded SD3 model, Wan): a CLIP-like encoder (its output has ``text_embeds``) gives
  ``encoder_hidden_states`` from its penultimate layer and ``pooled_projections`` from its projection, as
  ``StableDiffusion3Pipeline._get_clip_prompt_embeds`` does; a T5-like encoder gives its last hidden state with padding
  positions zeroed, as ``WanPipeline`` does (it trims each prompt and pads with zeros to ``max_sequence_length``).
- **SD3's three encoders** (``StableDiffusion3Pipeline`` with a ``text_encoder_2``: CLIP-L, CLIP-G and an optional T5
  ``text_encoder_3``) and **FLUX's two** (``FluxPipeline``: CLIP-L's pooled output from ``text_encoder``, T5's sequence
  from ``text_encoder_2``): delegated to the pipeline's own ``encode_prompt``, on a pipeline holding only the text
  components (no transformer, VAE or scheduler), so the concatenation and pooling are exactly the library's.

Encoders are frozen; they live in an ``nn.ModuleDict`` so that ``.to(device)`` moves them with the policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from app.tiny.flow_models import ENCODER_SLOTS, TOKENIZER_SLOTS

DEFAULT_MAX_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline's default T5 length; Wan and FLUX use 512


class FlowTextEncoder(nn.Module):
    """Frozen text encoder(s) and tokenizer(s) of a flow pipeline.

    Args:
        encoders: the text encoders by pipeline slot (``text_encoder``, ``text_encoder_2``, ``text_encoder_3``); slots
            the pipeline lacks are absent or None.
        tokenizers: the matching tokenizers by slot (``tokenizer``, ``tokenizer_2``, ``tokenizer_3``).
        wants_pooled: the transformer takes ``pooled_projections`` (SD3-style, one-encoder layout only).
        max_sequence_length: token limit of T5-like encoders (CLIP tokenizers cap themselves at their own length).
        pipeline_class: the diffusers pipeline of the transformer (``StableDiffusion3Pipeline``, ``FluxPipeline``,
            ...); it picks the layout: FLUX always delegates to ``FluxPipeline.encode_prompt``, SD3 delegates when
            the folder has SD3's multi-encoder layout, anything else uses its one ``text_encoder``.
    """

    def __init__(
        self,
        encoders: dict[str, nn.Module | None],
        tokenizers: dict[str, Any],
        wants_pooled: bool,
        max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH,
        pipeline_class: str | None = None,
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
        self.layout = _layout(pipeline_class, sorted(present))
        self._pipeline = None  # the text-only diffusers pipeline of a delegated layout, built on first use

    @property
    def is_sd3_triple(self) -> bool:
        """SD3's CLIP-L + CLIP-G (+ T5) layout."""
        return self.layout == "sd3"

    def train(self, mode: bool = True):
        return super().train(False)  # frozen: no dropout, whatever the policy's mode

    @torch.no_grad()
    def forward(self, prompts: list[str]) -> dict[str, Tensor]:
        """``encoder_hidden_states`` ``[B, L, D]`` and, when ``wants_pooled``, ``pooled_projections`` ``[B, P]``."""
        if self.layout != "single":
            return self._encode_with_pipeline(prompts)
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

    def _encode_with_pipeline(self, prompts: list[str]) -> dict[str, Tensor]:
        if self._pipeline is None:
            import diffusers

            pipeline_class = getattr(diffusers, _DELEGATES[self.layout])
            count = _ENCODER_COUNT[self.layout]
            parts = {slot: self.encoders[slot] if slot in self.encoders else None for slot in ENCODER_SLOTS[:count]}
            parts |= {slot: self.tokenizers.get(slot) for slot in TOKENIZER_SLOTS[:count]}
            self._pipeline = pipeline_class(transformer=None, scheduler=None, vae=None, **parts)
        device = next(self.encoders["text_encoder"].parameters()).device
        if self.layout == "sd3":
            embeds, _, pooled, _ = self._pipeline.encode_prompt(
                prompts,
                None,
                None,
                device=device,
                do_classifier_free_guidance=False,
                max_sequence_length=self.max_sequence_length,
            )
        else:  # FLUX; its text_ids (zeros) are rebuilt next to the transformer call
            embeds, pooled, _ = self._pipeline.encode_prompt(
                prompts, None, device=device, max_sequence_length=self.max_sequence_length
            )
        return {"encoder_hidden_states": embeds, "pooled_projections": pooled}

    def save_pretrained(self, output_dir: str | Path) -> dict[str, list[str]]:
        """Write every encoder and tokenizer under its slot's subfolder; return their ``model_index.json`` entries."""
        index: dict[str, list[str]] = {}
        for slot, part in [*self.encoders.items(), *self.tokenizers.items()]:
            part.save_pretrained(Path(output_dir) / slot)
            index[slot] = [type(part).__module__.split(".")[0], type(part).__name__]
        return index


_DELEGATES = {"sd3": "StableDiffusion3Pipeline", "flux": "FluxPipeline"}  # layouts encoded by the pipeline itself
_ENCODER_COUNT = {"sd3": 3, "flux": 2}  # text encoder slots of each delegated pipeline


def _layout(pipeline_class: str | None, slots: list[str]) -> str:
    """``"flux"``, ``"sd3"`` or ``"single"``: the text layout of a pipeline class with these encoder slots."""
    if pipeline_class == "FluxPipeline":
        if slots != ["text_encoder", "text_encoder_2"]:
            raise ValueError(f"FLUX needs 'text_encoder' (CLIP) and 'text_encoder_2' (T5); found {slots}")
        return "flux"
    if pipeline_class == "StableDiffusion3Pipeline" and "text_encoder_2" in slots:
        return "sd3"
    if slots != ["text_encoder"]:
        raise ValueError(f"{pipeline_class or 'this pipeline'} takes one text encoder; found {slots}")
    return "single"

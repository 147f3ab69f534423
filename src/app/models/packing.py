"""Padding-free ("packed") forward passes of a Qwen-VL backbone: the real tokens of N padded rows laid end to end in
one row of T = sum of the rows' lengths, so no layer computes on padding.

transformers supports this layout for the Qwen-VL language models: given ``position_ids`` of shape ``[4, 1, T]`` (the
per-sequence text positions, restarting at 0 where a sequence starts, in front of the three rows of the 3-D rotary
positions) and no attention mask, it builds the block-diagonal causal mask from the text positions
(``masking_utils.find_packed_sequence_indices``), which flash-attention 2 runs as variable-length attention and sdpa
and eager as a ``[T, T]`` mask. The 3-D positions are each row's own (computed on the padded rows, as the unpacked
forward would), so the image tokens keep their spatial positions. The vision tower, which never sees padding, runs as
usual; its features are scattered to the image tokens in row order, which packing keeps.

Packing pays where attention is variable-length: with flash-attention 2 it saves the padded positions' work in every
layer. With sdpa or eager the ``[T, T]`` mask costs more than the padding it removes once ``T`` grows, so the default
is to pack under flash-attention 2 only (:func:`packs`); the micro-batches of the update are re-padded to their own
longest row either way (:mod:`app.sampling.vlm_rollout`).
"""

from __future__ import annotations

import torch
from torch import nn

from app.models.shared_prefix import position_inputs

PACKED_ATTENTION = ("flash_attention_2", "flash_attention_3")
"""Attention implementations that run packed rows as variable-length attention (no ``[T, T]`` mask)."""


def packs(hf_model: nn.Module, padding_free: bool | None) -> bool:
    """Whether the forward packs its rows: ``padding_free`` if given, else whether the attention is variable-length."""
    if padding_free is not None:
        return padding_free
    return getattr(hf_model.config, "_attn_implementation", None) in PACKED_ATTENTION


def packed_hidden_states(inner: nn.Module, inputs: dict, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The last hidden states ``[N, S, H]`` of the padded rows ``inputs`` (``input_ids`` / ``attention_mask`` /
    ``mm_token_type_ids`` ``[N, S]``, images and videos as the processor gives them), computed in one packed row of the
    attention mask's tokens; zeros at the padded positions.

    ``position_ids``: the rows' 3-D rotary positions ``[3, N, S]`` if already known (see
    :func:`app.models.shared_prefix.shared_prompt_features`); else the backbone's ``compute_3d_position_ids`` finds
    them, or, for prompts without images or videos, each row's token count so far."""
    attention = inputs["attention_mask"].bool()  # [N, S]
    if position_ids is None:
        position_ids = inner.compute_3d_position_ids(**position_inputs(inputs))
    text_positions = (attention.long().cumsum(dim=1) - 1).clamp(min=0)  # [N, S], 0 at each row's first real token
    if position_ids is None:  # no images: the rotary positions are the text positions
        position_ids = text_positions[None].expand(3, -1, -1)
    positions = torch.cat([text_positions[None], position_ids.to(text_positions.dtype)])  # [4, N, S]
    packed = {
        key: value[attention][None] if key in ("input_ids", "mm_token_type_ids") else value
        for key, value in inputs.items()
        if key != "attention_mask"
    }  # per-token tensors [1, T]
    hidden = inner(**packed, position_ids=positions[:, attention][:, None], use_cache=False).last_hidden_state
    out = hidden.new_zeros(*attention.shape, hidden.shape[-1])  # [N, S, H]
    out[attention] = hidden[0]
    return out

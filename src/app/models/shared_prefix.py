"""Shared-prefix rollouts: the K completions of a prompt share its images, videos and text, so the vision tower and the
prefill of the prompt run once per prompt and the KV cache is expanded to the K rows before decoding; in the training
forward, the image features and the 3-D positions of the prompt are likewise computed once per prompt
(:func:`shared_prompt_features`), and, without gradient checkpointing, every layer runs on the prompt once and the
completions attend to its keys and values (:func:`prefix_shared_hidden_states`).

The prefill covers the prompt without its last token; ``generate`` is then called on all ``B*K`` rows with that cache
and processes the last prompt token itself, so the first sampled token is drawn from the same ``[B*K, V]`` distribution,
with the same RNG draw, as without sharing. The prefill gets the positions ``generate`` would give the whole prompt
(left padding; Qwen-VL's 3-D mRoPE positions of the image tokens), and Qwen-VL's rotary offsets (``rope_deltas``, one
per row, which the decode steps add to the text positions) are expanded to the K rows with the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from app.types import IMAGE_INPUTS, VIDEO_INPUTS, VISUAL_KEYS, PromptInputs, VisualInputs

PER_TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")
"""Prompt tensors with one entry per token (``[N, P]``): the ones ``generate`` needs once the prefix is cached."""


def take_rows(inputs: PromptInputs, rows: Sequence[int]) -> PromptInputs:
    """The prompt rows ``rows`` (any order, repeats allowed), each with the patches of its own images and videos. A
    kind of visual input that none of these rows holds is left out (the vision tower cannot run on no items)."""
    t = inputs.tensors
    index = _index(rows, t["input_ids"])
    out = {k: v.index_select(0, index) for k, v in t.items() if k not in VISUAL_KEYS}
    for kind in inputs.visual_kinds():
        item_slices, patch_slices = inputs.slices(kind)
        items = _index([i for r in rows for i in range(item_slices[r].start, item_slices[r].stop)], t[kind.grid])
        if not len(items):
            continue
        patches = [i for r in rows for i in range(patch_slices[r].start, patch_slices[r].stop)]
        out[kind.patches] = t[kind.patches].index_select(0, _index(patches, t[kind.patches]))
        for key in (kind.grid, *kind.per_item):
            if key in t:
                out[key] = t[key].index_select(0, items)
    copies_of = [inputs.copies_of[r] if inputs.copies_of is not None else r for r in rows]
    videos = [inputs.videos_per_row[r] for r in rows] if inputs.videos_per_row is not None else None
    return PromptInputs(out, [inputs.images_per_row[r] for r in rows], copies_of, videos)


def _index(positions: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """``positions`` as an index tensor (int64 also when empty) on the device of ``like``."""
    return torch.tensor(list(positions), dtype=torch.long, device=like.device)


def repeat_rows(inputs: PromptInputs, repeats: int) -> PromptInputs:
    """Each row repeated ``repeats`` times, group-major (row ``b * repeats + k`` is a copy of row ``b``)."""
    return take_rows(inputs, [r for r in range(len(inputs)) for _ in range(repeats)])


def group_heads(inputs: PromptInputs, rows_per_prompt: int) -> PromptInputs | None:
    """The first row of each group of ``rows_per_prompt`` consecutive rows when the rows of every group are identical
    (tokens, images and videos) and the prompts end in a text token; None when the prefix cannot be shared."""
    t, n, k = inputs.tensors, len(inputs), rows_per_prompt
    if k < 2 or n % k or t["input_ids"].shape[1] < 2 or set(t) - set(PER_TOKEN_KEYS) - VISUAL_KEYS:
        return None  # nothing to share, or inputs this module does not know how to split
    for key, value in t.items():
        if key not in VISUAL_KEYS:
            grouped = value.view(n // k, k, *value.shape[1:])  # [B, K, P]
            if not torch.equal(grouped, grouped[:, :1].expand_as(grouped)):
                return None
    if "mm_token_type_ids" in t and bool(t["mm_token_type_ids"][:, -1].any()):
        return None  # generate processes the last prompt token without the images: it must be text
    for kind in inputs.visual_kinds():
        item_slices, patch_slices = inputs.slices(kind)
        for row in range(n):
            head = row - row % k
            items, head_items = item_slices[row], item_slices[head]
            same = all(
                torch.equal(t[key][items], t[key][head_items]) for key in (kind.grid, *kind.per_item) if key in t
            )
            if not same or not torch.equal(t[kind.patches][patch_slices[row]], t[kind.patches][patch_slices[head]]):
                return None
    return take_rows(inputs, range(0, n, k))


@torch.no_grad()
def prefill_shared_prefix(hf_model: nn.Module, heads: PromptInputs, rows_per_prompt: int):
    """Run the vision tower and the prefill of the prompts ``heads`` (one row per group) without their last token,
    and expand the resulting cache and rotary offsets to ``rows_per_prompt`` rows per prompt. Returns the cache."""
    inner = hf_model.model  # the multimodal backbone, without the output head (no logits needed here)
    tensors = dict(heads.tensors)
    # the positions generate would give the whole prompt (left padding, mRoPE); for Qwen-VL this also sets rope_deltas
    positions = hf_model._prepare_position_ids_for_generation(tensors["input_ids"], tensors)  # [..., B, P]
    prefix = {k: v[:, :-1] if k in PER_TOKEN_KEYS else v for k, v in tensors.items()}
    cache = inner(**prefix, position_ids=positions[..., :-1], use_cache=True).cache
    cache.batch_repeat_interleave(rows_per_prompt)
    if getattr(inner, "rope_deltas", None) is not None:  # Qwen-VL mRoPE: one offset per row, read by the decode steps
        inner.rope_deltas = inner.rope_deltas.repeat_interleave(rows_per_prompt, dim=0)
    return cache


def static_cache(config, max_cache_len: int, filled=None):
    """A transformers ``StaticCache`` of ``max_cache_len`` positions (prompt + new tokens), holding a copy of the
    ``filled`` cache's keys and values when given (the expanded shared prefix). A fixed-shape cache is what lets
    transformers compile the decoding step (it does so by itself on CUDA)."""
    from transformers import StaticCache

    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    for index, source in enumerate(filled.layers if filled is not None else ()):
        cache.layers[index].update(source.keys, source.values)
    return cache


def distinct_rows(inputs: PromptInputs) -> tuple[PromptInputs, list[int]] | None:
    """The first row of each distinct prompt (by ``copies_of``) and, for every row, the position of its prompt among
    them; None when no two rows are copies of one prompt (or nothing says so)."""
    copies_of = inputs.copies_of
    if copies_of is None or len(set(copies_of)) == len(copies_of):
        return None
    first_row: dict[int, int] = {}
    for row, prompt in enumerate(copies_of):
        first_row.setdefault(prompt, row)
    position = {prompt: index for index, prompt in enumerate(first_row)}
    return take_rows(inputs, list(first_row.values())), [position[p] for p in copies_of]


def shared_prompt_features(inner: nn.Module, inputs: PromptInputs, completion_mask: torch.Tensor) -> dict | None:
    """Keyword arguments for Qwen-VL's multimodal backbone ``inner`` over the prompt rows ``inputs`` followed by
    completions: the image features (``mm_encoder_outputs``) and the 3-D rotary positions (``position_ids``) of each
    distinct prompt, computed once and repeated to its rows, instead of the vision tower and the position search
    running on every row. The completion tokens continue the text positions after the prompt's last (text) token;
    padding after a completion gets position 0, as transformers gives masked tokens. None when no rows repeat or the
    prompts hold no images or videos (then the backbone computes everything per row, as usual). The caller drops the
    patches (``pixel_values``, ``pixel_values_videos``) from the backbone's inputs."""
    found = distinct_rows(inputs) if inputs.visual_kinds() else None
    if found is None:
        return None
    heads, prompt_of_row = found
    encoded = {"image": _repeated_features(inner, heads, prompt_of_row, IMAGE_INPUTS)}
    encoded["video"] = _repeated_features(inner, heads, prompt_of_row, VIDEO_INPUTS)
    out = {"mm_encoder_outputs": {name: features for name, features in encoded.items() if features is not None}}
    t = heads.tensors
    positions = _prompt_positions(inner, t)
    if positions is not None:  # [3, heads, P]
        positions = positions[:, _index(prompt_of_row, positions)]  # [3, N, P]
        out["position_ids"] = torch.cat([positions, _completion_positions(positions, completion_mask)], dim=-1)
    return out


def _repeated_features(
    inner: nn.Module, heads: PromptInputs, prompt_of_row: list[int], kind: VisualInputs
) -> object | None:
    """The vision tower's output for the items of ``kind`` (images or videos) of the distinct prompts ``heads``,
    repeated to the rows (``prompt_of_row``): per item, ``[tokens, H]`` features (and, for Qwen3-VL, per layer, the
    deepstack features); None when the prompts hold none of them."""
    t = heads.tensors
    if kind.grid not in t:
        return None
    encode = inner.get_image_features if kind == IMAGE_INPUTS else inner.get_video_features
    features = encode(t[kind.patches], t[kind.grid], return_dict=True)
    item_slices, _ = heads.slices(kind)
    items = [i for p in prompt_of_row for i in range(item_slices[p].start, item_slices[p].stop)]
    features.pooler_output = tuple(features.pooler_output[i] for i in items)  # per item: [tokens, H]
    if getattr(features, "deepstack_features", None) is not None:  # Qwen3-VL: per layer, per item
        features.deepstack_features = [tuple(layer[i] for i in items) for layer in features.deepstack_features]
    return features


def _prompt_positions(inner: nn.Module, tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """``[3, heads, P]`` rotary positions of the distinct prompts ``tensors`` (Qwen-VL's 3-D positions), or None."""
    return inner.compute_3d_position_ids(**position_inputs(tensors))


def position_inputs(tensors: dict[str, torch.Tensor]) -> dict:
    """Keyword arguments of a Qwen-VL backbone's ``compute_3d_position_ids`` for the prompt rows ``tensors``: their
    tokens, image and video grids and, where the processor gave it (Qwen2.5-VL), each video's seconds per temporal
    patch, which set the videos' time positions."""
    kwargs = dict(
        input_ids=tensors["input_ids"],
        inputs_embeds=None,
        image_grid_thw=tensors.get("image_grid_thw"),
        video_grid_thw=tensors.get("video_grid_thw"),
        attention_mask=tensors["attention_mask"],
        cache=None,
        mm_token_type_ids=tensors.get("mm_token_type_ids"),
    )
    if "second_per_grid_ts" in tensors:
        kwargs["second_per_grid_ts"] = tensors["second_per_grid_ts"]
    return kwargs


def _completion_positions(prompt_positions: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """``[3, N, L]`` rotary positions of the completion tokens: the text positions after each row's last prompt
    position (``prompt_positions`` ``[3, N, P]``), 0 at the padding after a completion (as transformers gives masked
    tokens)."""
    steps = torch.arange(1, completion_mask.shape[1] + 1, device=prompt_positions.device)  # [L]
    return (prompt_positions[..., -1:] + steps) * completion_mask.to(prompt_positions.dtype)  # [3, N, L]


def prefix_shared_hidden_states(
    inner: nn.Module, inputs: PromptInputs, completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor | None:
    """The last hidden states ``[N, L, H]`` that predict the completions ``completion_ids`` ``[N, L]`` of the prompt
    rows ``inputs``, with every layer of Qwen-VL's backbone ``inner`` run on each distinct prompt once: the prompt's
    forward (vision tower, 3-D positions, all its tokens) gives its last hidden state and its keys and values, and a
    forward over the rows' completion tokens attends to those, selected for each row, as to a cache.

    A row's completion tokens attend to the same keys and values as in the forward over its prompt and completion, so
    the values are that forward's up to rounding; gradients reach the prompt's layers through the selection, summed
    over the rows of each prompt. The prompt's tokens, most of a row at short completions, are computed once per prompt
    instead of once per row. None when no rows repeat, the prompts hold no images or videos, or the backbone finds no
    3-D positions (then :func:`shared_prompt_features` and the per-row forward apply)."""
    found = distinct_rows(inputs) if inputs.visual_kinds() else None
    if found is None:
        return None
    heads, prompt_of_row = found
    t = heads.tensors
    positions = _prompt_positions(inner, t)  # [3, heads, P]
    if positions is None:
        return None
    prompt = inner(**t, position_ids=positions, use_cache=True, return_dict=True)
    rows = _index(prompt_of_row, completion_ids)  # [N]: each row's prompt among the heads
    cache = prompt.cache
    cache.batch_select_indices(rows)  # [heads, ...] -> [N, ...] keys and values, differentiable
    attention_mask = torch.cat([t["attention_mask"].index_select(0, rows), completion_mask], dim=1)  # [N, P + L]
    completion = inner(
        input_ids=completion_ids,
        attention_mask=attention_mask,
        position_ids=_completion_positions(positions.index_select(1, rows), completion_mask),
        cache=cache,
        return_dict=True,
    ).last_hidden_state  # [N, L, H]: the state after each completion token
    last_prompt = prompt.last_hidden_state[:, -1:].index_select(0, rows)  # [N, 1, H]: predicts the first token
    return torch.cat([last_prompt, completion[:, :-1]], dim=1)  # [N, L, H]

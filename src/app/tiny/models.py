"""Tiny Qwen2-VL / Qwen2.5-VL / Qwen3-VL models built from config, cached on disk, loaded like hub checkpoints.

``resolve_pretrained("tiny-qwen2.5-vl")`` builds the model once (random weights, the trained-offline tokenizer and the
stock processors), saves it with ``save_pretrained`` under the cache folder and returns that folder; anything else
(a hub id or a local folder) is returned unchanged. Models and processors are then always loaded through
``from_pretrained``, so the embedded defaults and real checkpoints take the same code path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    AutoProcessor,
    PreTrainedTokenizerFast,
)

from app.tiny.cache import build_once, builder_fingerprint, check_tiny_name
from app.tiny.tokenizer import build_tokenizer

_TEXT = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
_MROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3]}


@dataclass(frozen=True)
class TinyVLMSpec:
    """How to build one embedded model: the HF model type, its config overrides and the vision patch size."""

    model_type: str
    text_config: dict[str, Any]
    vision_config: dict[str, Any]
    patch_size: int
    processor_class: str
    video_processor_class: str = "Qwen2VLVideoProcessor"


TINY_VLMS: dict[str, TinyVLMSpec] = {
    "tiny-qwen2-vl": TinyVLMSpec(
        model_type="qwen2_vl",
        text_config={**_TEXT, "rope_parameters": _MROPE},
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        patch_size=14,
        processor_class="Qwen2VLProcessor",
    ),
    "tiny-qwen2.5-vl": TinyVLMSpec(
        model_type="qwen2_5_vl",
        text_config={**_TEXT, "rope_parameters": _MROPE},
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
        ),
        patch_size=14,
        processor_class="Qwen2_5_VLProcessor",
    ),
    "tiny-qwen3-vl": TinyVLMSpec(
        model_type="qwen3_vl",
        text_config={
            **_TEXT,
            "head_dim": 16,
            "rope_parameters": {**_MROPE, "mrope_interleaved": True},
        },
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
        patch_size=16,
        processor_class="Qwen3VLProcessor",
        video_processor_class="Qwen3VLVideoProcessor",
    ),
}

# Pixel budget of the embedded processors: images are resized to between these many pixels (multiples of
# patch * merge), which keeps CPU rollouts fast. Real checkpoints keep their own processor settings.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 224 * 224


def cache_root() -> Path:
    """Folder holding built embedded models: ``$APP_CACHE_DIR`` or ``~/.cache/app``, then one folder per builder
    version (:func:`app.tiny.cache.builder_fingerprint`)."""
    base = Path(os.environ.get("APP_CACHE_DIR", Path.home() / ".cache" / "app"))
    return base / "tiny" / builder_fingerprint()


def _model_config(spec: TinyVLMSpec, tokenizer: PreTrainedTokenizerFast):
    ids = tokenizer.convert_tokens_to_ids
    token_ids = dict(
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    text_config = {
        **spec.text_config,
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    return AutoConfig.for_model(
        spec.model_type,
        text_config=text_config,
        vision_config=spec.vision_config,
        tie_word_embeddings=False,
        **token_ids,
    )


def _processor(spec: TinyVLMSpec, tokenizer: PreTrainedTokenizerFast):
    """The stock processor of the family, with the tiny model's patch size and a small pixel budget."""
    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    common = dict(patch_size=spec.patch_size, merge_size=2, temporal_patch_size=2, size=size)
    return getattr(transformers, spec.processor_class)(
        image_processor=transformers.Qwen2VLImageProcessor(**common),
        tokenizer=tokenizer,
        video_processor=getattr(transformers, spec.video_processor_class)(**common),
        chat_template=tokenizer.chat_template,
    )


def build_tiny_vlm(name: str, seed: int = 0):
    """Build an embedded model and its processor in memory (random weights, deterministic for a seed)."""
    if name not in TINY_VLMS:
        raise ValueError(f"unknown embedded model {name!r}; known: {sorted(TINY_VLMS)}")
    spec = TINY_VLMS[name]
    tokenizer = build_tokenizer(seed=seed)
    config = _model_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):  # seed the weights without resetting the caller's generator
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    processor = _processor(spec, tokenizer)
    return model, processor


def resolve_pretrained(name_or_path: str, seed: int = 0) -> str:
    """Return a folder or hub id that ``from_pretrained`` loads; embedded names are built and cached on first use."""
    if not check_tiny_name(name_or_path, TINY_VLMS, "model"):
        return name_or_path

    def write(folder: Path) -> None:
        model, processor = build_tiny_vlm(name_or_path, seed=seed)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)

    return str(build_once(cache_root() / f"{name_or_path}-seed{seed}", "config.json", write))


def load_vlm(name_or_path: str, dtype: torch.dtype | None = None, seed: int = 0, empty: bool = False, **kwargs):
    """Load model and processor through ``from_pretrained`` (embedded names are resolved first). ``empty``: the model
    as ``from_pretrained`` would build it but with its parameters on the meta device, to be sharded and filled later
    (:mod:`app.parallel.loading`; loaded normally where its checkpoint does not allow that)."""
    from app.parallel.loading import empty_transformers_model

    path = resolve_pretrained(name_or_path, seed=seed)
    transformers.utils.logging.disable_progress_bar()  # per-shard bars would interleave with the training bar
    model = empty_transformers_model(AutoModelForImageTextToText, path, dtype, **kwargs) if empty else None
    if model is None:
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, **kwargs)
    processor = AutoProcessor.from_pretrained(path)
    return model, processor

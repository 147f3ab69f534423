"""Tiny CLIP scorers built from config, cached on disk, loaded like hub checkpoints (for the learned rewards).

``resolve_scorer("tiny-clip")`` builds a CLIP model once (random weights, deterministic for its seed) with a
:class:`~transformers.CLIPProcessor`, saves both with ``save_pretrained`` under ``cache_root()/scorers`` and returns
that folder; anything else (a hub id such as ``openai/clip-vit-large-patch14`` or a local folder) is returned
unchanged. :mod:`app.rewards.learned` then loads every scorer through ``from_pretrained``, so the embedded defaults and
real checkpoints take the same code path.

``tiny-clip`` (CLIPScore's stand-in) and ``tiny-pickscore`` (PickScore's) are the same architecture with different
seeds (:data:`TINY_SCORERS`): a 2-layer text and vision tower of width 32, 32 x 32 images in 8 x 8 patches,
16-dimensional projections. Their tokenizer is the embedded BPE tokenizer (:mod:`app.tiny.tokenizer`),
right-padded and closing every text with ``<|endoftext|>`` (also its padding, as in CLIP's tokenizer; CLIP pools the
first one), at most 77 tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from app.tiny.cache import build_once, check_tiny_name
from app.tiny.models import cache_root
from app.tiny.tokenizer import build_tokenizer

SCORER_CACHE = "scorers"
TEXT_MAX_LENGTH = 77  # CLIP's text context
TINY_SCORERS: dict[str, int] = {"tiny-clip": 6, "tiny-pickscore": 11}
"""Embedded scorer name -> the seed of its weights. A random CLIP embeds every input near one direction, so a seed
fixes the sign of nearly all its image-text cosines (seed 0's are all negative: CLIPScore would be 0 everywhere); these
two give cosines on both sides of 0, spread by about 0.2-0.3. Both use the tokenizer of seed 0."""


def _tokenizer():
    """The embedded BPE tokenizer in CLIP's layout. Its ``<|im_end|>`` has id 2, which CLIP's config reads as the
    legacy "pool the highest id" rule, so ``<|endoftext|>`` (id 0) ends every text instead."""
    from tokenizers import processors

    tokenizer = build_tokenizer(seed=0)
    end = tokenizer.pad_token
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {end}", special_tokens=[(end, tokenizer.pad_token_id)]
    )
    tokenizer.eos_token = end
    tokenizer.padding_side = "right"
    tokenizer.model_max_length = TEXT_MAX_LENGTH
    tokenizer.chat_template = None
    return tokenizer


def build_tiny_scorer(name: str):
    """Build an embedded scorer in memory: ``(CLIPModel, CLIPProcessor)`` with random weights of its seed."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    if name not in TINY_SCORERS:
        raise ValueError(f"unknown embedded scorer {name!r}; known: {sorted(TINY_SCORERS)}")
    seed = TINY_SCORERS[name]
    tokenizer = _tokenizer()
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = CLIPConfig(
        text_config=dict(
            **tower,
            vocab_size=len(tokenizer),
            max_position_embeddings=TEXT_MAX_LENGTH,
            bos_token_id=tokenizer.pad_token_id,  # no start token: the config only needs an id in the vocabulary
            eos_token_id=tokenizer.pad_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(**tower, image_size=32, patch_size=8),
        projection_dim=16,
    )
    with torch.random.fork_rng(devices=[]):  # seed the weights without resetting the caller's generator
        torch.manual_seed(seed)
        model = CLIPModel(config)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return model, CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)


def resolve_scorer(name_or_path: str) -> str:
    """Return a folder or hub id that ``from_pretrained`` loads; embedded names are built and cached on first use."""
    if not check_tiny_name(name_or_path, TINY_SCORERS, "scorer"):
        return name_or_path

    def write(folder: Path) -> None:
        model, processor = build_tiny_scorer(name_or_path)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)

    return str(build_once(cache_root() / SCORER_CACHE / name_or_path, "config.json", write))

"""Tiny SD3-, Wan- and FLUX-style flow models built from config, cached on disk as a diffusers pipeline folder.

``resolve_flow_pretrained("tiny-sd3")`` builds the model once (random weights, deterministic for a seed), saves every
component with ``save_pretrained`` into the subfolders of a diffusers pipeline folder (``transformer/``, ``vae/``,
``text_encoder/``, ``tokenizer/``, ``scheduler/``, plus ``model_index.json``) under ``cache_root()/flow`` and returns
that folder; anything else (a hub id or a local folder) is returned unchanged. :func:`load_flow_components` then loads
each component with ``from_pretrained``, so the embedded defaults and real checkpoints (``stabilityai/stable-diffusion-
3.5-medium``, ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``, ``black-forest-labs/FLUX.1-dev``) take the same code path.

The embedded SD3 and Wan models differ from the real ones in their text encoders: one tiny CLIP (SD3; the real SD3
concatenates CLIP-L, CLIP-G and T5) or one tiny T5 encoder (Wan; the real one is UMT5), both with the trained-offline
BPE tokenizer. Their output sizes match the transformer configs: SD3 ``joint_attention_dim = 32`` (the encoder's hidden
size) and ``pooled_projection_dim = 64`` (its projection); Wan ``text_dim = 32``. ``tiny-flux`` keeps FLUX's real text
layout: a CLIP text model (``text_encoder``, pooled output 32 = ``pooled_projection_dim``) and a T5 encoder
(``text_encoder_2``, width 32 = ``joint_attention_dim``), each with its own tokenizer slot.

Image-conditioned variants (docs/conditioning.md): ``tiny-wan-i2v`` (Wan2.1 I2V: mask + first-frame latents
concatenated on channels, a tiny CLIP vision encoder for the image embeddings), ``tiny-wan-ti2v`` (Wan2.2 TI2V:
first-frame latent replacement, ``expand_timesteps``) and ``tiny-flux-kontext`` (FLUX.1 Kontext: reference-image tokens
appended to the sequence); their ``model_index.json`` names ``WanImageToVideoPipeline`` / ``FluxKontextPipeline``.

Sizes: ``tiny-sd3`` makes 64x64 images from 4x16x16 latents (VAE factor 4, patch 2: 64 tokens); ``tiny-wan`` makes
5-frame 32x32 videos from 4x2x4x4 latents (VAE factors 4 in time, 8 in space); ``tiny-flux`` makes 64x64 images from
16x16x16 latents (VAE factor 4, packed into 2x2 patches: 64 tokens of 64 channels), with FLUX's dynamic-shifting
scheduler and guidance embedding. The sample size of a model with no ``sample_size`` in its transformer config (Wan,
FLUX) is written to ``app_flow.json`` in the folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import processors
from transformers import PreTrainedTokenizerFast

from app.tiny.cache import build_once, check_tiny_name
from app.tiny.models import cache_root
from app.tiny.tokenizer import build_tokenizer

FLOW_CACHE = "flow"
SAMPLE_SIZE_FILE = "app_flow.json"  # {"height": ..., "width": ..., "num_frames": ...} for models without sample_size
ENCODER_SLOTS = ("text_encoder", "text_encoder_2", "text_encoder_3")  # a diffusers pipeline's text encoder slots
TOKENIZER_SLOTS = ("tokenizer", "tokenizer_2", "tokenizer_3")  # and their tokenizers, in the same order
TEXT_MAX_LENGTH = 16  # tokens per prompt of the embedded tokenizer (the real CLIP uses 77, Wan's UMT5 512)


@dataclass(frozen=True)
class TinyFlowSpec:
    """How to build one embedded flow model: diffusers class names and config overrides of each component."""

    transformer_class: str
    transformer_config: dict[str, Any]
    vae_class: str
    vae_config: dict[str, Any]
    text_encoder: str  # "clip" (with projection), "clip-pooled" (CLIPTextModel, FLUX's) or "t5"
    scheduler_config: dict[str, Any]
    pipeline_class: str
    sample_size: dict[str, int] | None = None
    text_encoder_2: str | None = None  # a second encoder (FLUX's T5), with its own copy of the tokenizer
    pipeline_config: dict[str, Any] | None = None  # extra model_index.json entries (Wan TI2V's expand_timesteps)
    image_encoder: bool = False  # a tiny CLIP vision encoder + image processor (Wan2.1 I2V's image embeddings)


_TINY_IMAGE_VAE = dict(  # the embedded image VAE: 64 px images, factor 4 latents
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 3,
    up_block_types=("UpDecoderBlock2D",) * 3,
    block_out_channels=(8, 16, 16),
    layers_per_block=1,
    norm_num_groups=8,
    sample_size=64,
)


_TINY_WAN_TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=32,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)
_TINY_WAN_VAE = dict(
    base_dim=8,
    z_dim=4,
    dim_mult=[1, 2, 2, 2],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],
    latents_mean=[0.0] * 4,
    latents_std=[1.0] * 4,
)
_TINY_FLUX_TRANSFORMER = dict(
    patch_size=1,
    in_channels=64,  # 16 latent channels packed in 2x2 patches
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=8,
    num_attention_heads=4,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    guidance_embeds=True,  # as FLUX.1-dev and FLUX.1 Kontext-dev
    axes_dims_rope=(2, 2, 4),
)
_TINY_FLUX_VAE = dict(  # FLUX's latent channels and scaling, no quant convs
    _TINY_IMAGE_VAE,
    latent_channels=16,
    scaling_factor=0.3611,
    shift_factor=0.1159,
    use_quant_conv=False,
    use_post_quant_conv=False,
)
_FLUX_SCHEDULER = dict(  # FLUX.1-dev's scheduler config
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_image_seq_len=256,
    max_image_seq_len=4096,
    base_shift=0.5,
    max_shift=1.15,
)
_WAN_SIZE = dict(height=32, width=32, num_frames=5)
_TINY_IMAGE_EMBED_DIM = 32  # hidden size of the tiny CLIP vision encoder (Wan2.1 I2V's is 1280)

TINY_FLOWS: dict[str, TinyFlowSpec] = {
    "tiny-sd3": TinyFlowSpec(
        transformer_class="SD3Transformer2DModel",
        transformer_config=dict(
            sample_size=16,
            patch_size=2,
            in_channels=4,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=32,
            caption_projection_dim=32,
            pooled_projection_dim=64,
            out_channels=4,
            pos_embed_max_size=32,
        ),
        vae_class="AutoencoderKL",
        vae_config=dict(_TINY_IMAGE_VAE, latent_channels=4, scaling_factor=1.5305, shift_factor=0.0609),  # SD3's
        text_encoder="clip",
        scheduler_config=dict(num_train_timesteps=1000, shift=3.0),
        pipeline_class="StableDiffusion3Pipeline",
    ),
    "tiny-wan": TinyFlowSpec(
        transformer_class="WanTransformer3DModel",
        transformer_config=_TINY_WAN_TRANSFORMER,
        vae_class="AutoencoderKLWan",
        vae_config=_TINY_WAN_VAE,
        text_encoder="t5",
        scheduler_config=dict(num_train_timesteps=1000, shift=3.0),
        pipeline_class="WanPipeline",
        sample_size=_WAN_SIZE,
    ),
    "tiny-flux": TinyFlowSpec(
        transformer_class="FluxTransformer2DModel",
        transformer_config=_TINY_FLUX_TRANSFORMER,
        vae_class="AutoencoderKL",
        vae_config=_TINY_FLUX_VAE,
        text_encoder="clip-pooled",
        text_encoder_2="t5",
        scheduler_config=_FLUX_SCHEDULER,
        pipeline_class="FluxPipeline",
        sample_size=dict(height=64, width=64),
    ),
    # Wan2.1-I2V style: noisy latents ++ (4 mask channels + 4 first-frame condition latents) = 12 input channels, and
    # CLIP image embeddings through the cross-attention's added key / value projections (image_dim, added_kv_proj_dim)
    "tiny-wan-i2v": TinyFlowSpec(
        transformer_class="WanTransformer3DModel",
        transformer_config=dict(
            _TINY_WAN_TRANSFORMER, in_channels=12, image_dim=_TINY_IMAGE_EMBED_DIM, added_kv_proj_dim=24
        ),
        vae_class="AutoencoderKLWan",
        vae_config=_TINY_WAN_VAE,
        text_encoder="t5",
        scheduler_config=dict(num_train_timesteps=1000, shift=3.0),
        pipeline_class="WanImageToVideoPipeline",
        sample_size=_WAN_SIZE,
        image_encoder=True,
    ),
    # Wan2.2-TI2V style: the first latent frame is replaced by the problem frame's latents, with timestep 0 there
    "tiny-wan-ti2v": TinyFlowSpec(
        transformer_class="WanTransformer3DModel",
        transformer_config=_TINY_WAN_TRANSFORMER,
        vae_class="AutoencoderKLWan",
        vae_config=_TINY_WAN_VAE,
        text_encoder="t5",
        scheduler_config=dict(num_train_timesteps=1000, shift=3.0),
        pipeline_class="WanImageToVideoPipeline",
        sample_size=_WAN_SIZE,
        pipeline_config=dict(expand_timesteps=True),
    ),
    # FLUX.1 Kontext style: the reference image's packed latent tokens follow the noisy ones in the sequence
    "tiny-flux-kontext": TinyFlowSpec(
        transformer_class="FluxTransformer2DModel",
        # two heads of 16 (same width as tiny-flux): 6 rotary dims per image axis, so a noisy token finds the reference
        # token at its own position (editing copies most of the problem frame); one more single-stream block; 4 latent
        # channels (16 per packed token) instead of FLUX's 16, so the tiny flow learns within the CPU quickstart
        transformer_config=dict(
            _TINY_FLUX_TRANSFORMER,
            in_channels=16,
            attention_head_dim=16,
            num_attention_heads=2,
            axes_dims_rope=(4, 6, 6),
            num_single_layers=2,
        ),
        vae_class="AutoencoderKL",
        vae_config=dict(_TINY_FLUX_VAE, latent_channels=4),
        text_encoder="clip-pooled",
        text_encoder_2="t5",
        scheduler_config=_FLUX_SCHEDULER,
        pipeline_class="FluxKontextPipeline",
        sample_size=dict(height=64, width=64),
    ),
}


def flow_cache_root() -> Path:
    """Folder holding built embedded flow models: ``cache_root() / "flow"``."""
    return cache_root() / FLOW_CACHE


def _tokenizer(seed: int) -> PreTrainedTokenizerFast:
    """The embedded BPE tokenizer, right-padded, closing every prompt with ``<|endoftext|>`` (also its padding, as in
    CLIP's tokenizer; CLIP pools the first one). Its ``<|im_end|>`` has id 2, which CLIP's config reads as the legacy
    "pool the highest id" rule, so it is not used as the end token."""
    tokenizer = build_tokenizer(seed=seed)
    end = tokenizer.pad_token
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {end}", special_tokens=[(end, tokenizer.pad_token_id)]
    )
    tokenizer.eos_token = end
    tokenizer.padding_side = "right"
    tokenizer.model_max_length = TEXT_MAX_LENGTH
    tokenizer.chat_template = None
    return tokenizer


def _text_encoder(kind: str, tokenizer: PreTrainedTokenizerFast):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    common = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.pad_token_id)
    if kind in ("clip", "clip-pooled"):
        config = CLIPTextConfig(
            hidden_size=32,
            intermediate_size=64,
            projection_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=TEXT_MAX_LENGTH,
            bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
            **common,
        )
        return CLIPTextModelWithProjection(config) if kind == "clip" else CLIPTextModel(config)
    config = T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, is_encoder_decoder=False, **common)
    return T5EncoderModel(config)


def build_tiny_flow(name: str, seed: int = 0) -> dict[str, Any]:
    """Build an embedded flow model's components in memory (random weights, deterministic for a seed)."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler

    if name not in TINY_FLOWS:
        raise ValueError(f"unknown embedded flow model {name!r}; known: {sorted(TINY_FLOWS)}")
    spec = TINY_FLOWS[name]
    tokenizer = _tokenizer(seed)
    with torch.random.fork_rng(devices=[]):  # seed the weights without resetting the caller's generator
        torch.manual_seed(seed)
        components = dict(
            transformer=getattr(diffusers, spec.transformer_class)(**spec.transformer_config),
            vae=getattr(diffusers, spec.vae_class)(**spec.vae_config),
            text_encoder=_text_encoder(spec.text_encoder, tokenizer),
            tokenizer=tokenizer,
            scheduler=FlowMatchEulerDiscreteScheduler(**spec.scheduler_config),
        )
        if spec.text_encoder_2 is not None:  # built last, so the other components' weights do not depend on it
            components |= dict(
                text_encoder_2=_text_encoder(spec.text_encoder_2, tokenizer), tokenizer_2=_tokenizer(seed)
            )
        if spec.image_encoder:
            components |= _image_encoder(spec.sample_size or {})
    return components


def _image_encoder(sample_size: dict[str, int]) -> dict[str, Any]:
    """A tiny CLIP vision encoder and its image processor at the model's frame size (Wan2.1 I2V's are ViT-H/14 at
    224 px); the pipeline feeds the encoder's penultimate hidden states to the transformer."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    side = min(sample_size.get("height", 32), sample_size.get("width", 32))
    config = CLIPVisionConfig(
        hidden_size=_TINY_IMAGE_EMBED_DIM,
        intermediate_size=64,
        projection_dim=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=side,
        patch_size=8,
    )
    processor = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    return dict(image_encoder=CLIPVisionModel(config), image_processor=processor)


def _model_index(spec: TinyFlowSpec, components: dict[str, Any]) -> dict[str, Any]:
    """A ``model_index.json`` naming each component's library and class, as diffusers writes it."""
    index: dict[str, Any] = {"_class_name": spec.pipeline_class, **(spec.pipeline_config or {})}
    for key, component in components.items():
        library = type(component).__module__.split(".")[0]
        index[key] = [library, type(component).__name__]
    return index


def resolve_flow_pretrained(name_or_path: str, seed: int = 0) -> str:
    """Return a pipeline folder or hub id; embedded names are built and cached on first use."""
    if not check_tiny_name(name_or_path, TINY_FLOWS, "flow model"):
        return name_or_path
    spec = TINY_FLOWS[name_or_path]

    def write(folder: Path) -> None:
        components = build_tiny_flow(name_or_path, seed=seed)
        for key, component in components.items():
            component.save_pretrained(folder / key)
        if spec.sample_size is not None:
            (folder / SAMPLE_SIZE_FILE).write_text(json.dumps(spec.sample_size, indent=2) + "\n")
        # written last: its presence marks a complete folder
        (folder / "model_index.json").write_text(json.dumps(_model_index(spec, components), indent=2) + "\n")

    return str(build_once(flow_cache_root() / f"{name_or_path}-seed{seed}", "model_index.json", write))


def _load_component(path: str, subfolder: str, library: str, dtype: torch.dtype | None):
    """``from_pretrained`` of one subfolder, the class read from its config (``_class_name`` or ``architectures``)."""
    import diffusers
    import transformers

    if library == "diffusers":
        config = _read_json(path, f"{subfolder}/config.json")
        return getattr(diffusers, config["_class_name"]).from_pretrained(path, subfolder=subfolder, torch_dtype=dtype)
    config = _read_json(path, f"{subfolder}/config.json")
    model_class = getattr(transformers, config["architectures"][0])
    return model_class.from_pretrained(path, subfolder=subfolder, dtype=dtype)


def _empty_transformer(path: str, dtype: torch.dtype | None):
    import diffusers

    from app.parallel.loading import empty_diffusers_model

    model_class = getattr(diffusers, _read_json(path, "transformer/config.json")["_class_name"])
    return empty_diffusers_model(model_class, path, "transformer", dtype)


def _read_json(path: str, filename: str) -> dict[str, Any] | None:
    """A JSON file of a local folder or of a hub repository (from the local hub cache when offline)."""
    local = Path(path) / filename
    if Path(path).is_dir():
        return json.loads(local.read_text()) if local.exists() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return json.loads(Path(hf_hub_download(path, filename)).read_text())
    except EntryNotFoundError:
        return None


def load_flow_components(
    name_or_path: str, dtype: torch.dtype | None = None, seed: int = 0, empty_transformer: bool = False
) -> dict[str, Any]:
    """Load transformer, VAE, scheduler, text encoder(s) and tokenizer(s) through ``from_pretrained``.

    ``empty_transformer``: the transformer as ``from_pretrained`` would build it but with its parameters on the meta
    device, to be sharded and filled later (:mod:`app.parallel.loading`; loaded normally where its checkpoint does not
    allow that); the other components load as usual.

    Returns a dict with ``transformer``, ``vae``, ``scheduler``, ``text_encoders`` and ``tokenizers`` (by pipeline
    slot: ``text_encoder``, ``text_encoder_2``, ... and ``tokenizer``, ``tokenizer_2``, ...; only the slots the folder
    fills), ``sample_size`` (the ``app_flow.json`` dict or None), ``path``, ``pipeline_class`` (``model_index.json``'s
    ``_class_name``), ``pipeline_config`` (its plain entries, e.g. ``expand_timesteps``) and ``image_encoder`` /
    ``image_processor`` (a CLIP vision model and its processor where the folder has them, else None).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import AutoTokenizer

    path = resolve_flow_pretrained(name_or_path, seed=seed)
    index = _read_json(path, "model_index.json") or {}
    components: dict[str, Any] = dict(path=path)
    components["transformer"] = _empty_transformer(path, dtype) if empty_transformer else None
    if components["transformer"] is None:
        components["transformer"] = _load_component(path, "transformer", "diffusers", dtype)
    components["vae"] = _load_component(path, "vae", "diffusers", dtype)
    components["scheduler"] = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
    slots = [slot for slot in ENCODER_SLOTS if slot == "text_encoder" or slot in index]
    if index:
        slots = [slot for slot in slots if isinstance(index.get(slot), list) and index[slot][0] is not None]
    components["text_encoders"] = {slot: _load_component(path, slot, "transformers", dtype) for slot in slots}
    components["tokenizers"] = {
        token_slot: AutoTokenizer.from_pretrained(path, subfolder=token_slot)
        for slot, token_slot in zip(ENCODER_SLOTS, TOKENIZER_SLOTS, strict=True)
        if slot in slots
    }
    components["sample_size"] = _read_json(path, SAMPLE_SIZE_FILE)
    components["pipeline_class"] = index.get("_class_name")
    components["pipeline_config"] = {
        k: v for k, v in index.items() if not k.startswith("_") and not isinstance(v, list)
    }
    components["image_encoder"] = components["image_processor"] = None
    if isinstance(index.get("image_encoder"), list) and index["image_encoder"][0] is not None:
        from transformers import CLIPImageProcessor

        components["image_encoder"] = _load_component(path, "image_encoder", "transformers", dtype)
        components["image_processor"] = CLIPImageProcessor.from_pretrained(path, subfolder="image_processor")
    return components

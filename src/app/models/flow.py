"""The flow policy: a diffusers flow transformer (SD3-, FLUX- or Wan-style) + VAE + text encoders, with optional LoRA.

One class owns everything that touches the models, so the flow-GRPO module only sees prompts, latents, velocities and
decoded pixels. The samplers (:mod:`app.sampling.flow`) are pure step functions; a rollout is::

    sigmas = policy.sigmas(T)                                     # [T + 1], 1 -> 0
    cond = policy.encode_prompts(prompts)                         # {"encoder_hidden_states": [B, L, D], ...}
    x = policy.initial_noise(B, generator)                        # [B, *latent_shape]
    for i in range(T):
        v = policy.velocity(x, sigmas[i].expand(B), cond)         # [B, *latent_shape] float32
        x = ode_step(x, v, sigmas[i], sigmas[i + 1]).sample       # or sde_step / cps_step with log-probs
    pixels = policy.decode(x)                                     # [B, 3, H, W] or [B, T, 3, H, W] in [0, 1]

Image-to-video (Wan I2V / TI2V) and image-edit (FLUX Kontext) models are conditioned on a problem frame as their
diffusers pipelines do (:mod:`app.models.flow_conditioning`, docs/conditioning.md): ``cond |= policy.encode_conditions(
images)`` adds the condition tensors, and :meth:`FlowPolicy.velocity` feeds them to the transformer.

Text encoding (:mod:`app.models.flow_text`) follows the diffusers pipelines, SD3's three encoders and FLUX's two
included.

FLUX (``FluxTransformer2DModel``) takes its latents as a sequence of 2x2-patch tokens. The samplers still see the
unpacked ``[B, 16, H/8, W/8]`` latents: :meth:`FlowPolicy.velocity` packs them, builds the position ids and the
distilled-guidance input as ``FluxPipeline`` does (with its own static helpers) and unpacks the velocity. Its schedule
is ``FluxPipeline``'s: base sigmas ``linspace(1, 1/T, T)``, shifted by the ``mu`` of the packed token count.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from app.dtypes import parse_dtype
from app.models import flow_conditioning as conditioning_lib
from app.models.flow_text import DEFAULT_MAX_SEQUENCE_LENGTH, FlowTextEncoder
from app.models.kernels import apply_liger_rms_norm, require_liger, set_flow_attention_backend
from app.models.lora import trainable_transformer
from app.models.policy import SwitchableReference
from app.parallel.loading import keeping_new_parameters, lean_loading_requested
from app.parallel.plan import ShardingPlan, repeated_blocks
from app.sampling.flow import flow_sigmas
from app.settings import FLOW_ATTENTION_PROJECTIONS, LoRASettings, with_defaults
from app.tiny.flow_models import SAMPLE_SIZE_FILE, load_flow_components
from app.types import VisualSample

log = logging.getLogger(__name__)

_WAN_DEFAULT_SIZE = dict(height=480, width=832, num_frames=81)  # WanPipeline's defaults
_LONG_TEXT_LENGTH = 512  # WanPipeline's and FluxPipeline's max_sequence_length
_FLUX_DEFAULT_SIZE = dict(height=1024, width=1024)  # FluxPipeline's default_sample_size 128 x its VAE factor 8


class FlowPolicy(SwitchableReference, nn.Module):
    """A rectified-flow image or video generator loaded through ``from_pretrained``.

    Args:
        model: an embedded name (``tiny-sd3``, ``tiny-wan``, ``tiny-flux``; image-conditioned ``tiny-wan-i2v``,
            ``tiny-wan-ti2v``, ``tiny-flux-kontext``), a diffusers pipeline folder or hub id (its
            ``transformer/``, ``vae/``, ``scheduler/`` and every ``text_encoder*/`` with its ``tokenizer*/`` are
            loaded), or a folder written by :meth:`export`.
        lora: LoRA settings; None trains the whole transformer (and :meth:`enable_reference` keeps a frozen copy as
            the KL reference).
        dtype: weight dtype of every component: float32, bfloat16 or float16. Velocities are returned in float32.
        seed: seed of the embedded model's random weights (ignored for real checkpoints).
        max_sequence_length: token limit of T5-like text encoders; None: 512 for Wan and FLUX, else 256 (SD3).
        resolution: ``{"height": H, "width": W}`` in pixels (and ``"num_frames"`` for video models) of the samples;
            None: the model's own (an embedded model's, SD3's transformer ``sample_size``, Wan's 480 x 832 x 81,
            FLUX's 1024 x 1024). FLUX needs sides divisible by twice the VAE factor (16 for the real VAE).
        gradient_checkpointing: recompute the transformer's blocks in the backward pass (diffusers'
            ``enable_gradient_checkpointing``): less activation memory for about one more forward per update.
        flux_guidance: the distilled guidance fed to a FLUX transformer with ``guidance_embeds`` (FLUX.1-dev's
            default 3.5, ``FluxPipeline``'s ``guidance_scale``); unused by other models.
        attention_backend: diffusers' attention dispatcher backend of the transformer: ``native`` (PyTorch SDPA),
            ``_native_flash`` (PyTorch's flash kernel, CUDA), ``flash`` (flash-attn), ``_flash_3`` (FlashAttention-3);
            None keeps diffusers' default. A short error when unavailable, see :mod:`app.models.kernels`.
        use_liger_kernel: replace the transformer's RMSNorms (Wan's and FLUX's query/key norms, SD3.5's with
            ``qk_norm``) with Liger's fused RMSNorm around the same weights (needs liger-kernel and CUDA: an error
            otherwise). ``liger_rms_norms`` lists what was replaced.
    """

    prompt_cache_size: int = 4096  # prompts whose text conditioning is kept (least recently used dropped first)

    def __init__(
        self,
        model: str = "tiny-sd3",
        lora: LoRASettings | None = LoRASettings(),  # noqa: B008 (read only, never mutated)
        dtype: str = "float32",
        seed: int = 0,
        max_sequence_length: int | None = None,
        resolution: dict[str, int] | None = None,
        gradient_checkpointing: bool = False,
        flux_guidance: float = 3.5,
        attention_backend: str | None = None,
        use_liger_kernel: bool = False,
    ):
        super().__init__()
        torch_dtype = parse_dtype(dtype)
        _quiet_progress_bars()
        if use_liger_kernel:
            require_liger()  # before loading the weights
        # an empty transformer (meta parameters, weights read after sharding) inside app.parallel.loading.lean_loading
        empty = lean_loading_requested()
        components = load_flow_components(model, dtype=torch_dtype, seed=seed, empty_transformer=empty)
        self.model_name = model
        self.source_path = components["path"]
        self.uses_lora = lora is not None
        self.scheduler = components["scheduler"]
        self.conditioning_mode: str | None = conditioning_lib.conditioning_mode(
            components.get("pipeline_class"), components.get("pipeline_config")
        )  # "kontext", "wan_i2v", "wan_ti2v" or None (text only), see app.models.flow_conditioning
        self.image_encoder = components.get("image_encoder")
        if self.image_encoder is not None:
            self.image_encoder.requires_grad_(False).eval()
        self.image_processor = components.get("image_processor")
        unknown = sorted(set(resolution or {}) - {"height", "width", "num_frames"})
        if unknown:
            raise ValueError(f"resolution takes height, width and num_frames; got unknown keys {unknown}")
        self.sample_size: dict | None = {**(components["sample_size"] or {}), **(resolution or {})} or None
        self.vae = components["vae"].requires_grad_(False).eval()
        transformer = components["transformer"]
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        if attention_backend is not None:
            set_flow_attention_backend(transformer, attention_backend)
        self.liger_rms_norms: list[str] | None = apply_liger_rms_norm(transformer) if use_liger_kernel else None
        self.is_video: bool = "temperal_downsample" in self.vae.config  # Wan-style causal video VAE
        self.is_flux: bool = _pipeline_class(transformer) == "FluxPipeline"  # packed 2x2-patch latent tokens
        self.flux_guidance = float(flux_guidance)
        self.guidance_distilled: bool = self.is_flux and bool(transformer.config.guidance_embeds)
        if max_sequence_length is None:
            long_text = self.is_video or self.is_flux  # WanPipeline and FluxPipeline encode 512 tokens
            max_sequence_length = _LONG_TEXT_LENGTH if long_text else DEFAULT_MAX_SEQUENCE_LENGTH
        if transformer.config.get("added_kv_proj_dim") is not None and max_sequence_length != _LONG_TEXT_LENGTH:
            raise ValueError(  # diffusers' Wan I2V attention takes all but the last 512 context tokens as image tokens
                f"a Wan I2V model with image embeddings needs max_sequence_length = {_LONG_TEXT_LENGTH} (its attention "
                f"splits the context at 512 text tokens), got {max_sequence_length}"
            )
        self.text_encoder = FlowTextEncoder(
            components["text_encoders"],
            components["tokenizers"],
            wants_pooled=transformer.config.get("pooled_projection_dim") is not None,
            max_sequence_length=max_sequence_length,
            pipeline_class=_pipeline_class(transformer),
        )
        self.latent_shape: tuple[int, ...] = self._latent_shape(transformer)
        with keeping_new_parameters(transformer):  # an empty transformer keeps the adapters' initial values
            if lora is not None:
                lora = with_defaults(lora, dropout=0.0, target_modules=FLOW_ATTENTION_PROJECTIONS)
            self.model = trainable_transformer(transformer, lora, model)  # PeftModel with LoRA, else the transformer
        self.model.train()  # from_pretrained returns eval mode; the trained transformer is in train mode
        self.frozen_reference: nn.Module | None = None  # full fine-tuning's KL reference, see enable_reference
        self._use_reference = False
        self._prompt_cache: OrderedDict[str, dict[str, Tensor]] = OrderedDict()

    def _latent_shape(self, transformer: nn.Module) -> tuple[int, ...]:
        if self.is_flux:
            return self._flux_latent_shape(transformer)
        channels = transformer.config.in_channels
        if self.is_video:  # an I2V transformer also takes the mask and condition channels: the latents are the VAE's
            channels = self.vae.config.z_dim
        if not self.is_video:
            spatial = 2 ** (len(self.vae.config.block_out_channels) - 1)
            size = self.sample_size or {}
            height = size.get("height", transformer.config.sample_size * spatial) // spatial
            width = size.get("width", transformer.config.sample_size * spatial) // spatial
            return (channels, height, width)
        config, downsample = self.vae.config, self.vae.config.temperal_downsample
        # the VAE's own factors where it states them (Wan2.2's VAE patchifies: spatial 16 with three downsamples)
        temporal = config.get("scale_factor_temporal") or 2 ** sum(downsample)
        spatial = config.get("scale_factor_spatial") or 2 ** len(downsample)
        size = {**_WAN_DEFAULT_SIZE, **(self.sample_size or {})}
        if (size["num_frames"] - 1) % temporal:
            raise ValueError(f"num_frames must be 1 + {temporal} k for this VAE, got {size['num_frames']}")
        frames = (size["num_frames"] - 1) // temporal + 1
        return (channels, frames, size["height"] // spatial, size["width"] // spatial)

    def _flux_latent_shape(self, transformer: nn.Module) -> tuple[int, int, int]:
        """``(in_channels / 4, H / f, W / f)`` for VAE factor f; the sides must pack into whole 2x2 patches."""
        spatial = 2 ** (len(self.vae.config.block_out_channels) - 1)
        size = {**_FLUX_DEFAULT_SIZE, **(self.sample_size or {})}
        if size["height"] % (2 * spatial) or size["width"] % (2 * spatial):
            raise ValueError(
                f"FLUX packs latents in 2x2 patches: height and width must be divisible by {2 * spatial}, got "
                f"{size['height']} x {size['width']}"
            )
        return (transformer.config.in_channels // 4, size["height"] // spatial, size["width"] // spatial)

    # --------------------------------------------------------------------------------------------------- schedule
    def sigmas(self, num_steps: int) -> Tensor:
        """The ``[num_steps + 1]`` float32 sigmas (1 -> 0) of the model's scheduler config, for this latent size."""
        config = {k: v for k, v in self.scheduler.config.items() if not k.startswith("_")}
        shift = config.pop("shift", 1.0)
        dynamic = config.pop("use_dynamic_shifting", False)
        mu = self._dynamic_shift_mu(config) if dynamic else None
        base = np.linspace(1.0, 1 / num_steps, num_steps) if self.is_flux else None  # FluxPipeline's default sigmas
        return flow_sigmas(num_steps, shift=shift, use_dynamic_shifting=dynamic, mu=mu, base_sigmas=base, **config)

    def _dynamic_shift_mu(self, config: dict) -> float:
        """The pipelines' ``calculate_shift``: mu linear in the transformer's token count between two anchors."""
        patch = 2 if self.is_flux else self.transformer.config.patch_size  # FLUX packs 2x2 latent patches per token
        patch = tuple(patch) if isinstance(patch, (list, tuple)) else (1,) * (len(self.latent_shape) - 3) + (patch,) * 2
        seq_len = math.prod(n // p for n, p in zip(self.latent_shape[1:], patch, strict=True))
        base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
        base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", 1.15)
        slope = (max_shift - base_shift) / (max_len - base_len)
        return seq_len * slope + base_shift - slope * base_len

    # ----------------------------------------------------------------------------------------------------- prompts
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, Tensor]:
        """Text conditioning of each prompt, stacked: ``encoder_hidden_states`` ``[B, L, D]`` and, for SD3-style
        transformers, ``pooled_projections`` ``[B, P]``. Each prompt is encoded once and kept in an LRU cache."""
        missing = list(dict.fromkeys(p for p in prompts if p not in self._prompt_cache))
        if missing:
            encoded = self._encode_text(missing)
            for i, prompt in enumerate(missing):
                self._prompt_cache[prompt] = {key: value[i : i + 1] for key, value in encoded.items()}
        rows = []
        for prompt in prompts:
            self._prompt_cache.move_to_end(prompt)
            rows.append(self._prompt_cache[prompt])
        while len(self._prompt_cache) > self.prompt_cache_size:
            self._prompt_cache.popitem(last=False)
        device = self.device
        return {key: torch.cat([row[key] for row in rows]).to(device) for key in rows[0]}

    def cached_conditioning(self, prompt: str) -> dict[str, Tensor] | None:
        """The cached conditioning of one prompt (``[1, ...]`` tensors), or None if it has not been encoded."""
        return self._prompt_cache.get(prompt)

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        encoded = self.text_encoder(prompts)
        hidden = encoded["encoder_hidden_states"]  # [B, L, D]
        if self.transformer.config.get("added_kv_proj_dim") is not None and hidden.shape[1] < _LONG_TEXT_LENGTH:
            # Wan I2V's attention reads the context's last 512 tokens as text: zero-pad as WanPipeline does
            padding = hidden.new_zeros(hidden.shape[0], _LONG_TEXT_LENGTH - hidden.shape[1], hidden.shape[2])
            encoded["encoder_hidden_states"] = torch.cat([hidden, padding], dim=1)
        return encoded

    # ------------------------------------------------------------------------------------------------ conditions
    @property
    def is_conditioned(self) -> bool:
        """Whether the model takes a problem image (image-to-video or image edit)."""
        return self.conditioning_mode is not None

    def condition_images(self, samples: Sequence[VisualSample]) -> Tensor | None:
        """The problem frames ``[B, 3, H, W]`` of the samples (each one's ``images[0]``, at the frame size) when the
        model is image-conditioned, else None: what rollouts and evaluation pass to the sampler as ``images``."""
        if not self.is_conditioned:
            return None
        return conditioning_lib.condition_images(samples, *self.frame_size)

    @property
    def num_frames(self) -> int:
        """Pixel frames of a video sample (1 + temporal factor * (latent frames - 1))."""
        return 1 + self.vae.config.scale_factor_temporal * (self.latent_shape[1] - 1) if self.is_video else 1

    @property
    def frame_size(self) -> tuple[int, int]:
        """``(height, width)`` of a generated frame in pixels."""
        factor = (
            self.vae.config.scale_factor_spatial
            if self.is_video
            else 2 ** (len(self.vae.config.block_out_channels) - 1)
        )
        return self.latent_shape[-2] * factor, self.latent_shape[-1] * factor

    def encode_conditions(self, images: Tensor) -> dict[str, Tensor]:
        """The condition tensors of problem images ``[B, 3, H, W]`` in [0, 1] at :attr:`frame_size`, one row per image
        (see :mod:`app.models.flow_conditioning`): ``image_latents`` (Kontext), ``condition`` and, with an image
        encoder, ``encoder_hidden_states_image`` (Wan I2V), ``first_frame_latents`` (Wan TI2V)."""
        if images.shape[-2:] != self.frame_size:
            raise ValueError(f"condition images must be {self.frame_size} (H, W), got {tuple(images.shape[-2:])}")
        return conditioning_lib.encode_conditions(self, images)

    # ------------------------------------------------------------------------------------------------- sampling
    def initial_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Standard normal latents ``[B, *latent_shape]`` in float32 (drawn on the generator's device)."""
        device = generator.device if generator is not None else self.device
        noise = torch.randn((batch, *self.latent_shape), generator=generator, device=device, dtype=torch.float32)
        return noise.to(self.device)

    def velocity(self, latents: Tensor, sigma: Tensor, conditioning: dict[str, Tensor]) -> Tensor:
        """The transformer's velocity ``[B, *latent_shape]`` in float32 at noise level ``sigma`` (``[B]`` or a scalar).

        The timestep is ``sigma * num_train_timesteps`` as in diffusers. A conditioning batch of 1 is broadcast. FLUX
        runs on the packed tokens (see :meth:`_flux_forward`). Classifier-free guidance is the sampler's
        (:class:`app.sampling.FlowSampler`); inside :meth:`reference` this is the reference policy's velocity.
        """
        batch = latents.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).reshape(-1).expand(batch)  # [B]
        timestep = sigma * self.scheduler.config.num_train_timesteps  # [B]
        conditioning = {k: v.expand(batch, *v.shape[1:]) if v.shape[0] == 1 else v for k, v in conditioning.items()}
        dtype = self.transformer.dtype
        kwargs = {k: v.to(dtype) for k, v in conditioning.items() if k not in conditioning_lib.CONDITION_KEYS}
        model = self.frozen_reference if self._use_reference else self.model
        if self.is_flux:
            image_latents = conditioning.get(conditioning_lib.IMAGE_LATENTS)
            return self._flux_forward(model, latents.to(dtype), timestep, kwargs, image_latents).float()
        model_input = latents.to(dtype)
        first_frame = conditioning.get(conditioning_lib.FIRST_FRAME)
        if first_frame is not None:  # Wan TI2V: first latent frame replaced, per-token timesteps
            model_input, timestep = conditioning_lib.ti2v_inputs(
                model_input, first_frame, timestep, self.transformer.config.patch_size
            )
        elif conditioning_lib.CONDITION in conditioning:  # Wan I2V: mask + condition latents on the channel axis
            model_input = torch.cat([model_input, conditioning[conditioning_lib.CONDITION].to(dtype)], dim=1)
        elif model_input.shape[1] != self.transformer.config.in_channels:
            raise ValueError(
                f"{self.model_name!r} is an image-to-video model ({self.transformer.config.in_channels} input "
                "channels): its conditioning needs the problem frame's 'condition' (FlowPolicy.encode_conditions)"
            )
        out = model(hidden_states=model_input, timestep=timestep, return_dict=False, **kwargs)[0].float()
        if first_frame is not None:
            out = conditioning_lib.ti2v_velocity(out, latents.float(), first_frame.float(), sigma)
        return out  # [B, *latent_shape]

    def _flux_forward(
        self, model: nn.Module, latents: Tensor, timestep: Tensor, kwargs: dict[str, Tensor], image_latents=None
    ) -> Tensor:
        """One FLUX transformer call as in ``FluxPipeline.__call__``, on latents ``[B, C, h, w]`` -> ``[B, C, h, w]``;
        with ``image_latents`` ``[B, C, h', w']`` as ``FluxKontextPipeline.__call__`` (reference tokens appended)."""
        from diffusers import FluxPipeline

        batch, channels, height, width = latents.shape
        packed = FluxPipeline._pack_latents(latents, batch, channels, height, width)  # [B, h/2 * w/2, 4 C]
        img_ids = FluxPipeline._prepare_latent_image_ids(batch, height // 2, width // 2, latents.device, latents.dtype)
        text_length = kwargs["encoder_hidden_states"].shape[1]
        txt_ids = torch.zeros(text_length, 3, device=latents.device, dtype=latents.dtype)  # as encode_prompt's
        tokens = packed.shape[1]
        if image_latents is not None:
            packed, img_ids = conditioning_lib.kontext_tokens(packed, image_latents, img_ids)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((batch,), self.flux_guidance, device=latents.device, dtype=torch.float32)
        out = model(
            hidden_states=packed,
            timestep=timestep / 1000,
            guidance=guidance,
            img_ids=img_ids,
            txt_ids=txt_ids,
            return_dict=False,
            **kwargs,
        )[0][:, :tokens]
        # _unpack_latents takes pixel sizes and the VAE factor; latent sizes with factor 1 give the same [B, C, h, w]
        return FluxPipeline._unpack_latents(out, height, width, vae_scale_factor=1)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Pixels in [0, 1], float32: images ``[B, 3, H, W]`` or videos ``[B, T, 3, H, W]`` (no gradient)."""
        config = self.vae.config
        latents = latents.to(self.vae.dtype)
        if self.is_video:  # WanPipeline: z * std + mean per channel
            shape = (1, -1, 1, 1, 1)
            mean = torch.tensor(config.latents_mean, dtype=latents.dtype, device=latents.device).view(shape)
            std = torch.tensor(config.latents_std, dtype=latents.dtype, device=latents.device).view(shape)
            pixels = self.vae.decode(latents * std + mean, return_dict=False)[0]  # [B, 3, T, H, W]
            pixels = pixels.permute(0, 2, 1, 3, 4)  # [B, T, 3, H, W]
        else:  # StableDiffusion3Pipeline and FluxPipeline: z / scaling + shift
            latents = latents / config.scaling_factor + (config.shift_factor or 0.0)
            pixels = self.vae.decode(latents, return_dict=False)[0]  # [B, 3, H, W]
        return (pixels.float() / 2 + 0.5).clamp(0, 1)

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """Latents ``[B, *latent_shape]`` (float32) of images ``[B, 3, H, W]`` in [0, 1]: the VAE posterior's mean,
        ``(z - shift) * scaling`` as in StableDiffusion3Pipeline and FluxPipeline, so ``decode(encode(x))`` reconstructs
        ``x``. Images only (the video VAE is not supported)."""
        if self.is_video:
            raise NotImplementedError("encode supports image VAEs only")
        config = self.vae.config
        pixels = (images.to(device=self.device, dtype=self.vae.dtype) * 2 - 1).clamp(-1, 1)
        latents = self.vae.encode(pixels).latent_dist.mode()
        return ((latents - (config.shift_factor or 0.0)) * config.scaling_factor).float()

    # --------------------------------------------------------------------------------------------- training utils
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def train(self, mode: bool = True):
        super().train(mode)
        for frozen in (self.vae, self.text_encoder, self.frozen_reference, self.image_encoder):
            if frozen is not None:
                frozen.eval()
        return self

    # --------------------------------------------------------------------------------------------------- export
    def export(self, output_dir: str | Path) -> Path:
        """Write a diffusers pipeline folder: ``transformer/`` (LoRA merged), ``vae/``, ``scheduler/``, the text
        encoders and tokenizers, and with LoRA the adapter alone under ``transformer_lora/`` (PEFT format).

        The folder loads back with ``FlowPolicy(model=output_dir)``, and its transformer with
        ``SD3Transformer2DModel.from_pretrained(output_dir, subfolder="transformer")`` (or the Wan / FLUX class). The
        adapter goes onto the base transformer with ``peft.PeftModel.from_pretrained(base_transformer,
        output_dir / "transformer_lora")`` (``.merge_and_unload()`` gives the merged model); the whole folder opens
        with the pipeline class named in its ``model_index.json`` (``StableDiffusion3Pipeline.from_pretrained``,
        ``FluxPipeline.from_pretrained``).
        """
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        if self.uses_lora:
            self.model.save_pretrained(output_dir / "transformer_lora")
            merged = copy.deepcopy(self.model).merge_and_unload()
        else:
            merged = self.model
        merged.save_pretrained(output_dir / "transformer")
        index = {"_class_name": self.pipeline_class, "transformer": ["diffusers", type(merged).__name__]}
        if self.conditioning_mode == conditioning_lib.WAN_TI2V:
            index["expand_timesteps"] = True
        parts = dict(vae=self.vae, scheduler=self.scheduler)
        if self.image_encoder is not None:
            parts |= dict(image_encoder=self.image_encoder, image_processor=self.image_processor)
        for key, part in parts.items():
            part.save_pretrained(output_dir / key)
            index[key] = [type(part).__module__.split(".")[0], type(part).__name__]
        index |= self.text_encoder.save_pretrained(output_dir)
        if self.sample_size is not None:
            (output_dir / SAMPLE_SIZE_FILE).write_text(json.dumps(self.sample_size, indent=2) + "\n")
        (output_dir / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
        return output_dir

    # ---------------------------------------------------------------------------------------------------- utils
    @property
    def pipeline_class(self) -> str:
        """The diffusers pipeline that runs this model: the text-to-X one, or the conditioned style's."""
        conditioned = {
            conditioning_lib.KONTEXT: "FluxKontextPipeline",
            conditioning_lib.WAN_I2V: "WanImageToVideoPipeline",
            conditioning_lib.WAN_TI2V: "WanImageToVideoPipeline",
        }
        return conditioned.get(self.conditioning_mode, _pipeline_class(self.transformer))

    def sharding_plan(self) -> ShardingPlan:
        """FSDP units: the transformer blocks of the policy and of its frozen reference; roots: the transformer and
        the reference (their forwards are what :meth:`velocity` calls); the VAE and text encoders stay whole."""
        networks = [self.transformer] + ([self.frozen_reference] if self.frozen_reference is not None else [])
        units = [block for network in networks for block in repeated_blocks(network, ("TransformerBlock",))]
        parts = (self.vae, self.text_encoder, getattr(self, "image_encoder", None))
        frozen = [part for part in parts if part is not None]
        return ShardingPlan(units=units, roots=networks, replicated=frozen)

    @property
    def transformer(self) -> nn.Module:
        """The diffusers transformer (:attr:`base_network`)."""
        return self.base_network


def _pipeline_class(transformer: nn.Module) -> str:
    name = type(transformer).__name__
    pipelines = {
        "SD3Transformer2DModel": "StableDiffusion3Pipeline",
        "WanTransformer3DModel": "WanPipeline",
        "FluxTransformer2DModel": "FluxPipeline",
    }
    return pipelines.get(name, "DiffusionPipeline")


def _quiet_progress_bars() -> None:
    """Per-shard loading bars would interleave with the training bar."""
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()

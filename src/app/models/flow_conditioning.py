"""Image conditioning of a flow policy: the problem frame as diffusers' image-to-video and image-edit pipelines use it.

Three styles, chosen by the model folder's ``model_index.json`` (docs/conditioning.md has the equations):

- ``wan_i2v`` (``WanImageToVideoPipeline``, Wan2.1-I2V / Wan2.2-I2V): the video ``[image, 0, ..., 0]`` is VAE-encoded
  and normalised; a binary mask (1 on the first pixel frame, repeated ``vae_scale_factor_temporal`` times so the first
  latent frame has that many mask channels) is stacked on it, and ``condition = [mask, latents]`` is concatenated with
  the noisy latents on the channel axis. A model with ``image_dim`` also takes the CLIP vision encoder's penultimate
  hidden states as ``encoder_hidden_states_image``.
- ``wan_ti2v`` (``expand_timesteps``, Wan2.2-TI2V-5B): the first latent frame of the model input is the image's latent
  and its tokens get timestep 0; every other token gets the step's timestep.
- ``kontext`` (``FluxKontextPipeline``): the image's packed latent tokens follow the noisy tokens in the sequence, with
  position ids whose first coordinate is 1; the velocity is read from the noisy tokens only.

The condition tensors are computed once per prompt by :func:`encode_conditions` (one row per prompt) and travel in the
same conditioning dict as the text encodings, so the sampler repeats and slices them with the text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from app.types import VisualSample

KONTEXT, WAN_I2V, WAN_TI2V = "kontext", "wan_i2v", "wan_ti2v"
IMAGE_LATENTS = "image_latents"  # kontext: [B, C, h, w] scaled VAE latents of the reference image
CONDITION = "condition"  # wan_i2v: [B, r + z, f, h, w] mask channels ++ normalised latents of [image, 0, ..., 0]
FIRST_FRAME = "first_frame_latents"  # wan_ti2v: [B, z, 1, h, w] normalised latents of the image
IMAGE_EMBEDS = "encoder_hidden_states_image"  # wan_i2v with an image encoder: [B, L_img, D_img] (a transformer kwarg)
CONDITION_KEYS = (IMAGE_LATENTS, CONDITION, FIRST_FRAME)  # consumed by the policy, never passed to the transformer


def conditioning_mode(pipeline_class: str | None, pipeline_config: dict | None) -> str | None:
    """The conditioning style of a model folder, from its ``model_index.json``; None for text-only models."""
    if pipeline_class == "FluxKontextPipeline":
        return KONTEXT
    if (pipeline_config or {}).get("expand_timesteps"):
        return WAN_TI2V
    if pipeline_class == "WanImageToVideoPipeline":
        return WAN_I2V
    return None


def condition_images(samples: Sequence[VisualSample], height: int, width: int) -> Tensor:
    """The problem frame (``images[0]``) of each sample as float32 ``[B, 3, H, W]`` in [0, 1], resized to the model's
    frame size (bicubic, as diffusers' image processors). A frame of another aspect ratio is a ``ValueError``."""
    arrays = []
    for i, sample in enumerate(samples):
        if not sample.images:
            raise ValueError(
                f"sample {i} ({sample.task!r}) has no image: an image-conditioned flow policy needs the problem frame "
                "in sample.images[0]"
            )
        image = sample.images[0].convert("RGB")
        if abs((image.width / image.height) / (width / height) - 1) > 0.01:
            raise ValueError(
                f"sample {i} ({sample.task!r}): the problem frame is {image.width}x{image.height} but the policy "
                f"generates {width}x{height}; set the policy's resolution to the problem's aspect ratio (stretching "
                "it would move what the scorer measures)"
            )
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.BICUBIC)
        arrays.append(np.asarray(image, dtype=np.float32) / 255.0)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


# ------------------------------------------------------------------------------------------------------- encoding
def _wan_normalise(vae: nn.Module, latents: Tensor) -> Tensor:
    """``(z - mean) / std`` per channel, as ``WanImageToVideoPipeline.prepare_latents``."""
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
    std = torch.tensor(vae.config.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
    return (latents - mean) / std


def _wan_encode(vae: nn.Module, video: Tensor) -> Tensor:
    """Normalised posterior-mode latents of ``[B, 3, F, H, W]`` pixels in [0, 1]."""
    pixels = (video.to(vae.dtype) * 2 - 1).clamp(-1, 1)
    return _wan_normalise(vae, vae.encode(pixels).latent_dist.mode().float())


def wan_i2v_condition(vae: nn.Module, images: Tensor, num_frames: int) -> Tensor:
    """``[B, r + z, f, h, w]``: the mask channels and the latents of ``[image, 0, ..., 0]`` (``num_frames`` frames)."""
    batch, _, height, width = images.shape
    video = torch.cat([images[:, :, None], images.new_full((batch, 3, num_frames - 1, height, width), 0.5)], dim=2)
    latents = _wan_encode(vae, video)  # [B, z, f, h, w]
    r = vae.config.scale_factor_temporal
    f, h, w = latents.shape[2:]
    mask = latents.new_zeros(batch, 1, num_frames, h, w)
    mask[:, :, 0] = 1
    mask = torch.cat([mask[:, :, :1].repeat_interleave(r, dim=2), mask[:, :, 1:]], dim=2)  # [B, 1, r + F - 1, h, w]
    mask = mask.view(batch, f, r, h, w).transpose(1, 2)  # [B, r, f, h, w]
    return torch.cat([mask, latents], dim=1)


@torch.no_grad()
def image_embeddings(image_encoder: nn.Module, image_processor, images: Tensor) -> Tensor:
    """The CLIP vision encoder's penultimate hidden states ``[B, L_img, D_img]`` (``WanImageToVideoPipeline.
    encode_image``); ``images`` ``[B, 3, H, W]`` in [0, 1]."""
    device = next(image_encoder.parameters()).device
    inputs = image_processor(images=list(images.float().cpu()), return_tensors="pt", do_rescale=False)
    pixel_values = inputs["pixel_values"].to(device=device, dtype=image_encoder.dtype)
    return image_encoder(pixel_values=pixel_values, output_hidden_states=True).hidden_states[-2].float()


@torch.no_grad()
def encode_conditions(policy, images: Tensor) -> dict[str, Tensor]:
    """The condition tensors of ``images`` ``[B, 3, H, W]`` (in [0, 1], at the model's frame size) for the policy's
    conditioning style, one row per image."""
    vae, mode = policy.vae, policy.conditioning_mode
    images = images.to(device=policy.device, dtype=torch.float32)
    if mode == KONTEXT:
        return {IMAGE_LATENTS: policy.encode(images)}
    if mode == WAN_TI2V:
        return {FIRST_FRAME: _wan_encode(vae, images[:, :, None])}
    if mode == WAN_I2V:
        out = {CONDITION: wan_i2v_condition(vae, images, policy.num_frames)}
        if policy.image_encoder is not None:
            out[IMAGE_EMBEDS] = image_embeddings(policy.image_encoder, policy.image_processor, images)
        return out
    raise ValueError(f"{policy.model_name!r} takes no image conditioning (its pipeline is text-to-image / -video)")


# ------------------------------------------------------------------------------------------------- model inputs
def ti2v_inputs(latents: Tensor, first_frame: Tensor, timestep: Tensor, patch: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Wan2.2 TI2V: the model input (first latent frame replaced by ``first_frame``) and the per-token timesteps
    ``[B, f * h / p_h * w / p_w]`` (0 on the first frame's tokens, ``timestep`` elsewhere)."""
    batch, _, frames, height, width = latents.shape
    keep = torch.ones(1, 1, frames, height, width, device=latents.device, dtype=latents.dtype)
    keep[:, :, 0] = 0  # the pipeline's first_frame_mask
    model_input = (1 - keep) * first_frame.to(latents.dtype) + keep * latents
    tokens = keep[0, 0, :: patch[0], :: patch[1], :: patch[2]].flatten()  # [L]
    return model_input, tokens[None] * timestep.to(latents.dtype)[:, None]  # [B, L]


def ti2v_velocity(out: Tensor, latents: Tensor, first_frame: Tensor, sigma: Tensor) -> Tensor:
    """The model's velocity on the generated frames; on the conditioned first frame the velocity ``(x - c) / sigma``
    that carries it straight to the condition latents ``c`` (so it ends at ``c``, as the pipeline's replacement does,
    and contributes no policy-dependent term to a transition's log-density)."""
    s = sigma.view(-1, *([1] * (latents.ndim - 1))).clamp(min=1e-6)
    first = (latents[:, :, :1] - first_frame.to(latents.dtype)) / s
    return torch.cat([first, out[:, :, 1:]], dim=2)


def kontext_tokens(latents: Tensor, image_latents: Tensor, img_ids: Tensor) -> tuple[Tensor, Tensor]:
    """FLUX Kontext: the packed noisy tokens ``[B, N, 4C]`` followed by the packed reference tokens, and their ids
    (the reference's first id coordinate set to 1), as ``FluxKontextPipeline.prepare_latents``."""
    from diffusers import FluxKontextPipeline

    batch, channels, height, width = image_latents.shape
    packed = FluxKontextPipeline._pack_latents(image_latents.to(latents.dtype), batch, channels, height, width)
    ids = FluxKontextPipeline._prepare_latent_image_ids(batch, height // 2, width // 2, latents.device, latents.dtype)
    ids[..., 0] = 1
    return torch.cat([latents, packed], dim=1), torch.cat([img_ids, ids], dim=0)

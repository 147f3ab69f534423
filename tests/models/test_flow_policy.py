"""FlowPolicy on the real tiny models: conditioning, velocities, ODE sampling + decoding, LoRA, reference, export."""

import re

import pytest
import torch
from peft import PeftModel

from app.models import FlowPolicy
from app.sampling import FlowSampler
from app.sampling.flow import ode_step
from app.settings import FlowSamplingSettings, LoRASettings

NAMES = ["tiny-sd3", "tiny-wan"]
PROMPTS = ["a red dot left of a blue dot", "three squares"]


def make(name: str, **kwargs) -> FlowPolicy:
    return FlowPolicy(name, lora=kwargs.pop("lora", LoRASettings(r=4, alpha=8)), **kwargs)


@pytest.fixture(scope="module", params=NAMES)
def policy(request):
    """A shared tiny policy with LoRA r=4 (tests must not change its weights)."""
    return make(request.param)


def inputs(policy: FlowPolicy, batch: int = 2, seed: int = 0):
    latents = policy.initial_noise(batch, torch.Generator().manual_seed(seed))
    return latents, torch.full((batch,), 0.6), policy.encode_prompts(PROMPTS[:batch])


def test_shapes_and_dtypes(policy):
    latents, sigma, cond = inputs(policy)
    expected = (4, 2, 4, 4) if policy.is_video else (4, 16, 16)
    assert policy.latent_shape == expected
    assert latents.shape == (2, *expected) and latents.dtype == torch.float32
    assert cond["encoder_hidden_states"].shape == (2, 16, 32)
    if not policy.is_video:
        assert cond["pooled_projections"].shape == (2, 64)
    v = policy.velocity(latents, sigma, cond)
    assert v.shape == latents.shape and v.dtype == torch.float32 and torch.isfinite(v).all()


def test_ode_sampling_then_decode(policy):
    sigmas = policy.sigmas(4)
    assert sigmas.shape == (5,) and sigmas[0] == 1 and sigmas[-1] == 0
    x, _, cond = inputs(policy)
    with torch.no_grad():
        for i in range(4):
            x = ode_step(x, policy.velocity(x, sigmas[i].expand(2), cond), sigmas[i], sigmas[i + 1]).sample
    pixels = policy.decode(x)
    assert pixels.shape == ((2, 5, 3, 32, 32) if policy.is_video else (2, 3, 64, 64))
    assert pixels.dtype == torch.float32
    # the pipelines' decoding (WanPipeline / StableDiffusion3Pipeline), with diffusers' own post-processing
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.video_processor import VideoProcessor

    config = policy.vae.config
    with torch.no_grad():
        if policy.is_video:
            mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
            std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)
            expected = VideoProcessor().postprocess_video(policy.vae.decode(x * std + mean).sample, output_type="pt")
        else:
            latents = x / config.scaling_factor + config.shift_factor
            expected = VaeImageProcessor().postprocess(policy.vae.decode(latents).sample, output_type="pt")
    torch.testing.assert_close(pixels, expected, rtol=1e-5, atol=1e-6)


def test_prompt_conditioning_is_cached(policy, monkeypatch):
    first = policy.encode_prompts(PROMPTS)
    cached = policy.cached_conditioning(PROMPTS[0])
    calls = []
    monkeypatch.setattr(policy, "_encode_text", lambda prompts: calls.append(prompts))  # would break if called
    again = policy.encode_prompts([PROMPTS[1], PROMPTS[0], PROMPTS[0]])
    assert not calls
    assert policy.cached_conditioning(PROMPTS[0]) is cached  # the same tensors object
    assert torch.equal(again["encoder_hidden_states"][1], first["encoder_hidden_states"][0])
    assert torch.equal(again["encoder_hidden_states"][2], first["encoder_hidden_states"][0])


def test_the_sampler_guidance_mixes_in_the_empty_prompt(policy):
    latents, sigma, cond = inputs(policy)
    v_cond = policy.velocity(latents, sigma, cond)
    with torch.no_grad():
        v_uncond = policy.velocity(latents, sigma, policy.encode_prompts(["", ""]))
    with torch.no_grad():
        guided = FlowSampler(policy, FlowSamplingSettings(guidance_scale=3.0)).velocity(latents, sigma, cond)
    torch.testing.assert_close(guided, v_uncond + 3.0 * (v_cond - v_uncond), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_lora_reference_and_export(name, tmp_path):
    policy = make(name)
    trainable = policy.trainable_parameters()
    names = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in names)
    lora_b = [p for n, p in policy.named_parameters() if "lora_B" in n]
    assert all(torch.count_nonzero(p) == 0 for p in lora_b)  # zero-init: the policy starts at the base model

    latents, sigma, cond = inputs(policy)
    with torch.no_grad():
        with policy.reference():
            reference = policy.velocity(latents, sigma, cond)
        assert torch.equal(policy.velocity(latents, sigma, cond), reference)
        generator = torch.Generator().manual_seed(0)
        for p in lora_b:
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
        trained = policy.velocity(latents, sigma, cond)
        with policy.reference():
            assert torch.equal(policy.velocity(latents, sigma, cond), reference)
    assert (trained - reference).abs().max() > 1e-4

    out = policy.export(tmp_path / "export")
    transformer_class = type(policy.transformer)
    merged = transformer_class.from_pretrained(out, subfolder="transformer")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    kwargs = {k: v for k, v in cond.items()}
    timestep = sigma * 1000
    with torch.no_grad():
        v_merged = merged(hidden_states=latents, timestep=timestep, return_dict=False, **kwargs)[0]
        base = transformer_class.from_pretrained(policy.source_path, subfolder="transformer")
        adapted = PeftModel.from_pretrained(base, out / "transformer_lora")
        v_adapter = adapted(hidden_states=latents, timestep=timestep, return_dict=False, **kwargs)[0]
    assert (v_merged - trained).abs().max() < 1e-5
    assert (v_adapter - trained).abs().max() < 1e-5

    reloaded = FlowPolicy(str(out), lora=None)  # the export is itself a pipeline folder
    with torch.no_grad():
        v_reloaded = reloaded.velocity(latents, sigma, reloaded.encode_prompts(PROMPTS))
    assert (v_reloaded - trained).abs().max() < 1e-5


def test_full_fine_tuning_keeps_a_frozen_reference_only_once_enabled():
    policy = make("tiny-wan", lora=None)
    assert len(policy.trainable_parameters()) == len(list(policy.transformer.parameters()))
    assert policy.frozen_reference is None, "no second copy of the transformer unless a KL term needs it"
    with pytest.raises(RuntimeError, match="enable_reference"), policy.reference():
        pass
    policy.enable_reference()
    assert not any(p.requires_grad for p in policy.frozen_reference.parameters())
    latents, sigma, cond = inputs(policy)
    with torch.no_grad():
        before = policy.velocity(latents, sigma, cond)
        for p in policy.trainable_parameters():
            p.add_(0.01)
        with policy.reference():
            assert torch.equal(policy.velocity(latents, sigma, cond), before)
        assert not torch.equal(policy.velocity(latents, sigma, cond), before)


def test_unknown_embedded_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown embedded flow model 'tiny-nope'"):
        FlowPolicy("tiny-nope")


def test_lora_targets_that_match_no_module_are_an_error_naming_the_pattern_and_the_model():
    from app.errors import ConfigError

    named = re.escape(r"'.*attn\.to_qkv' matches no module of tiny-sd3")
    with pytest.raises(ConfigError, match=named + r" .*: .*attn\.to_q"):
        FlowPolicy("tiny-sd3", lora=LoRASettings(r=2, alpha=4, target_modules=r".*attn\.to_qkv"))


def test_resolution_sets_the_latent_size():
    policy = make("tiny-sd3", resolution={"height": 32, "width": 48})
    assert policy.latent_shape == (4, 8, 12)  # VAE factor 4
    video = make("tiny-wan", resolution={"num_frames": 9})
    assert video.latent_shape == (4, 3, 4, 4)  # 1 + 4 k frames -> k + 1 latent frames
    with pytest.raises(ValueError, match="unknown keys \\['frames'\\]"):
        make("tiny-sd3", resolution={"frames": 5})


def test_gradient_checkpointing_keeps_the_gradients():
    plain, checkpointed = make("tiny-sd3"), make("tiny-sd3", gradient_checkpointing=True)
    assert checkpointed.transformer.gradient_checkpointing and not plain.transformer.gradient_checkpointing
    grads = []
    for policy in (plain, checkpointed):
        policy.train()
        for p in policy.trainable_parameters():
            torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(0))  # non-zero LoRA B
        latents, sigma, cond = inputs(policy)
        policy.velocity(latents, sigma, cond).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)

"""FLUX in the flow policy, on the embedded ``tiny-flux``: conditioning, packed velocity and schedule equal
``FluxPipeline``'s, a LoRA export runs in ``FluxPipeline``, and a short flow-GRPO fit trains every adapter."""

import numpy as np
import pytest
import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
from torch.utils.data import DataLoader

from app.models import FlowPolicy
from app.modules.flow_grpo import FlowGRPOModule
from app.rewards import RewardComponent
from app.sampling import FlowSampler
from app.settings import FlowGRPOSamplingSettings, LoRASettings, OptimizerSettings
from app.types import VisualSample

PROMPTS = ["a red circle on the left", "a blue square on the top"]
TEXT_LENGTH = 16  # the embedded tokenizer's length (the real FLUX uses 512 T5 tokens)


def make(**kwargs) -> FlowPolicy:
    kwargs.setdefault("lora", LoRASettings(r=4, alpha=8))
    return FlowPolicy("tiny-flux", max_sequence_length=TEXT_LENGTH, **kwargs)


@pytest.fixture(scope="module")
def policy():
    """A shared tiny-flux policy with LoRA r=4 (tests must not change its weights)."""
    return make()


@pytest.fixture(scope="module")
def pipeline(policy):
    return FluxPipeline.from_pretrained(policy.source_path)


def test_conditioning_is_flux_pipelines(policy, pipeline):
    assert policy.is_flux and policy.text_encoder.layout == "flux"
    cond = policy.encode_prompts(PROMPTS)
    assert sorted(cond) == ["encoder_hidden_states", "pooled_projections"]
    embeds, pooled, _ = pipeline.encode_prompt(
        PROMPTS, None, device=torch.device("cpu"), max_sequence_length=TEXT_LENGTH
    )
    assert embeds.shape == (2, TEXT_LENGTH, 32) and pooled.shape == (2, 32)
    torch.testing.assert_close(cond["encoder_hidden_states"], embeds)
    torch.testing.assert_close(cond["pooled_projections"], pooled)


def test_velocity_is_the_transformer_on_packed_latents(policy, pipeline):
    latents = policy.initial_noise(2, torch.Generator().manual_seed(0))
    assert latents.shape == (2, 16, 16, 16)
    sigma = torch.tensor([0.7, 0.3])
    cond = policy.encode_prompts(PROMPTS)
    with torch.no_grad():
        velocity = policy.velocity(latents, sigma, cond)
        transformer = FluxTransformer2DModel.from_pretrained(policy.source_path, subfolder="transformer")
        packed = FluxPipeline._pack_latents(latents, 2, 16, 16, 16)  # [2, 64, 64]
        out = transformer(
            hidden_states=packed,
            timestep=sigma,
            guidance=torch.full((2,), 3.5),
            **cond,
            img_ids=FluxPipeline._prepare_latent_image_ids(2, 8, 8, "cpu", torch.float32),
            txt_ids=torch.zeros(TEXT_LENGTH, 3),
            return_dict=False,
        )[0]
    expected = FluxPipeline._unpack_latents(out, 64, 64, pipeline.vae_scale_factor)  # 64 px, VAE factor 4
    assert velocity.shape == (2, 16, 16, 16) and velocity.dtype == torch.float32
    torch.testing.assert_close(velocity, expected)


def test_true_cfg_mixes_in_the_empty_prompt(policy):
    latents = policy.initial_noise(2, torch.Generator().manual_seed(1))
    sigma, cond = torch.full((2,), 0.6), policy.encode_prompts(PROMPTS)
    with torch.no_grad():
        v_cond, v_uncond = (
            policy.velocity(latents, sigma, cond),
            policy.velocity(latents, sigma, policy.encode_prompts(["", ""])),
        )
        guided = FlowSampler(policy, FlowGRPOSamplingSettings(guidance_scale=2.0)).velocity(latents, sigma, cond)
    torch.testing.assert_close(guided, v_uncond + 2.0 * (v_cond - v_uncond), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("height", "width", "num_steps"), [(64, 64, 3), (128, 96, 5)])
def test_sigmas_are_flux_pipelines_schedule(height, width, num_steps):
    policy = make(resolution={"height": height, "width": width})
    reference = FluxPipeline.from_pretrained(policy.source_path).scheduler
    tokens = (height // 8) * (width // 8)  # VAE factor 4, then 2x2 patches
    config = reference.config
    mu = calculate_shift(
        tokens, config.base_image_seq_len, config.max_image_seq_len, config.base_shift, config.max_shift
    )
    retrieve_timesteps(reference, num_steps, "cpu", sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    torch.testing.assert_close(policy.sigmas(num_steps), reference.sigmas.float())


def test_sizes_that_do_not_pack_are_a_clear_error():
    with pytest.raises(ValueError, match="divisible by 8, got 60 x 64"):
        make(resolution={"height": 60, "width": 64})


def test_lora_export_runs_in_flux_pipeline(tmp_path):
    policy = make()
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.05)  # a non-zero adapter, so merging changes the weights
    out = policy.export(tmp_path / "export")
    for sub in ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "transformer_lora"):
        assert (out / sub).is_dir(), sub
    exported = FluxPipeline.from_pretrained(out)
    image = exported(
        PROMPTS[0],
        num_inference_steps=2,
        height=64,
        width=64,
        max_sequence_length=TEXT_LENGTH,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert image.shape == (1, 3, 64, 64) and torch.isfinite(image).all()
    reloaded = FlowPolicy(str(out), lora=None, max_sequence_length=TEXT_LENGTH)
    latents = policy.initial_noise(1, torch.Generator().manual_seed(0))
    cond = policy.encode_prompts(PROMPTS[:1])
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded.velocity(latents, torch.tensor([0.5]), cond),
            policy.velocity(latents, torch.tensor([0.5]), cond),
            rtol=1e-4,
            atol=1e-5,
        )


class RednessReward(RewardComponent):
    """Mean red channel of the decoded image (``[3, H, W]`` in [0, 1])."""

    def score(self, completions, samples):
        return torch.stack([image[0].float().mean() for image in completions]).cpu()


def test_short_flow_grpo_fit_moves_every_lora_weight(fit):
    policy = make()
    module = FlowGRPOModule(
        policy,
        [RednessReward()],
        sampling=FlowGRPOSamplingSettings(group_size=2, num_steps=3),
        optimizer=OptimizerSettings(learning_rate=1e-3),
    )
    prompts = [VisualSample(images=[], question=f"a red square, number {i}", task="red") for i in range(2)]
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    trainer, _ = fit(module, DataLoader(prompts, batch_size=1, collate_fn=list), max_steps=2)
    assert trainer.global_step == 2
    assert before and all("lora" in n for n in before)
    unchanged = sorted(n for n, p in policy.named_parameters() if n in before and torch.equal(before[n], p))
    assert not unchanged, unchanged

"""SD3's real text layout (CLIP-L + CLIP-G + T5) on tiny encoders: a pipeline folder saved by diffusers itself loads
into FlowPolicy, encodes prompts exactly as ``StableDiffusion3Pipeline.encode_prompt`` does, trains, and exports back
into a folder the diffusers pipeline opens and runs."""

import pytest
import torch
from diffusers import StableDiffusion3Pipeline
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

from app.models import FlowPolicy
from app.models.flow_text import FlowTextEncoder
from app.settings import LoRASettings
from app.tiny.flow_models import _tokenizer, build_tiny_flow

PROMPTS = ["a red circle on the left", "a blue square on the top"]


def tiny_sd3_pipeline() -> StableDiffusion3Pipeline:
    """The embedded tiny SD3 transformer and VAE with three tiny text encoders whose widths fit it: CLIP hidden 16 + 16
    side by side = T5 width 32 = ``joint_attention_dim``; pooled 32 + 32 = ``pooled_projection_dim`` 64."""
    parts = build_tiny_flow("tiny-sd3")
    tokenizer = _tokenizer(0)
    common = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.pad_token_id)
    torch.manual_seed(1)

    def clip():
        config = CLIPTextConfig(
            hidden_size=16,
            intermediate_size=32,
            projection_dim=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=16,
            bos_token_id=1,
            **common,
        )
        return CLIPTextModelWithProjection(config)

    t5 = T5EncoderModel(
        T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, is_encoder_decoder=False, **common)
    )
    return StableDiffusion3Pipeline(
        transformer=parts["transformer"],
        scheduler=parts["scheduler"],
        vae=parts["vae"],
        text_encoder=clip(),
        tokenizer=tokenizer,
        text_encoder_2=clip(),
        tokenizer_2=tokenizer,
        text_encoder_3=t5,
        tokenizer_3=tokenizer,
    )


@pytest.fixture(scope="module")
def sd3_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sd3-triple")
    tiny_sd3_pipeline().save_pretrained(folder)
    return folder


def test_three_encoders_condition_like_the_pipeline(sd3_folder):
    policy = FlowPolicy(str(sd3_folder), lora=LoRASettings(r=4, alpha=8), max_sequence_length=16)
    assert policy.text_encoder.is_sd3_triple
    assert sorted(policy.text_encoder.encoders) == ["text_encoder", "text_encoder_2", "text_encoder_3"]
    cond = policy.encode_prompts(PROMPTS)
    assert cond["encoder_hidden_states"].shape == (2, 16 + 16, 32)  # CLIP tokens, then T5 tokens
    assert cond["pooled_projections"].shape == (2, 64)
    reference = StableDiffusion3Pipeline.from_pretrained(sd3_folder)
    embeds, _, pooled, _ = reference.encode_prompt(
        PROMPTS, None, None, device=torch.device("cpu"), do_classifier_free_guidance=False, max_sequence_length=16
    )
    torch.testing.assert_close(cond["encoder_hidden_states"], embeds)
    torch.testing.assert_close(cond["pooled_projections"], pooled)
    latents = policy.initial_noise(2, torch.Generator().manual_seed(0))
    velocity = policy.velocity(latents, torch.full((2,), 0.5), cond)
    assert velocity.shape == latents.shape and torch.isfinite(velocity).all()


def test_export_opens_in_the_diffusers_pipeline(sd3_folder, tmp_path):
    policy = FlowPolicy(str(sd3_folder), lora=LoRASettings(r=4, alpha=8), max_sequence_length=16)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.05)  # a non-zero adapter, so merging changes the weights
    out = policy.export(tmp_path / "export")
    for sub in ("text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer_2", "tokenizer_3", "transformer_lora"):
        assert (out / sub).is_dir(), sub
    pipeline = StableDiffusion3Pipeline.from_pretrained(out)
    image = pipeline(
        PROMPTS[0],
        num_inference_steps=2,
        height=64,
        width=64,
        guidance_scale=1.0,
        max_sequence_length=16,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert image.shape == (1, 3, 64, 64) and torch.isfinite(image).all()
    reloaded = FlowPolicy(str(out), lora=None, max_sequence_length=16)
    latents = policy.initial_noise(1, torch.Generator().manual_seed(0))
    cond = policy.encode_prompts(PROMPTS[:1])
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded.velocity(latents, torch.tensor([0.5]), cond),
            policy.velocity(latents, torch.tensor([0.5]), cond),
            rtol=1e-4,
            atol=1e-5,
        )


def test_missing_tokenizer_or_base_encoder_is_a_clear_error():
    encoder = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="'text_encoder_2' has no tokenizer 'tokenizer_2'"):
        FlowTextEncoder({"text_encoder": encoder, "text_encoder_2": encoder}, {"tokenizer": object()}, True)
    with pytest.raises(ValueError, match="needs a 'text_encoder'"):
        FlowTextEncoder({}, {}, True)

"""FlowMatchingModule: two optimizer steps on the tiny SD3 model give a finite loss and move the weights."""

import math

import lightning as L
import pytest
import torch

from app.data import VisualTaskDataModule
from app.models.flow import FlowPolicy
from app.modules import FlowMatchingModule
from app.rewards.color_region import ColorRegionReward
from app.tasks.dots import ShapePromptDataset


def test_two_steps_train_transformer_and_vae(tmp_path):
    policy = FlowPolicy("tiny-sd3", lora=None)
    before = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
    vae_before = {k: v.detach().clone() for k, v in policy.vae.named_parameters()}
    module = FlowMatchingModule(policy, eval_rewards=[ColorRegionReward()], num_steps=2)
    data = VisualTaskDataModule(
        ShapePromptDataset, train_size=8, val_size=4, batch_size=4, val_batch_size=4, image_size=64
    )
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 2
    for key in ("train/loss", "train/loss/flow", "train/loss/vae"):
        assert math.isfinite(float(trainer.callback_metrics[key]))
    assert any(not torch.equal(before[k], v) for k, v in policy.model.named_parameters())
    assert any(not torch.equal(vae_before[k], v) for k, v in policy.vae.named_parameters())
    metrics = trainer.validate(module, datamodule=data, verbose=False)[0]
    assert 0.0 <= metrics["val/reward/color_region"] <= 1.0


@pytest.mark.parametrize("model", ["tiny-sd3", "tiny-flux"])
def test_encode_and_decode_follow_the_diffusers_pipelines(model):
    """As StableDiffusion3Pipeline / FluxPipeline: encode pixels normalised to [-1, 1] by the image processor, take the
    posterior's mean (the policy's ``latent_dist.mode()``) and map it to ``(z - shift_factor) * scaling_factor``;
    decode ``vae.decode(z / scaling_factor + shift_factor)`` and post-process back to [0, 1]."""
    from diffusers.image_processor import VaeImageProcessor

    policy = FlowPolicy(model, lora=None)
    config, processor = policy.vae.config, VaeImageProcessor()
    assert config.scaling_factor != 1 and config.shift_factor not in (None, 0)  # the factors matter below
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    latents = policy.encode(images)
    assert latents.shape == (2, *policy.latent_shape) and latents.dtype == torch.float32
    with torch.no_grad():
        posterior = policy.vae.encode(VaeImageProcessor.normalize(images)).latent_dist
        expected = (posterior.mean - config.shift_factor) * config.scaling_factor
        torch.testing.assert_close(latents, expected, rtol=1e-5, atol=1e-6)
        assert (posterior.std * config.scaling_factor).min() > 1e-3  # a sample would not match: the mean is used

        z = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
        decoded = policy.vae.decode(z / config.scaling_factor + config.shift_factor, return_dict=False)[0]
        expected_pixels = processor.postprocess(decoded, output_type="pt")
    pixels = policy.decode(z)
    assert pixels.shape == (2, 3, 64, 64) and pixels.dtype == torch.float32
    torch.testing.assert_close(pixels, expected_pixels, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(pixels, processor.postprocess(policy.vae.decode(z).sample.detach(), output_type="pt"))


def test_video_decode_follows_the_wan_pipeline():
    """As WanPipeline: ``z / (1 / latents_std) + latents_mean`` per channel, ``vae.decode``, then the video processor's
    post-processing to frames in [0, 1]: ``[B, F, 3, H, W]``. Images cannot be encoded with the video VAE."""
    from diffusers.video_processor import VideoProcessor

    policy = FlowPolicy("tiny-wan", lora=None)
    # the embedded VAE has mean 0 and std 1; other values, so that the normalisation shows
    policy.vae.register_to_config(latents_mean=[0.5, -0.25, 0.1, 0.0], latents_std=[2.0, 0.5, 1.5, 1.0])
    config = policy.vae.config
    z = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))  # [B, C, T, h, w]
    with torch.no_grad():
        latents_mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1)
        latents_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1)
        video = policy.vae.decode(z / latents_std + latents_mean, return_dict=False)[0]
        expected = VideoProcessor().postprocess_video(video, output_type="pt")
        unnormalised = VideoProcessor().postprocess_video(policy.vae.decode(z, return_dict=False)[0], output_type="pt")
    frames = policy.decode(z)
    assert frames.shape == (2, 5, 3, 32, 32) and frames.dtype == torch.float32
    torch.testing.assert_close(frames, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(frames, unnormalised, atol=1e-3)
    with pytest.raises(NotImplementedError, match="image VAEs only"):
        policy.encode(torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)))


def test_foreground_mask_marks_the_shape_not_the_background():
    from app.modules.flow_matching import foreground_mask, images_to_tensor
    from app.tasks.dots.shapes import render_shape
    from app.types import VisualSample

    image = render_shape("red", "square", "left", image_size=64)
    mask = foreground_mask(images_to_tensor([VisualSample(images=[image], question="", task="t")]))  # [1, 1, 64, 64]
    pixels = torch.from_numpy(__import__("numpy").array(image)).float()  # [64, 64, 3]
    red = (pixels[..., 0] > 150) & (pixels[..., 1] < 100)  # the square's pixels
    assert mask.shape == (1, 1, 64, 64)
    assert torch.equal(mask[0, 0].bool(), red)
    assert foreground_mask(torch.full((2, 3, 8, 8), 0.7)).sum() == 0  # a flat image has no foreground


def test_the_vae_trains_in_train_mode_then_freezes_after_vae_train_steps(tmp_path, caplog):
    policy = FlowPolicy("tiny-sd3", lora=None)
    assert not policy.vae.training  # the policy keeps it in eval mode
    module = FlowMatchingModule(policy, vae_train_steps=1, num_steps=2)
    snapshots, modes = [], []

    class Snapshot(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            snapshots.append(torch.cat([p.detach().flatten().clone() for p in policy.vae.parameters()]))
            modes.append(policy.vae.training)

    data = VisualTaskDataModule(ShapePromptDataset, train_size=8, val_size=2, batch_size=2, image_size=64)
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[Snapshot()],
        default_root_dir=tmp_path,
    )
    start = torch.cat([p.detach().flatten().clone() for p in policy.vae.parameters()])
    trainer.fit(module, datamodule=data)
    assert not torch.equal(start, snapshots[0])  # step 0 trained the VAE
    assert torch.equal(snapshots[0], snapshots[1]) and torch.equal(snapshots[1], snapshots[2])  # then frozen
    assert not any(p.requires_grad for p in policy.vae.parameters())
    assert modes == [True, False, False]
    assert "in eval mode at the start of training" not in caplog.text  # the trained VAE is not a stray eval module
    with pytest.raises(ValueError, match="vae_train_steps"):
        FlowMatchingModule(policy, vae_train_steps=0)

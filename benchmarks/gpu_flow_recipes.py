"""Run the flow-GRPO GPU recipes on random weights of the real architectures: time per GRPO step and peak memory.

No checkpoint can be downloaded where this runs, so each recipe gets a pipeline folder with the real transformer and
VAE architectures (SD3.5-medium: 24 joint blocks, dual attention in blocks 0-12, 16-channel VAE; Wan2.1-T2V-1.3B:
30 blocks, the Wan VAE) and random weights, saved in bfloat16. The text encoders keep the real output widths (CLIP-L
768, CLIP-G 1280, T5 / UMT5 4096) but only two layers, and use the embedded tokenizer: they are not what this measures.
Each recipe then runs through ``AppCLI`` exactly as ``python -m app fit --config configs/<recipe>.yaml`` does, on one
GPU (``strategy auto``), with the overrides printed in the table; the export callback writes the trained policy.

    python benchmarks/gpu_flow_recipes.py                  # both recipes on one GPU (about 5 minutes on an H200)
    python benchmarks/gpu_flow_recipes.py --recipes sd3    # one of them
    python benchmarks/gpu_flow_recipes.py --tiny           # CPU smoke test of the same path with tiny widths

``--wan-probe-frames 81``: besides the shortened Wan run, one forward and backward of the recipe's micro-batch at the
recipe's full 81 frames (gradient checkpointing, bf16), for its peak memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the callbacks package the recipes name

import lightning as L  # noqa: E402
import torch  # noqa: E402

from app.tiny.flow_models import TOKENIZER_SLOTS, _tokenizer  # noqa: E402

SD3_5_MEDIUM = dict(  # stabilityai/stable-diffusion-3.5-medium transformer/config.json
    sample_size=128,
    patch_size=2,
    in_channels=16,
    num_layers=24,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    out_channels=16,
    pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)),
    qk_norm="rms_norm",
)
SD3_VAE = dict(  # SD3 / SD3.5 vae/config.json
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    latent_channels=16,
    norm_num_groups=32,
    sample_size=1024,
    scaling_factor=1.5305,
    shift_factor=0.0609,
    use_quant_conv=False,
    use_post_quant_conv=False,
)
WAN_1_3B = dict(  # Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)
TINY_OVERRIDES = {  # --tiny: same classes, widths a CPU runs in seconds
    "sd3": dict(
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        dual_attention_layers=(0,),
        sample_size=16,
        pos_embed_max_size=32,
    ),
    "sd3_vae": dict(block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=8),
    "wan": dict(num_attention_heads=2, attention_head_dim=12, ffn_dim=32, num_layers=2, freq_dim=32),
    "wan_vae": dict(base_dim=8),
}


def _tokenizer_for(max_length: int):
    tokenizer = _tokenizer(seed=0)
    tokenizer.model_max_length = max_length
    return tokenizer


def _clip(width: int, tokenizer):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        projection_dim=width,
        num_hidden_layers=2,
        num_attention_heads=width // 64 if width >= 64 else 4,
        max_position_embeddings=77,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
    )
    return CLIPTextModelWithProjection(config)


def _t5(width: int, tokenizer, umt5: bool):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config_class, model_class = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    config = config_class(
        d_model=width,
        d_kv=64 if width >= 64 else 8,
        d_ff=2 * width,
        num_layers=2,
        num_heads=max(width // 64, 4),
        is_encoder_decoder=False,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.pad_token_id,
    )
    return model_class(config)


def write_random_pipeline(kind: str, folder: Path, tiny: bool, device: str) -> float:
    """Write a diffusers pipeline folder of the ``kind`` architecture with random bf16 weights; returns parameters
    of its transformer."""
    import diffusers

    torch.manual_seed(0)
    components: dict = {}
    with torch.device(device):
        if kind == "sd3":
            config = dict(SD3_5_MEDIUM, **(TINY_OVERRIDES["sd3"] if tiny else {}))
            clip_l, clip_g, t5 = (16, 16, 32) if tiny else (768, 1280, 4096)
            if tiny:
                config.update(joint_attention_dim=t5, pooled_projection_dim=clip_l + clip_g)
            components["transformer"] = diffusers.SD3Transformer2DModel(**config)
            components["vae"] = diffusers.AutoencoderKL(**dict(SD3_VAE, **(TINY_OVERRIDES["sd3_vae"] if tiny else {})))
            for slot, width in (("text_encoder", clip_l), ("text_encoder_2", clip_g)):
                components[slot] = _clip(width, _tokenizer_for(77))
            components["text_encoder_3"] = _t5(t5, _tokenizer_for(512), umt5=False)
            pipeline = "StableDiffusion3Pipeline"
        else:
            config = dict(WAN_1_3B, **(TINY_OVERRIDES["wan"] if tiny else {}))
            width = 32 if tiny else 4096
            config["text_dim"] = width
            components["transformer"] = diffusers.WanTransformer3DModel(**config)
            components["vae"] = diffusers.AutoencoderKLWan(**(TINY_OVERRIDES["wan_vae"] if tiny else {}))
            components["text_encoder"] = _t5(width, _tokenizer_for(512), umt5=True)
            pipeline = "WanPipeline"
    for slot in components:
        components[slot].to(torch.bfloat16).save_pretrained(folder / slot)
    slots = [s for s in ("text_encoder", "text_encoder_2", "text_encoder_3") if s in components]
    for slot, tokenizer_slot in zip(slots, TOKENIZER_SLOTS, strict=False):
        _tokenizer_for(77 if "clip" in type(components[slot]).__name__.lower() else 512).save_pretrained(
            folder / tokenizer_slot
        )
    diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0).save_pretrained(folder / "scheduler")
    index = {"_class_name": pipeline}
    index.update({slot: [type(c).__module__.split(".")[0], type(c).__name__] for slot, c in components.items()})
    index.update({t: ["transformers", "PreTrainedTokenizerFast"] for _, t in zip(slots, TOKENIZER_SLOTS, strict=False)})
    index["scheduler"] = ["diffusers", "FlowMatchEulerDiscreteScheduler"]
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    return sum(p.numel() for p in components["transformer"].parameters())


class StepTimer(L.Callback):
    """Wall time of each training step (the whole GRPO step: rollout, scoring, update), synchronised on CUDA."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.rewards: list[float] = []

    def _sync(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self._start)
        reward = trainer.callback_metrics.get("train/reward/total")
        self.rewards.append(float(reward) if reward is not None else float("nan"))


def run_recipe(config: str, overrides: list[str]) -> dict:
    """``AppCLI`` on ``config`` with ``overrides``, a :class:`StepTimer` added; returns the figures."""
    from app.command_line.commands import AppCLI

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    cli = AppCLI(args=["--config", config, *overrides], run=False)
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    setup = time.perf_counter() - start
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    policy = cli.model.policy
    trained = sum(p.numel() for p in policy.trainable_parameters())
    return dict(
        setup_s=setup,
        total_s=time.perf_counter() - start,
        step_s=timer.times,
        rewards=timer.rewards,
        trainable=trained,
        peak_gib=torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan"),
    )


def folder_gib(folder: Path, pattern: str = "**/*") -> float:
    return sum(f.stat().st_size for f in folder.glob(pattern) if f.is_file()) / 2**30


def probe_video_memory(folder: Path, frames: int, height: int, width: int, micro_batch: int) -> dict:
    """One forward and backward of ``micro_batch`` clips at full length (LoRA r 32, checkpointing, bf16)."""
    from app.models import FlowPolicy
    from app.settings import LoRASettings

    policy = FlowPolicy(
        str(folder),
        lora=LoRASettings(r=32, alpha=64),
        dtype="bfloat16",
        resolution=dict(height=height, width=width, num_frames=frames),
        gradient_checkpointing=True,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy.to(device)
    conditioning = {k: v.to(device) for k, v in policy.encode_prompts(["a probe"] * micro_batch).items()}
    x = policy.initial_noise(micro_batch).to(device)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        v = policy.velocity(x, torch.full((micro_batch,), 0.5, device=device), conditioning)
    v.float().square().mean().backward()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return dict(
        latents=tuple(x.shape),
        seconds=time.perf_counter() - start,
        peak_gib=torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan"),
    )


RECIPES = {
    "sd3": ("configs/flow/flow_grpo_sd3_5_medium.yaml", []),
    "wan": (  # 33 frames and K = 4 keep one step near a minute; the probe measures the recipe's 81 frames
        "configs/flow/flow_grpo_wan2_1_t2v_1_3b.yaml",
        [
            "--model.init_args.policy.init_args.resolution.num_frames=33",
            "--model.init_args.sampling.group_size=4",
            "--data.init_args.batch_size=1",
        ],
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["sd3", "wan"], choices=sorted(RECIPES))
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps per recipe")
    parser.add_argument("--work", default="runs/gpu_flow_recipes", help="pipeline folders and run outputs")
    parser.add_argument("--tiny", action="store_true", help="tiny widths, CPU, 64 px, 4 denoising steps")
    parser.add_argument("--wan-probe-frames", type=int, default=81, help="0 skips the full-length memory probe")
    args = parser.parse_args()
    sys.argv = sys.argv[:1]  # the recipes' arguments go to AppCLI alone
    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(args.work)
    rows = []
    for name in args.recipes:
        config, overrides = RECIPES[name]
        folder = work / f"{name}-random"
        try:
            start = time.perf_counter()
            params = write_random_pipeline(name, folder, args.tiny, device)
            built = time.perf_counter() - start
            overrides = [
                f"--model.init_args.policy.init_args.model={folder}",
                f"--trainer.max_steps={args.steps}",
                "--trainer.devices=1",
                "--trainer.strategy=auto",
                f"--trainer.default_root_dir={work / name}",
                f"--trainer.logger.init_args.save_dir={work / name}",
                *overrides,
            ]
            if args.tiny:
                overrides += [
                    "--trainer.accelerator=cpu",
                    "--trainer.precision=32-true",
                    "--model.init_args.sampling.num_steps=4",
                    "--model.init_args.policy.init_args.resolution.height=64",
                    "--model.init_args.policy.init_args.resolution.width=64",
                    "--data.init_args.image_size=128",
                    "--model.init_args.policy.init_args.dtype=float32",
                    "--data.init_args.num_workers=0",
                ]
                if name == "wan":
                    overrides += ["--model.init_args.policy.init_args.resolution.num_frames=5"]
            result = run_recipe(config, overrides)
            steps = result["step_s"]
            checkpoints = folder_gib(work / name, "**/*.ckpt")
            export = folder_gib(Path(f"runs/{Path(config).stem}/policy"))
            rows.append(
                f"{name:<5} {params / 1e9:6.2f}B {result['trainable'] / 1e6:7.1f}M  build {built:5.1f}s  "
                f"setup {result['setup_s']:5.1f}s  steps "
                + " ".join(f"{s:6.1f}s" for s in steps)
                + f"  peak {result['peak_gib']:6.1f} GiB  total {result['total_s']:6.1f}s  "
                f"rewards {[round(r, 3) for r in result['rewards']]}  checkpoints {checkpoints:.2f} GiB  "
                f"export {export:.2f} GiB"
            )
            if name == "wan" and args.wan_probe_frames:
                frames, side = (5, 64) if args.tiny else (args.wan_probe_frames, 512)
                probe = probe_video_memory(folder, frames, side, side, micro_batch=2)
                rows.append(
                    f"wan probe: {frames} frames {side}x{side}, micro-batch 2, latents {probe['latents']}: forward + "
                    f"backward {probe['seconds']:.1f}s, peak {probe['peak_gib']:.1f} GiB"
                )
        except Exception:  # report and go on: one broken recipe must not hide the other's figures
            traceback.print_exc()
            rows.append(f"{name:<5} FAILED (traceback above)")
    print("\nrecipe params  trained  figures", *rows, sep="\n", flush=True)


if __name__ == "__main__":
    main()

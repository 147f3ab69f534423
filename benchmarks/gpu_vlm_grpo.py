"""GPU throughput of VLM GRPO on a Qwen2.5-VL-3B-shaped policy: rollout and training tokens/s, training MFU, peak
memory, for attention / Liger kernel choices, LoRA vs full fine-tuning, with and without shared prefixes; and the time
of an SD3.5-medium / Wan2.1-1.3B flow-transformer step per attention backend.

    python benchmarks/gpu_vlm_grpo.py                         # every VLM variant + the flow part, one GPU
    python benchmarks/gpu_vlm_grpo.py --variants sdpa sdpa+liger --modes lora --new-tokens 256   # a shorter run
    python benchmarks/gpu_vlm_grpo.py --tiny                  # CPU smoke test of the same code with the tiny model

No checkpoint can be downloaded where this runs: the policy is the real Qwen2.5-VL-3B-Instruct architecture (36 layers,
hidden 2048, 151,936-token vocabulary, the 32-block vision tower) with random bfloat16 weights and the embedded
tokenizer (whose ids are a subset of the vocabulary), saved once to ``--workdir`` and loaded through ``VLMPolicy``. The
processor keeps 448x448 images whole (256 image tokens), as the real one does. Geometry of
configs/vlm/grpo_qwen2_5_vl_3b.yaml: B = 4 prompts x K = 8 completions, ``--new-tokens`` (the recipe's 1024 by default)
new tokens, micro-batches of 8, gradient checkpointing. Random weights almost never sample the end token, so completions
run to the full length.

Per variant: the rollout (``encode_prompts`` + ``generate``) in tokens/s of generated tokens; the training phase (one
forward + backward of the GRPO loss per micro-batch over prompt + completion, then an AdamW step) in tokens/s of
processed tokens; MFU of the training phase = model FLOPs / (time x ``--peak-tflops``), model FLOPs = (6 for full
fine-tuning, 4 with LoRA: no weight gradients) x parameters x tokens + 3 x the causal attention's forward, gradient
checkpointing's recompute not counted; peak memory allocated of each phase. A variant whose kernels are not installed
is reported as such (the policy's own error message), not silently replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import torch  # noqa: E402

QWEN2_5_VL_3B_TEXT = dict(  # Qwen/Qwen2.5-VL-3B-Instruct config.json (text part)
    vocab_size=151_936,
    hidden_size=2048,
    intermediate_size=11_008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    max_position_embeddings=128_000,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]},
)
QWEN2_5_VL_3B_VISION = dict(  # ... (vision part)
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    out_hidden_size=2048,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
    hidden_act="silu",
    tokens_per_second=2,
)
VARIANTS = {  # name -> (attn_implementation, use_liger_kernel)
    "eager": ("eager", False),
    "sdpa": ("sdpa", False),
    "sdpa+liger": ("sdpa", True),
    "flash_attention_2+liger": ("flash_attention_2", True),
}
FLOW_BACKENDS = ("native", "_native_flash", "flash", "_flash_3")


def build_policy_folder(folder: Path, tiny: bool) -> Path:
    """Random bfloat16 weights of the 3B architecture (or the tiny one) with the embedded tokenizer, saved once."""
    import transformers
    from transformers import AutoConfig, AutoModelForImageTextToText

    from app.tiny.models import TINY_VLMS, _processor
    from app.tiny.tokenizer import build_tokenizer

    if (folder / "config.json").exists():
        return folder
    tokenizer = build_tokenizer(seed=0)
    spec = TINY_VLMS["tiny-qwen2.5-vl"]
    text = dict(spec.text_config) if tiny else dict(QWEN2_5_VL_3B_TEXT)
    vision = dict(spec.vision_config) if tiny else dict(QWEN2_5_VL_3B_VISION)
    ids = tokenizer.convert_tokens_to_ids
    text.update(
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    config = AutoConfig.for_model(
        "qwen2_5_vl",
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=not tiny,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32 if tiny else torch.bfloat16)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    processor = _processor(spec, tokenizer)
    processor.image_processor.size = {"shortest_edge": 56 * 56, "longest_edge": 448 * 448}  # keep 448x448 whole
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    del model
    transformers.utils.logging.disable_progress_bar()
    return folder


def prompts(n: int, size: int):
    from PIL import Image

    from app.types import VisualSample

    return [
        VisualSample(
            images=[Image.effect_noise((size, size), 40 + 10 * i).convert("RGB")],
            question=f"How many objects are in picture {i}? Think step by step, then answer with a number.",
            task="bench",
        )
        for i in range(n)
    ]


def model_flops(policy, tokens: int, attention_tokens: float, lora: bool) -> float:
    """Training FLOPs of ``tokens`` tokens: 6 N (full) or 4 N (LoRA) per token over the language model's weights
    (embeddings excluded), plus causal attention ``attention_tokens`` = sum over rows of length^2."""
    config = policy.hf_model.config.text_config
    language = policy.hf_model.model.language_model
    params = sum(p.numel() for n, p in language.named_parameters() if "embed_tokens" not in n)
    params += policy.hf_model.lm_head.weight.numel()
    per_token = 4 if lora else 6  # forward 2N; backward 2N for the input gradients (+ 2N for weight gradients)
    attention = 2 * 2 * config.num_hidden_layers * config.hidden_size * attention_tokens / 2  # QK^T and AV, causal
    return per_token * params * tokens + 3 * attention  # attention has no weights: backward = 2 x forward


def run_vlm(folder: Path, variant: str, mode: str, shared: bool, args) -> dict:
    """One variant; Liger's rotary replacement is process-wide, so the modeling module's function is put back after."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

    rotary = modeling.apply_rotary_pos_emb
    try:
        return _run_vlm(folder, variant, mode, shared, args)
    finally:
        modeling.apply_rotary_pos_emb = rotary


def _run_vlm(folder: Path, variant: str, mode: str, shared: bool, args) -> dict:
    from app.algorithms import grpo_loss
    from app.models import VLMPolicy
    from app.sampling.batching import micro_batches
    from app.settings import LoRASettings, SamplingSettings

    attn, liger = VARIANTS[variant]
    row = dict(variant=variant, mode=mode, shared_prefix=shared)
    dtype = "float32" if args.tiny else "bfloat16"
    lora = LoRASettings(r=32, alpha=64, dropout=0.0) if mode == "lora" else None
    try:
        policy = VLMPolicy(
            str(folder),
            lora=lora,
            dtype=dtype,
            attn_implementation=attn,
            use_liger_kernel=liger,
            gradient_checkpointing=True,
            shared_prefix=shared,
        )
    except (RuntimeError, ValueError, ImportError) as error:
        return {**row, "error": str(error)}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy.to(device)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-6, fused=device.type == "cuda")
    sampling = SamplingSettings(group_size=args.k, max_new_tokens=args.new_tokens)
    samples = prompts(args.prompts, args.image_size)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    for step in range(args.warmup + 1):  # the last iteration is timed
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        start = time.perf_counter()
        prompt_inputs = policy.encode_prompts(samples, group_size=args.k)
        torch.manual_seed(step)
        completions = policy.generate(prompt_inputs, sampling, group_size=args.k)
        sync()
        rollout_s = time.perf_counter() - start
        rollout_peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        n, length = completions.completion_ids.shape
        advantages = torch.randn(n, device=device)
        mask = completions.completion_mask
        start = time.perf_counter()
        for rows in micro_batches(n, args.micro_batch):
            logprobs = policy.sequence_logprobs(
                prompt_inputs.select(rows), completions.completion_ids[rows], mask[rows], sampling.temperature
            )
            out = grpo_loss(logprobs, logprobs.detach(), advantages[rows], mask[rows].float())
            (out.loss * (rows.stop - rows.start) / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        train_s = time.perf_counter() - start
        train_peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    prompt_length = prompt_inputs.tensors["input_ids"].shape[1]
    lengths = prompt_inputs.tensors["attention_mask"].sum(dim=1) + mask.sum(dim=1)  # [N] real tokens per row
    tokens = int(lengths.sum())
    flops = model_flops(policy, tokens, float((lengths.float() ** 2).sum()), lora is not None)
    row.update(
        kernels=policy.kernels.summary() if policy.kernels else "-",
        prompt_tokens=prompt_length,
        new_tokens=int(mask.sum()) // n,
        rollout_s=rollout_s,
        rollout_tokens_per_s=int(mask.sum()) / rollout_s,
        train_s=train_s,
        train_tokens_per_s=tokens / train_s,
        mfu=flops / train_s / (args.peak_tflops * 1e12) if device.type == "cuda" else None,
        rollout_peak_gib=rollout_peak / 2**30,
        train_peak_gib=train_peak / 2**30,
    )
    del policy, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def run_flow(name: str, args) -> list[dict]:
    """For each attention backend: one forward + backward of the flow transformer per step (bf16, random weights,
    gradient checkpointing), the median of 3 after a warm-up. The model is built once and its backend switched."""
    from diffusers import SD3Transformer2DModel, WanTransformer3DModel

    from app.models.kernels import set_flow_attention_backend

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_flow_recipes import SD3_5_MEDIUM, TINY_OVERRIDES, WAN_1_3B

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    batch = args.flow_batch
    with torch.device(device):
        if name == "sd3.5-medium":
            config = {**SD3_5_MEDIUM, **(TINY_OVERRIDES["sd3"] if args.tiny else {})}
            model = SD3Transformer2DModel(**config)
            side = 16 if args.tiny else 64  # 512 px / VAE factor 8
            inputs = dict(
                hidden_states=torch.randn(batch, 16, side, side),
                timestep=torch.rand(batch) * 1000,
                encoder_hidden_states=torch.randn(batch, 333, config["joint_attention_dim"]),
                pooled_projections=torch.randn(batch, config["pooled_projection_dim"]),
            )
        else:
            config = {**WAN_1_3B, **(TINY_OVERRIDES["wan"] if args.tiny else {})}
            model = WanTransformer3DModel(**config)
            frames, height, width = (2, 8, 8) if args.tiny else (9, 60, 104)  # 33 frames of 480 x 832 after the VAE
            inputs = dict(
                hidden_states=torch.randn(batch, 16, frames, height, width),
                timestep=torch.rand(batch) * 1000,
                encoder_hidden_states=torch.randn(batch, 512, config["text_dim"]),
            )
    model = model.to(dtype).train()
    model.enable_gradient_checkpointing()
    inputs = {k: v.to(dtype) if k != "timestep" else v for k, v in inputs.items()}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for backend in FLOW_BACKENDS:
        row = dict(model=name, backend=backend)
        try:
            set_flow_attention_backend(model, backend)
        except (RuntimeError, ValueError) as error:
            rows.append({**row, "error": str(error)})
            continue
        times = []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(4):
            sync()
            start = time.perf_counter()
            out = model(**inputs, return_dict=False)[0]
            out.float().square().mean().backward()
            sync()
            times.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
        rows.append({**row, "step_s": sorted(times[1:])[1], "peak_gib": peak})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--modes", nargs="+", choices=["lora", "full"], default=["lora", "full"])
    parser.add_argument("--shared", nargs="+", choices=["on", "off"], default=["on", "off"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200 SXM)")
    parser.add_argument(
        "--flow", nargs="*", choices=["sd3.5-medium", "wan2.1-1.3b"], default=["sd3.5-medium", "wan2.1-1.3b"]
    )
    parser.add_argument("--flow-batch", type=int, default=2)
    parser.add_argument("--workdir", default="/tmp/gpu_vlm_grpo")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny widths, float32, 2 x 2 x 8 tokens")
    parser.add_argument("--out", help="also write the rows as JSON lines here")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.tiny:
        sys.exit("gpu_vlm_grpo.py needs a CUDA GPU (none found); run with --tiny for a CPU smoke test of the code path")
    if args.tiny:
        args.prompts, args.k, args.new_tokens, args.image_size, args.micro_batch = 2, 2, 8, 64, 2
    folder = build_policy_folder(Path(args.workdir) / ("tiny" if args.tiny else "qwen2_5_vl_3b"), args.tiny)
    rows = []
    print("| variant | mode | shared prefix | rollout tok/s | train tok/s | MFU | rollout peak GiB | train peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for variant in args.variants:
        for mode in args.modes:
            for shared in args.shared:
                try:
                    row = run_vlm(folder, variant, mode, shared == "on", args)
                except Exception:  # noqa: BLE001 (one failing variant must not hide the others' figures)
                    row = dict(
                        variant=variant, mode=mode, shared_prefix=shared == "on", error=traceback.format_exc(limit=3)
                    )
                rows.append(row)
                if "error" in row:
                    print(f"| {variant} | {mode} | {shared} | not run: {row['error'].strip().splitlines()[-1]} |||||")
                    continue
                mfu = f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "-"
                print(
                    f"| {variant} | {mode} | {shared} | {row['rollout_tokens_per_s']:.0f} "
                    f"| {row['train_tokens_per_s']:.0f} | {mfu} | {row['rollout_peak_gib']:.1f} "
                    f"| {row['train_peak_gib']:.1f} |"
                )
    if args.flow:
        print("\n| flow transformer | attention backend | fwd+bwd step (s) | peak GiB |\n|---|---|---|---|")
    for name in args.flow:
        for row in run_flow(name, args):
            rows.append(row)
            if "error" in row:
                print(f"| {name} | {row['backend']} | not run: {row['error']} | |")
            else:
                print(f"| {name} | {row['backend']} | {row['step_s']:.3f} | {row['peak_gib']:.1f} |")
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()

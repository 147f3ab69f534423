"""Time per denoising step of the ODE (Euler), SDE (Flow-GRPO) and CPS samplers on CPU, with 2 threads.

    python benchmarks/samplers.py                 # about 1 minute on 2 cores
    python benchmarks/samplers.py --repeats 5     # fewer repeats of the SD3-sized model
    python benchmarks/samplers.py --device cuda --layers 24 --latent-size 64 --batch 8   # SD3.5-medium, 512 px, GPU

A step is what a rollout pays: one transformer forward (``SD3Transformer2DModel``, random weights, batch 1, under
``inference_mode``) plus the sampler's math, which for SDE and CPS includes drawing the noise and the step's log-prob.
Two models: the embedded tiny SD3 config (4 x 32 x 32 latents), and an SD3-medium-wide stack cut to
``--layers`` joint blocks (head dim 64 x 24 heads = hidden 1536, joint_attention_dim 4096, 16 x 32 x 32 latents, 333
text tokens as with CLIP + T5). Each repeat runs one step of every sampler, in a rotating order, so load from other
processes on a shared machine falls on all three alike; the table shows medians. "math only" times the sampler step
alone (median of ``--math-calls`` calls), the part the samplers actually differ in; "math extra / ODE step" is that
difference as a share of the ODE step, which is what the "vs ODE" ratio would show without timing noise (on a shared
machine the step medians can move by more than the whole sampler math at SD3 width). Target: SDE/ODE and CPS/ODE within
5% of 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import torch  # noqa: E402
from diffusers import SD3Transformer2DModel  # noqa: E402

from app.sampling.flow import cps_step, flow_sigmas, ode_step, sde_step  # noqa: E402
from app.tiny.flow_models import TINY_FLOWS  # noqa: E402

TINY = {**TINY_FLOWS["tiny-sd3"].transformer_config, "sample_size": 32}  # the embedded model, at 32x32 latents
SD3_WIDE = dict(  # SD3-medium's widths, fewer layers; pos_embed_max_size cut from 192 (only a crop of it is used)
    sample_size=32,
    patch_size=2,
    in_channels=16,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    out_channels=16,
    pos_embed_max_size=64,
)
SAMPLERS = {
    "ODE": lambda x, v, s, s1, g: ode_step(x, v, s, s1),
    "SDE": lambda x, v, s, s1, g: sde_step(x, v, s, s1, eta=0.7, generator=g),
    "CPS": lambda x, v, s, s1, g: cps_step(x, v, s, s1, eta=0.7, generator=g),
}


def bench(
    name: str,
    config: dict,
    text_tokens: int,
    repeats: int,
    math_calls: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    batch: int = 1,
) -> None:
    torch.manual_seed(0)
    model = SD3Transformer2DModel(**config).eval().to(device, dtype)
    params = sum(p.numel() for p in model.parameters())
    size = config["sample_size"]
    x = torch.randn(batch, config["in_channels"], size, size, device=device)  # [B, C, H, W], float32 as in rollouts
    context = torch.randn(batch, text_tokens, config["joint_attention_dim"], device=device, dtype=dtype)  # [B, L, D]
    pooled = torch.randn(batch, config["pooled_projection_dim"], device=device, dtype=dtype)  # [B, D_pooled]
    sigmas = flow_sigmas(30, shift=3.0)
    s, s_next = sigmas[10], sigmas[11]  # a mid-trajectory, trainable step
    timestep = (s * 1000).reshape(1).expand(batch).to(device)
    g = torch.Generator(device=device).manual_seed(0)

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    def step(sampler) -> None:
        v = model(x.to(dtype), encoder_hidden_states=context, pooled_projections=pooled, timestep=timestep).sample
        sampler(x, v.float(), s, s_next, g)
        sync()

    times = {k: [] for k in SAMPLERS}
    names = list(SAMPLERS)
    with torch.inference_mode():
        for k in names:  # warm-up
            step(SAMPLERS[k])
        for r in range(repeats):
            for k in names[r % 3 :] + names[: r % 3]:  # rotate the order
                sync()
                start = time.perf_counter()
                step(SAMPLERS[k])
                times[k].append(time.perf_counter() - start)
        v = torch.randn_like(x)
        math_only = {}
        for k, sampler in SAMPLERS.items():
            calls = []
            for _ in range(math_calls):
                sync()
                start = time.perf_counter()
                sampler(x, v, s, s_next, g)
                sync()
                calls.append(time.perf_counter() - start)
            math_only[k] = statistics.median(calls)

    step_ms = {k: statistics.median(t) * 1e3 for k, t in times.items()}
    print(
        f"\n{name}: {params / 1e6:.1f}M params, latents {tuple(x.shape)}, {text_tokens} text tokens, {repeats} repeats"
    )
    print(f"{'sampler':<8}{'ms / step':>12}{'vs ODE':>10}{'math only (us)':>18}{'math extra / ODE step':>24}")
    for k in names:
        extra = (math_only[k] - math_only["ODE"]) * 1e3 / step_ms["ODE"]
        print(f"{k:<8}{step_ms[k]:>12.2f}{step_ms[k] / step_ms['ODE']:>10.3f}{math_only[k] * 1e6:>18.1f}{extra:>24.2%}")
    worst = max(abs(step_ms[k] / step_ms["ODE"] - 1) for k in ("SDE", "CPS"))
    print(f"target: SDE/ODE and CPS/ODE within 5% -> {'met' if worst <= 0.05 else 'MISSED'} (worst {worst:.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9, help="steps per sampler on the SD3-sized model")
    parser.add_argument("--tiny-repeats", type=int, default=100, help="steps per sampler on the tiny model")
    parser.add_argument("--layers", type=int, default=2, help="joint blocks of the SD3-sized model (SD3-medium: 24)")
    parser.add_argument("--math-calls", type=int, default=200, help="calls timed for the math-only column")
    parser.add_argument("--device", default="cpu", help="cuda: bf16 weights, synchronised timings")
    parser.add_argument("--latent-size", type=int, default=32, help="latent side of the SD3-sized model (512 px: 64)")
    parser.add_argument("--batch", type=int, default=1, help="samples per step")
    args = parser.parse_args()
    torch.set_num_threads(2)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    common = dict(math_calls=args.math_calls, device=args.device, dtype=dtype, batch=args.batch)
    bench("tiny SD3 (embedded)", TINY, text_tokens=16, repeats=args.tiny_repeats, **common)
    wide = dict(SD3_WIDE, num_layers=args.layers, sample_size=args.latent_size)
    label = f"SD3-medium width, {args.layers} layers, {args.latent_size}x{args.latent_size} latents, batch {args.batch}"
    bench(label, wide, text_tokens=333, repeats=args.repeats, **common)


if __name__ == "__main__":
    main()

"""Runs under ``torchrun``: each tiny policy loaded normally and loaded lean (empty network, sharded, each rank reading
its own rows, :mod:`app.parallel.loading`), both sharded with FSDP2 over all ranks, for ``test_lean_loading.py``.

    torchrun --standalone --nproc_per_node 2 tests/parallel/lean_probe.py OUT CASE [CASE ...]

A case is ``vlm_lora`` (LoRA on the tiny Qwen2.5-VL), ``vlm_full`` (full fine-tuning with its frozen KL reference),
``vlm_tied`` (the same with the output head tied to the input embedding), ``flow_lora`` (LoRA on the tiny SD3) or
``cli_fit`` (one step of ``tests/fixtures/tiny_grpo.yaml`` under FSDP2 through the CLI, last: Lightning keeps the
process group). Every rank writes ``OUT/<case>.rank<r>.pt``: for a policy, whether the gathered full state dicts,
the buffers, the log-probs (VLM) or velocities (flow) before and after one AdamW step, and the gathered trained weights
after it are identical between the two loadings, and the parameter bytes each loading materialised on this rank; for
``cli_fit``, what each call of ``materialize`` in ``shard_policy`` loaded and the step the fit reached.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from app.command_line.commands import AppCLI
from app.models import FlowPolicy, VLMPolicy
from app.parallel import shard_policy
from app.parallel.fsdp import MESH_DIMS
from app.parallel.loading import deferred, deferred_networks, lean_loading, materialize
from app.settings import LoRASettings
from app.tasks.dots import DotsDataset
from app.tiny.models import resolve_pretrained

TINY_GRPO = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_grpo.yaml"


def build(case: str, out: Path):
    if case.startswith("vlm"):
        lora = LoRASettings(r=4, alpha=8, dropout=0.0) if case == "vlm_lora" else None
        model = str(tied_copy(out / f"tied.rank{dist.get_rank()}")) if case == "vlm_tied" else "tiny-qwen2.5-vl"
        policy = VLMPolicy(model, lora=lora, instruction="")
        if lora is None:
            policy.enable_reference()
        return policy
    return FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8))


def tied_copy(folder: Path) -> Path:
    """The tiny Qwen2.5-VL with its output head tied to the input embedding (as Qwen2.5-VL-3B has it): the config
    says so and the checkpoint leaves ``lm_head.weight`` out."""
    if not folder.exists():
        shutil.copytree(resolve_pretrained("tiny-qwen2.5-vl"), folder)
        config = json.loads((folder / "config.json").read_text())
        config["tie_word_embeddings"] = config["text_config"]["tie_word_embeddings"] = True
        (folder / "config.json").write_text(json.dumps(config))
        weights = load_file(folder / "model.safetensors")
        del weights["lm_head.weight"]
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def tied(policy) -> bool:
    """Whether the trained network's output head is its input embedding (the same parameter)."""
    network = policy.base_network
    return network.get_output_embeddings().weight is network.get_input_embeddings().weight


def outputs(policy, case: str) -> list[torch.Tensor]:
    """Log-probs (VLM: policy and, for full fine-tuning, reference) or velocities (flow) of fixed inputs."""
    generator = torch.Generator().manual_seed(7)
    if case.startswith("vlm"):
        dataset = DotsDataset(2, 0, image_size=64)
        prompts = policy.encode_prompts([dataset[0], dataset[1]], rows_per_prompt=2)
        ids = torch.randint(3, 1000, (4, 6), generator=generator)
        mask = torch.ones_like(ids)
        found = [policy.sequence_logprobs(prompts, ids, mask)]
        if policy.frozen_reference is not None:
            found.append(policy.reference_logprobs(prompts, ids, mask))
        return found
    conditioning = policy.encode_prompts(["a red circle", "a blue square"])
    latents = torch.randn((2, *policy.latent_shape), generator=generator)
    return [policy.velocity(latents, torch.tensor(0.7), conditioning)]


def one_step(policy, case: str) -> None:
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    loss = sum(out.float().pow(2).mean() for out in outputs(policy, case)[:1])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def param_bytes(tensors, materialised_only: bool = True) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if not (materialised_only and local.is_meta):
            total += local.numel() * local.element_size()
    return total


def full_state(policy) -> dict[str, torch.Tensor]:
    return get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def run(out: Path, case: str, mesh) -> None:
    torch.manual_seed(0)
    normal = build(case, out)
    rng_after_normal = torch.get_rng_state()
    network_bytes = sum(param_bytes(n.parameters()) for n in _trained_networks(normal))
    torch.manual_seed(0)
    with lean_loading():
        lean = build(case, out)
    rng_same = torch.equal(rng_after_normal, torch.get_rng_state())
    empty = deferred_networks(lean)
    built_bytes = sum(param_bytes(n.parameters()) for n in empty)  # materialised by the lean build: none
    kept_bytes = sum(param_bytes(deferred(n).initial.values(), False) for n in empty)
    settings = {"mesh": mesh}
    shard_policy(normal.sharding_plan(), settings)
    report = shard_policy(lean.sharding_plan(), settings)
    local_bytes = sum(param_bytes(n.parameters()) for n in _trained_networks(lean))
    report_row = {
        "network_bytes": network_bytes,  # the full trained network(s), as every rank builds them normally
        "built_bytes": built_bytes,
        "kept_bytes": kept_bytes,  # LoRA initial values kept whole on every rank
        "loaded_local_bytes": report.local_bytes,
        "largest_read_bytes": report.largest_read_bytes,
        "local_bytes": local_bytes,
        "rng_same": rng_same,
        "empty_networks": len(empty),
        "left_empty": len(deferred_networks(lean)),
        "state_same": same(full_state(normal), full_state(lean)),
        "buffers_same": same(dict(normal.named_buffers()), dict(lean.named_buffers())),
        "requires_grad_same": [p.requires_grad for p in normal.parameters()]
        == [p.requires_grad for p in lean.parameters()],
    }
    if case.startswith("vlm"):
        report_row["tied"] = (tied(normal), tied(lean))
    before = [outputs(normal, case), outputs(lean, case)]
    report_row["outputs_same"] = all(torch.equal(a, b) for a, b in zip(*before, strict=True))
    report_row["outputs_finite"] = all(bool(torch.isfinite(a).all()) for a in before[0])
    one_step(normal, case)
    one_step(lean, case)
    after = [outputs(normal, case), outputs(lean, case)]
    report_row["outputs_after_step_same"] = all(torch.equal(a, b) for a, b in zip(*after, strict=True))
    report_row["outputs_moved"] = not torch.equal(before[0][0], after[0][0])
    report_row["state_after_step_same"] = same(full_state(normal), full_state(lean))
    torch.save(report_row, out / f"{case}.rank{dist.get_rank()}.pt")


def _trained_networks(policy):
    networks = [policy.base_network]
    return networks + ([policy.frozen_reference] if policy.frozen_reference is not None else [])


def cli_fit(out: Path) -> None:
    """One step of the tiny GRPO recipe under FSDP2 through the CLI (``python -m app fit`` on these processes), with
    :func:`app.parallel.fsdp.materialize` recorded: what each rank loaded when Lightning called ``configure_model``."""
    import app.parallel.fsdp as fsdp

    loads = []

    def recorded(*args, **kwargs):
        loads.append(materialize(*args, **kwargs))
        return loads[-1]

    rank = dist.get_rank()
    overlay = out / f"fsdp2.rank{rank}.yaml"
    overlay.write_text(json.dumps({"trainer": {"strategy": {"class_path": "app.parallel.FSDP2Strategy"}}}))
    args = [
        "fit",
        "--config",
        str(TINY_GRPO),
        "--config",
        str(overlay),
        "--trainer.devices",
        os.environ["WORLD_SIZE"],
        "--trainer.max_steps",
        "1",
        "--validate_before_and_after",
        "false",
        "--trainer.default_root_dir",
        str(out / "cli_fit"),
    ]
    fsdp.materialize = recorded
    try:
        cli = AppCLI(args=args)
    finally:
        fsdp.materialize = materialize
    row = {
        "loads": [None if load is None else asdict(load) for load in loads],
        "global_step": cli.trainer.global_step,
        "left_empty": len(deferred_networks(cli.model.policy)),
        "network_bytes": sum(p.numel() * p.element_size() for p in cli.model.policy.base_network.parameters()),
    }
    torch.save(row, out / f"cli_fit.rank{rank}.pt")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1, int(os.environ["WORLD_SIZE"])), mesh_dim_names=MESH_DIMS)
    for case in sys.argv[2:]:
        cli_fit(out) if case == "cli_fit" else run(out, case, mesh)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

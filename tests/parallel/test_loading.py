"""Lean loading (:mod:`app.parallel.loading`) in one process: what each rank of a sharded network reads (simulated
ranks of torch's fake process group), loading an empty network whole, the checks that fall back to normal loading,
PEFT adapters' initial values, and when the CLI asks for it. The multi-process comparison with normal loading is
``test_lean_loading.py``."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from app.command_line.commands import AppCLI, fsdp2_processes
from app.modules.policy_module import PolicyModule
from app.parallel import FSDP2Strategy
from app.parallel.fsdp import MESH_DIMS
from app.parallel.loading import (
    LeanLoadingUnsupported,
    deferred,
    deferred_networks,
    empty_network,
    keeping_new_parameters,
    lean_loading,
    lean_loading_requested,
    materialize,
    safetensors_files,
    same_names,
)
from app.settings import OptimizerSettings
from app.tiny.flow_models import load_flow_components, resolve_flow_pretrained
from app.tiny.models import load_vlm, resolve_pretrained

ROOT = Path(__file__).resolve().parents[2]
TINY_GRPO = ROOT / "tests" / "fixtures" / "tiny_grpo.yaml"


class Tiny(nn.Module):
    """Row counts that do not split evenly over 4 ranks (5 and 7: the last rank's shard is short or empty), an output
    head tied to the input embedding, a persistent buffer the checkpoint holds and a non-persistent one it does not."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.block = nn.Linear(3, 7)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("steps", torch.arange(4.0), persistent=False)


@pytest.fixture
def checkpoint(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A safetensors file of a Tiny (the tied head left out, as transformers saves it) and its values."""
    model = Tiny()
    model.scale.fill_(2.0)  # differs from what the constructor computes: it must come from the file
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "head.weight"}
    save_file(state, tmp_path / "tiny.safetensors")
    return tmp_path / "tiny.safetensors", state


@contextlib.contextmanager
def simulated_rank(rank: int, world: int):
    """This process as rank ``rank`` of ``world`` (torch's fake process group: collectives do nothing)."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def rows(full: torch.Tensor, pieces: int, index: int) -> torch.Tensor:
    """Piece ``index`` of ``full`` cut as FSDP2 shards dim 0 (``torch.chunk``; missing pieces are empty)."""
    chunks = torch.chunk(full, pieces)
    return chunks[index] if index < len(chunks) else full[:0]


# -------------------------------------------------------------------------------------------- sharded networks
@pytest.mark.parametrize("mesh_shape", [(1, 4), (2, 2)], ids=["fsdp", "hsdp"])
def test_each_rank_reads_exactly_the_rows_it_stores(checkpoint, mesh_shape):
    file, state = checkpoint
    world, shard_size = mesh_shape[0] * mesh_shape[1], mesh_shape[1]
    for rank in range(world):
        with simulated_rank(rank, world):
            mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=MESH_DIMS)
            network = empty_network(Tiny, [file], same_names)
            assert all(p.is_meta for p in network.parameters()) and not network.scale.is_meta
            fully_shard(network.block, mesh=mesh)
            fully_shard(network, mesh=mesh)
            report = materialize([network])
            position = rank % shard_size  # replicated over the outer mesh dimension, sharded over the inner one
            stored, reads = 0, [state["scale"]]  # buffers are not sharded: read whole
            for name, parameter in network.named_parameters():
                assert isinstance(parameter, DTensor)
                local = parameter.to_local()
                reads.append(rows(state[name], shard_size, position))
                assert torch.equal(local, reads[-1]), (rank, name)
                stored += local.numel() * local.element_size()
            assert network.head.weight is network.embed.weight  # still tied
            assert torch.equal(network.scale, state["scale"]) and torch.equal(network.steps, torch.arange(4.0))
            assert deferred(network) is None and not deferred_networks(network)
            assert report.local_bytes == stored + state["scale"].numel() * 4
            assert report.largest_read_bytes == max(read.numel() * 4 for read in reads)


def test_meta_tensors_of_a_network_the_modules_do_not_contain_are_an_error(checkpoint):
    file, _ = checkpoint
    with simulated_rank(0, 2):
        mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=MESH_DIMS)
        network = empty_network(Tiny, [file], same_names)
        fully_shard(network.block, mesh=mesh)
        with pytest.raises(
            RuntimeError, match="materialize left 2 tensors without values, e.g. weight: they are in no"
        ):
            materialize([network.block])  # the empty network is the block's parent, not inside it


# ------------------------------------------------------------------------------------------------ whole networks
def test_an_empty_network_loaded_whole_equals_its_checkpoint(checkpoint):
    file, state = checkpoint
    network = empty_network(Tiny, [file], same_names)
    report = materialize(deferred_networks(network))
    assert not any(t.is_meta for t in [*network.parameters(), *network.buffers()])
    loaded = network.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert network.head.weight is network.embed.weight
    assert report.tensors == len(state) and deferred(network) is None
    assert materialize([network]) is None and materialize([nn.Linear(2, 2)]) is None  # nothing left empty


def test_a_checkpoint_missing_a_parameter_or_of_another_shape_is_not_loaded_lean(checkpoint, tmp_path):
    file, state = checkpoint
    save_file({k: v for k, v in state.items() if k != "block.bias"}, tmp_path / "missing.safetensors")
    with pytest.raises(LeanLoadingUnsupported, match="no checkpoint tensor for block.bias"):
        empty_network(Tiny, [tmp_path / "missing.safetensors"], same_names)
    save_file({**state, "block.bias": torch.zeros(6)}, tmp_path / "shape.safetensors")
    with pytest.raises(ValueError, match=r"block.bias has shape \[6\], the model's block.bias \[7\]"):
        empty_network(Tiny, [tmp_path / "shape.safetensors"], same_names)


def test_safetensors_files_follow_the_index_of_a_sharded_checkpoint(tmp_path):
    for shard in ("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"):
        save_file({"x": torch.zeros(1)}, tmp_path / shard)
    weight_map = {"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    found = safetensors_files(str(tmp_path), "model.safetensors")
    assert found == [
        str(tmp_path / "model-00001-of-00002.safetensors"),
        str(tmp_path / "model-00002-of-00002.safetensors"),
    ]
    save_file({"x": torch.zeros(1)}, tmp_path / "model.safetensors")
    assert safetensors_files(str(tmp_path), "model.safetensors") == [str(tmp_path / "model.safetensors")]
    with pytest.raises(LeanLoadingUnsupported, match="no diffusion_pytorch_model.safetensors"):
        safetensors_files(str(tmp_path), "diffusion_pytorch_model.safetensors")


def test_parameters_made_after_the_build_keep_their_first_values_in_the_dtype_they_moved_to(checkpoint):
    file, _ = checkpoint
    network = empty_network(Tiny, [file], same_names)
    with keeping_new_parameters(network):  # as PEFT adds an adapter: made on the CPU, moved to its layer's device
        adapter = nn.Linear(3, 2)
        first = adapter.weight.detach().clone()
        network.block.adapter = adapter.to("meta", dtype=torch.bfloat16)
    assert network.block.adapter.weight.is_meta
    materialize(deferred_networks(network))
    assert network.block.adapter.weight.dtype == torch.bfloat16
    assert torch.equal(network.block.adapter.weight, first.to(torch.bfloat16))
    normal = nn.Linear(2, 2)
    with keeping_new_parameters(normal):  # not an empty network: nothing recorded
        normal.extra = nn.Linear(2, 2)
    assert deferred(normal) is None


# --------------------------------------------------------------------------------------------- real checkpoints
def same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


def test_a_policy_built_empty_in_a_run_without_fsdp2_is_loaded_whole_by_configure_model():
    from app.models import VLMPolicy
    from app.settings import LoRASettings

    def build() -> VLMPolicy:
        torch.manual_seed(0)  # the adapters' random draws
        lora = LoRASettings(r=4, alpha=8, dropout=0.0)
        return VLMPolicy("tiny-qwen2.5-vl", lora=lora, instruction="", dtype="bfloat16")

    normal = build()
    with lean_loading():
        lean = build()
    assert deferred_networks(lean) and next(lean.base_network.parameters()).is_meta
    PolicyModule(
        lean, optimizer=OptimizerSettings(learning_rate=1e-3), default_learning_rate=1e-6
    ).configure_model()  # no trainer: one process, nothing sharded
    assert not deferred_networks(lean)
    assert same_state(lean, normal) and same_state(lean.base_network, normal.base_network)
    assert [p.requires_grad for p in lean.parameters()] == [p.requires_grad for p in normal.parameters()]


def test_a_checkpoint_without_safetensors_is_loaded_normally_with_a_warning(tmp_path, caplog):
    folder = tmp_path / "flow"
    shutil.copytree(resolve_flow_pretrained("tiny-sd3"), folder)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    torch.save(load_file(weights), weights.with_suffix(".bin"))
    weights.unlink()
    with caplog.at_level(logging.WARNING, logger="app.parallel.loading"):
        transformer = load_flow_components(str(folder), dtype=torch.float32, empty_transformer=True)["transformer"]
    assert (
        f"lean loading of {folder}/transformer is not possible (no diffusion_pytorch_model.safetensors" in caplog.text
    )
    assert deferred(transformer) is None and not any(p.is_meta for p in transformer.parameters())
    assert same_state(transformer, load_flow_components("tiny-sd3", dtype=torch.float32)["transformer"])


def test_a_checkpoint_that_would_leave_a_weight_random_is_loaded_normally_with_a_warning(tmp_path, caplog):
    folder = tmp_path / "vlm"
    shutil.copytree(resolve_pretrained("tiny-qwen2.5-vl"), folder)
    state = load_file(folder / "model.safetensors")
    del state["lm_head.weight"]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING, logger="app.parallel.loading"):
        model, _ = load_vlm(str(folder), dtype=torch.float32, empty=True)
    assert (
        f"lean loading of {folder} is not possible (no checkpoint tensor for lm_head.weight (it would be" in caplog.text
    )
    assert "every rank loads the whole model" in caplog.text
    assert deferred(model) is None and not any(p.is_meta for p in model.parameters())


# ---------------------------------------------------------------------------------------- when the CLI asks for it
FSDP2 = {"class_path": "app.parallel.FSDP2Strategy"}


@pytest.mark.parametrize(
    "trainer, world_size, expected",
    [
        ({"strategy": "ddp", "devices": 2}, None, 0),
        ({"strategy": FSDP2, "devices": 2, "accelerator": "cpu"}, None, 2),
        ({"strategy": FSDP2, "devices": "2", "num_nodes": 3}, None, 6),
        ({"strategy": FSDP2, "devices": [0, 1, 2]}, None, 3),
        ({"strategy": FSDP2, "devices": "0,1"}, None, 2),
        ({"strategy": FSDP2, "devices": "auto", "accelerator": "cpu"}, None, 1),
        ({"strategy": FSDP2, "devices": 1}, "4", 4),  # a launcher's WORLD_SIZE wins
        ({"strategy": FSDP2Strategy(), "devices": 2}, None, 2),
        ({"strategy": {"class_path": "app.parallel.NoSuchStrategy"}, "devices": 2}, None, 0),
        ({"devices": 2}, "2", 0),
    ],
)
def test_fsdp2_processes_counts_the_processes_of_an_fsdp2_trainer(monkeypatch, trainer, world_size, expected):
    if world_size is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world_size)
    assert fsdp2_processes(trainer) == expected


@pytest.mark.parametrize("strategy, lean", [("app.parallel.FSDP2Strategy", True), ("ddp", False)])
def test_the_cli_builds_the_policy_empty_only_for_fsdp2_over_several_processes(monkeypatch, tmp_path, strategy, lean):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    requested = []

    def record(cli, subcommand):  # instead of running fit: what the instantiation saw
        requested.append(lean_loading_requested())

    monkeypatch.setattr(AppCLI, "_run_subcommand", record)
    overlay = tmp_path / "strategy.yaml"  # as the GPU recipes name it
    overlay.write_text(json.dumps({"trainer": {"strategy": {"class_path": strategy} if "." in strategy else strategy}}))
    args = ["fit", "--config", str(TINY_GRPO), "--config", str(overlay), "--trainer.devices", "2"]
    cli = AppCLI(args=[*args, "--trainer.default_root_dir", str(tmp_path)])
    assert bool(deferred_networks(cli.model.policy)) is lean
    assert requested == [False] and not lean_loading_requested()  # only around the instantiation

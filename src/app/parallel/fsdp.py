"""FSDP2 through Lightning: a strategy with a named 2-D mesh (replicate x shard) and the sharding of a policy.

``FSDP2Strategy`` is Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy` with the mesh the package
needs: ``("replicate", "shard")``. ``replicate_size = 1`` is plain FSDP (every rank holds 1/world of each sharded
parameter), ``shard_size = 1`` is replication (DDP-like), anything between is HSDP: parameters sharded within a group of
``shard_size`` ranks (a node) and replicated across groups, gradients reduce-scattered within a group and all-reduced
across them. Every rank draws its own prompts (both mesh dimensions are data parallel), so groups of K outputs and
consistency pairs never leave the rank that drew them.

The module's ``configure_model`` (see :class:`~app.modules.policy_module.PolicyModule`) calls :func:`shard_policy`,
which applies ``fully_shard`` to the units the policy names in its :class:`~app.parallel.plan.ShardingPlan`. Lightning
then builds the optimizer on the sharded parameters. Rollouts run inside :func:`gathered`: every unit is all-gathered
once for the whole rollout (instead of once per generated token or denoising step) and resharded after it, before any
optimizer step, so the optimizer never updates a copy that a later forward would not read.

Checkpoints stay lean: the frozen base is left out of sharded (``torch.distributed.checkpoint``) and gathered ones
alike, and :meth:`FSDP2Strategy.load_checkpoint` loads what the checkpoint holds and keeps the config's base weights for
the rest. A sharded checkpoint loads on any number of processes (DCP reshards on load); ``python -m app export`` reads
it in one process.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.fabric.strategies.model_parallel import _is_sharded_checkpoint, _load_checkpoint
from lightning.fabric.utilities.distributed import _distributed_is_initialized
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from app.dtypes import DTYPES
from app.errors import ConfigError
from app.parallel.loading import LoadReport, materialize
from app.parallel.plan import ShardingPlan

log = logging.getLogger(__name__)

MESH_DIMS = ("replicate", "shard")
METADATA_FILE = "meta.pt"  # Lightning's name for the non-tensor part of a sharded checkpoint
OMITTED = "frozen_parameters_omitted"  # checkpoint key: the frozen parameters a lean checkpoint leaves out


class FSDP2Strategy(ModelParallelStrategy):
    """Fully sharded data parallel (FSDP2, ``fully_shard``) over a ``(replicate, shard)`` device mesh.

    Args:
        shard_size: ranks that share one copy of the weights (the inner mesh dimension; a node's GPUs for HSDP).
            ``"auto"``: all ranks (plain FSDP) when ``replicate_size`` is 1, else world / replicate_size.
        replicate_size: groups holding a full copy each (the outer dimension). ``"auto"``: the number of nodes, which
            is HSDP as VBVR-Pro runs it (shard within a node, all-reduce across nodes); 1 shards over every rank.
        param_dtype: dtype of the gathered parameters in forward/backward (``bfloat16`` for bf16 compute over
            float32 master weights); None keeps the weights' dtype.
        reduce_dtype: dtype of the gradient reduction (``float32`` keeps reductions exact under bf16 compute).
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory (CUDA runs only).
        reshard_after_forward: free each unit's gathered parameters after its forward (ZeRO-3); False keeps them until
            backward (ZeRO-2-like: faster, more memory).
        save_distributed_checkpoint: True writes one shard per rank (``torch.distributed.checkpoint``, a folder);
            False gathers the trained weights into one file on rank 0.
        process_group_backend: the ``torch.distributed`` backend of the process group (``nccl``, ``gloo``, ...);
            None: the device's default (``nccl`` on CUDA, ``gloo`` on CPU).
        timeout: how long a collective may wait for the other ranks before it fails, as ``"h:m:s"`` (e.g.
            ``"1:00:00"``); None: PyTorch's default, 30 minutes.
    """

    def __init__(
        self,
        shard_size: int | Literal["auto"] = "auto",
        replicate_size: int | Literal["auto"] = 1,
        param_dtype: str | None = None,
        reduce_dtype: str | None = None,
        cpu_offload: bool = False,
        reshard_after_forward: bool = True,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
    ):
        for name, dtype in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if dtype is not None and dtype not in DTYPES:
                raise ConfigError(f"FSDP2Strategy {name} must be one of {sorted(DTYPES)} or null, got {dtype!r}")
        if any(size != "auto" and (not isinstance(size, int) or size < 1) for size in (replicate_size, shard_size)):
            raise ConfigError(
                f"FSDP2Strategy needs replicate_size and shard_size >= 1 or 'auto', got "
                f"replicate_size={replicate_size}, shard_size={shard_size!r}"
            )
        kwargs = {"timeout": timeout} if timeout is not None else {}
        super().__init__(  # Lightning's sizes are unused: build_mesh makes the mesh
            data_parallel_size=replicate_size,
            tensor_parallel_size=shard_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            **kwargs,
        )
        self.shard_size = shard_size
        self.replicate_size = replicate_size
        self.mixed_precision = MixedPrecisionPolicy(
            param_dtype=DTYPES.get(param_dtype), reduce_dtype=DTYPES.get(reduce_dtype)
        )
        self.cpu_offload = cpu_offload
        self.reshard_after_forward = reshard_after_forward

    # -------------------------------------------------------------------------------------------------- the mesh
    def setup_environment(self) -> None:
        self._setup_distributed()  # the process group (and the accelerator's device)
        self._device_mesh = self.build_mesh()
        self.lightning_module._device_mesh = self._device_mesh  # read by configure_model

    def build_mesh(self) -> DeviceMesh:
        world = self.world_size
        replicate = self.num_nodes if self.replicate_size == "auto" else self.replicate_size
        shard = world // replicate if self.shard_size == "auto" else self.shard_size
        if shard * replicate != world:
            raise ConfigError(
                f"FSDP2Strategy: replicate_size ({replicate}) x shard_size ({shard}) must equal the number of "
                f"processes ({world} = num_nodes x devices)"
            )
        if self.cpu_offload and self.root_device.type == "cpu":
            raise ConfigError("FSDP2Strategy cpu_offload needs an accelerator (the weights are already in CPU memory)")
        return init_device_mesh(self.root_device.type, (replicate, shard), mesh_dim_names=MESH_DIMS)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Both mesh dimensions are data parallel: every rank draws its own prompts.
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def shard_settings(self) -> dict[str, Any]:
        """Keyword arguments of ``fully_shard`` common to every unit."""
        offload = CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()
        return dict(mesh=self.device_mesh, mp_policy=self.mixed_precision, offload_policy=offload)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Load a lean checkpoint: the tensors it holds go into the sharded model and optimizer, the frozen
        parameters it left out keep the config's base values."""
        path = Path(self.broadcast(checkpoint_path))
        if not _is_sharded_checkpoint(path):  # one gathered file: Lightning's loader, partial by design
            state = {"state_dict": self.model, **{f"optimizer_{i}": o for i, o in enumerate(self.optimizers)}}
            checkpoint = _load_checkpoint(path, state, strict=False, optimizer_states_from_list=True)
            checkpoint.pop(OMITTED, None)
            return checkpoint
        metadata = torch.load(path / METADATA_FILE, weights_only=weights_only)
        omitted = set(metadata.pop(OMITTED, None) or [])
        load_sharded_state(self.model, path, omitted)
        for i, optimizer in enumerate(self.optimizers):
            key = f"optimizer_{i}"
            state = {key: get_optimizer_state_dict(self.model, optimizer)}
            _dcp_load(state, path)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=state[key])
        return metadata


def _dcp_load(state: dict[str, Any], path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load

    with warnings.catch_warnings():  # one process is the intent (export, a one-process resume): torch warns anyway
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        dcp_load(state, storage_reader=FileSystemReader(path), no_dist=not _distributed_is_initialized())


def load_sharded_state(model: nn.Module, path: str | Path, omitted: set[str]) -> None:
    """Load the model tensors of the sharded checkpoint folder ``path`` into ``model`` (sharded or not, any number of
    processes), except the ``omitted`` (frozen) keys, which keep their current values."""
    current = get_model_state_dict(model) if _has_dtensors(model) else model.state_dict()
    state = {key: value for key, value in current.items() if key not in omitted}
    container = {"state_dict": state}
    _dcp_load(container, Path(path))
    if _has_dtensors(model):
        set_model_state_dict(model, container["state_dict"], options=StateDictOptions(strict=False))
    else:
        model.load_state_dict(container["state_dict"], strict=False)


def read_sharded_checkpoint(path: str | Path, model: nn.Module) -> dict[str, Any]:
    """A sharded checkpoint folder as one checkpoint dict (metadata + ``state_dict`` with every key of ``model``'s
    state dict, the omitted frozen ones from ``model``), read in a single process (export)."""
    path = Path(path)
    checkpoint = torch.load(path / METADATA_FILE, weights_only=True)
    omitted = set(checkpoint.get(OMITTED) or [])
    state = {key: value.clone() for key, value in model.state_dict().items() if key not in omitted}
    container = {"state_dict": state}
    _dcp_load(container, path)
    checkpoint["state_dict"] = container["state_dict"]
    return checkpoint


def is_sharded_checkpoint(path: str | Path) -> bool:
    return _is_sharded_checkpoint(Path(path))


# ---------------------------------------------------------------------------------------------- sharding a policy
_RESHARDS_AFTER_FORWARD: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
_GATHERED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # modules inside a ``gathered`` block


def shard_policy(plan: ShardingPlan, settings: dict[str, Any], reshard_after_forward: bool = True) -> LoadReport | None:
    """Apply ``fully_shard`` to the plan's units, then to its roots (``settings``: mesh, mixed precision, offload).
    Roots keep their parameters gathered from forward to backward (FSDP's default for a root). Networks built empty
    (:mod:`app.parallel.loading`) are then given this rank's shards and their checkpoint values; returns what that
    loaded (None when nothing was empty)."""
    for unit in plan.units:
        fully_shard(unit, reshard_after_forward=reshard_after_forward, **settings)
        _RESHARDS_AFTER_FORWARD[unit] = reshard_after_forward
    for root in plan.roots:
        fully_shard(root, reshard_after_forward=False, **settings)
        _RESHARDS_AFTER_FORWARD[root] = False
    report = materialize(plan.roots, _storage_device(settings))  # before FSDP's lazy init, which refuses meta tensors
    if report is not None:
        rank_zero_info(
            f"lean loading: each rank read its own shards of the trained weights from the checkpoint (rank 0: "
            f"{report.tensors} tensors, {report.local_bytes / 1e6:.1f} MB)"
        )
    for root in plan.roots:
        # FSDP makes the first module that runs forward the root of its tree; generation calls the vision tower
        # before the policy's forward, so initialise each root now, as its first forward would.
        root._get_fsdp_state()._lazy_init()
    return report


def _storage_device(settings: dict[str, Any]) -> torch.device:
    """Where ``fully_shard`` keeps the sharded parameters: the CPU under CPU offload, else the mesh's device."""
    device_type = settings["mesh"].device_type
    if isinstance(settings.get("offload_policy"), CPUOffloadPolicy) or device_type == "cpu":
        return torch.device("cpu")
    return torch.device(device_type, torch.get_device_module(device_type).current_device())


def fsdp_modules(module: nn.Module) -> list[FSDPModule]:
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def is_sharded(module: nn.Module) -> bool:
    return any(isinstance(m, FSDPModule) for m in module.modules())


def _has_dtensors(module: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in module.parameters())


@contextlib.contextmanager
def gathered(module: nn.Module) -> Iterator[None]:
    """Inside, every FSDP unit of ``module`` holds its full parameters and keeps them across forwards (one all-gather
    per unit for a whole rollout, not one per generated token or denoising step); on exit every unit is resharded, so
    the next optimizer step updates the parameters the next forward reads. A no-op for unsharded modules and inside
    an enclosing ``gathered`` of the same module (a rollout gathers the policy, and its ``generate`` does too)."""
    units = fsdp_modules(module)
    if not units or module in _GATHERED:  # unsharded, or already gathered by an enclosing call
        yield
        return
    _GATHERED.add(module)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        _GATHERED.discard(module)
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(_RESHARDS_AFTER_FORWARD.get(unit, True), recurse=False)


def local_numel(parameters) -> tuple[int, int]:
    """``(local, full)`` element counts of ``parameters``: what this rank stores and what the model has."""
    local = full = 0
    for p in parameters:
        if isinstance(p, DTensor):
            local += p.to_local().numel()
            full += p.numel()
        else:
            local += p.numel()
            full += p.numel()
    return local, full


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """``value`` gathered if it is a DTensor (a collective: every rank must call it), else itself."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def local_tensor(value: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``value`` if it is a DTensor (no communication; under ``torch.no_grad`` the shard itself,
    so an in-place write reaches the DTensor), else ``value``."""
    return value.to_local() if isinstance(value, DTensor) else value

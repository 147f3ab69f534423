"""Lean loading under FSDP2: every rank builds the trained network empty, shards it, then reads only its own rows.

Without it every process of an FSDP2 run builds the whole model through ``from_pretrained`` before ``fully_shard``
splits it, so a node of G GPUs briefly holds G full copies in host memory. Inside :func:`lean_loading` (the CLI enters
it around instantiation for ``fit``, ``validate``, ``test`` and ``predict`` when the trainer runs
:class:`~app.parallel.FSDP2Strategy` over more than one process) a policy builds its trained network with
:func:`empty_transformers_model` or :func:`empty_diffusers_model` instead:

1. the network is built from its config with every parameter on the meta device (:func:`parameters_on_meta`; tied
   weights stay tied, buffers such as the rotary frequencies no checkpoint holds are computed as usual) and
   remembers where each parameter's tensor is (:class:`DeferredWeights`: a safetensors file and key, after the
   library's own checkpoint-key renaming);
2. parameters created on it afterwards on a real device keep their initial values (:func:`keeping_new_parameters`):
   PEFT draws LoRA adapters on the CPU, then moves them to the meta device of their base layer, so the adapters
   start where a normally loaded policy's would, from the same random draws on every rank;
3. :func:`~app.parallel.fsdp.shard_policy` applies ``fully_shard`` to the empty units and roots, then
   :func:`materialize` gives each root real storage (``to_empty``: this rank's shard only), puts its buffers back and
   copies into every parameter the rows of its checkpoint tensor that this rank holds
   (``safe_open(file).get_slice(key)[start:stop]``; FSDP2 shards dim 0 in ``torch.chunk`` pieces). Each read is a
   memory-mapped slice, so the whole tensor never sits in this process's memory.

Set-up then holds about 1/world of the trained weights per rank plus one tensor's rows in flight. A frozen KL
reference (``enable_reference`` deep-copies the empty network, its record included) loads the same way; the frozen
parts kept whole on every rank (VAE, text encoders) load normally. A checkpoint this cannot read row by row (no
safetensors files, tensors the library converts rather than renames, dtype exceptions) is loaded normally, with a
warning. A network built empty in a run that does not shard it is loaded whole by :func:`materialize` from
``configure_model``. Outside :func:`lean_loading` nothing changes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.overrides import TorchFunctionMode

log = logging.getLogger(__name__)

ATTRIBUTE = "_deferred_weights"  # where an empty network keeps its DeferredWeights (deepcopy carries it along)
TRANSFORMERS_WEIGHTS = "model.safetensors"
DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors"
_requested = False


class LeanLoadingUnsupported(Exception):
    """The checkpoint cannot be read shard by shard; the caller loads it normally."""


@contextlib.contextmanager
def lean_loading(enabled: bool = True) -> Iterator[None]:
    """Inside, policies build their trained network empty and leave the weights to :func:`materialize`."""
    global _requested
    previous, _requested = _requested, bool(enabled)
    try:
        yield
    finally:
        _requested = previous


def lean_loading_requested() -> bool:
    return _requested


@dataclass
class DeferredWeights:
    """Where the tensors of an empty network come from.

    Attributes:
        sources: parameter (or persistent buffer) name in the network -> (safetensors file, checkpoint key).
        initial: values of the parameters made on the network after it was built (LoRA adapters), by name.
    """

    sources: dict[str, tuple[str, str]]
    initial: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class LoadReport:
    """What :func:`materialize` wrote on this rank: tensors, bytes of local storage filled, the largest single read."""

    tensors: int = 0
    local_bytes: int = 0
    largest_read_bytes: int = 0


def deferred(module: nn.Module) -> DeferredWeights | None:
    return vars(module).get(ATTRIBUTE)  # not getattr: PEFT's wrappers forward unknown attributes to the network


def deferred_networks(module: nn.Module) -> list[nn.Module]:
    """The empty networks inside ``module`` (itself included), outermost first."""
    return [m for m in module.modules() if deferred(m) is not None]


# ------------------------------------------------------------------------------------------- building empty networks
def empty_network(
    build: Callable[[], nn.Module], files: Sequence[str | Path], rename: Callable[[nn.Module], Callable[[str], str]]
) -> nn.Module:
    """``build()`` with its parameters on the meta device (buffers real), and the record of where each parameter's
    tensor is in the safetensors ``files`` (``rename(network)`` maps a checkpoint key to a parameter name)."""
    from safetensors import safe_open

    with parameters_on_meta():
        network = build()
    to_name = rename(network)
    sources: dict[str, tuple[str, str]] = {}
    shapes: dict[str, list[int]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                name = to_name(key)
                sources[name] = (str(file), key)
                shapes[name] = list(handle.get_slice(key).get_shape())
    for aliases, tensor in _tensors_by_identity(network, parameters=True):
        found = [a for a in aliases if _bare(a) in sources]
        if not found:
            raise LeanLoadingUnsupported(f"no checkpoint tensor for {aliases[0]} (it would be initialised at random)")
        if shapes[_bare(found[0])] != list(tensor.shape):
            raise ValueError(
                f"checkpoint tensor {sources[_bare(found[0])][1]} has shape {shapes[_bare(found[0])]}, the model's "
                f"{found[0]} {list(tensor.shape)}"
            )
    setattr(network, ATTRIBUTE, DeferredWeights(sources))
    return network


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside, every parameter a module registers is moved to the meta device; buffers stay real. As accelerate's
    ``init_empty_weights(include_buffers=False)``, except that a parameter already on the meta device is registered as
    it is: accelerate wraps it in a new object, so a weight tied while building (``head.weight = embed.weight``, as
    transformers ties an output head to the input embedding) would come out as two parameters."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            moved = type(param)(param.to("meta"), requires_grad=param.requires_grad)
            vars(moved).update(vars(param))  # attributes set on the parameter (transformers' _is_hf_initialized)
            module._parameters[name] = moved

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def safetensors_files(path: str, weights_name: str, subfolder: str = "") -> list[str]:
    """The safetensors files of a checkpoint (a local folder or a hub repository): ``weights_name`` or the shards
    its ``.index.json`` lists."""
    folder = Path(path) / subfolder
    index_name = f"{weights_name}.index.json"
    if Path(path).is_dir():
        if (folder / weights_name).is_file():
            return [str(folder / weights_name)]
        if (folder / index_name).is_file():
            shards = sorted(set(json.loads((folder / index_name).read_text())["weight_map"].values()))
            return [str(folder / shard) for shard in shards]
        raise LeanLoadingUnsupported(f"no {weights_name} (or its index) in {folder}")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    options = dict(subfolder=subfolder or None)
    try:
        return [hf_hub_download(path, weights_name, **options)]
    except EntryNotFoundError:
        pass
    try:
        index = json.loads(Path(hf_hub_download(path, index_name, **options)).read_text())
    except EntryNotFoundError as error:
        raise LeanLoadingUnsupported(f"no {weights_name} (or its index) in {path}/{subfolder}") from error
    return [hf_hub_download(path, shard, **options) for shard in sorted(set(index["weight_map"].values()))]


def empty_transformers_model(model_class: Any, path: str, dtype: torch.dtype | None, **kwargs) -> nn.Module | None:
    """The ``model_class.from_pretrained(path, dtype=dtype, **kwargs)`` model built empty (``from_config``), with its
    generation config; None (with a warning) where its checkpoint cannot be read shard by shard."""
    from transformers import AutoConfig, GenerationConfig

    try:
        files = safetensors_files(path, TRANSFORMERS_WEIGHTS)
        config = AutoConfig.from_pretrained(path)
        build = functools.partial(model_class.from_config, config, dtype=dtype, **kwargs)
        model = empty_network(build, files, _transformers_renaming)
        strict = getattr(model, "_keep_in_fp32_modules_strict", None)
        fp16_kept = getattr(model, "_keep_in_fp32_modules", None) and dtype == torch.float16
        if (strict and dtype in (torch.float16, torch.bfloat16)) or fp16_kept:
            raise LeanLoadingUnsupported("the model keeps some modules in float32")
    except LeanLoadingUnsupported as reason:
        log.warning("lean loading of %s is not possible (%s): every rank loads the whole model", path, reason)
        return None
    # from_pretrained keeps the key conversions its checkpoint used, which save_pretrained reverses
    model._weight_conversions = [t for t in model._weight_conversions if t.was_used()]
    with contextlib.suppress(OSError):  # from_pretrained reads generation_config.json where there is one
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.eval()


def _transformers_renaming(model: nn.Module) -> Callable[[str], str]:
    """Checkpoint key -> parameter name, as ``from_pretrained`` renames (transformers' conversion mapping)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    model._weight_conversions = transforms  # the ones that rename a key are kept, as from_pretrained keeps them
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    empty_state = model.state_dict()

    def rename(key: str) -> str:
        name, converter = rename_source_key(key, renamings, converters, model.base_model_prefix, empty_state)
        if converter is not None:
            raise LeanLoadingUnsupported(f"checkpoint tensor {key} is converted on loading, not only renamed")
        return name

    return rename


def empty_diffusers_model(model_class: Any, path: str, subfolder: str, dtype: torch.dtype | None) -> nn.Module | None:
    """The ``model_class.from_pretrained(path, subfolder=subfolder, torch_dtype=dtype)`` model built empty, with the
    same dtypes (``_keep_in_fp32_modules`` in float32); None (with a warning) where that is not possible."""

    def build() -> nn.Module:
        model = model_class.from_config(model_class.load_config(path, subfolder=subfolder))
        if dtype is not None:
            keep = model_class._keep_in_fp32_modules or []
            keep = [keep] if isinstance(keep, str) else keep
            _cast_floating(model, lambda name: torch.float32 if any(m in name.split(".") for m in keep) else dtype)
        return model

    try:
        model = empty_network(build, safetensors_files(path, DIFFUSERS_WEIGHTS, subfolder), same_names)
    except LeanLoadingUnsupported as reason:
        log.warning("lean loading of %s/%s is not possible (%s): every rank loads it whole", path, subfolder, reason)
        return None
    model.register_to_config(_name_or_path=path)
    return model.eval()


def same_names(model: nn.Module) -> Callable[[str], str]:
    """The renaming of a checkpoint whose keys are the parameter names (diffusers', a ``state_dict`` saved as is)."""
    return lambda key: key


def _cast_floating(model: nn.Module, dtype_of: Callable[[str], torch.dtype]) -> None:
    """Cast the floating parameters and persistent buffers (what a checkpoint holds) as ``from_pretrained`` does."""
    for module_name, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            if param is not None and param.is_floating_point():
                cast = param.to(dtype_of(_join(module_name, name)))
                module._parameters[name] = nn.Parameter(cast, requires_grad=param.requires_grad)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_floating_point() and name not in module._non_persistent_buffers_set:
                module._buffers[name] = buffer.to(dtype_of(_join(module_name, name)))


@contextlib.contextmanager
def keeping_new_parameters(network: nn.Module) -> Iterator[None]:
    """For an empty network: parameters created on a real device inside the block that end up on the meta device in
    ``network`` (PEFT's LoRA adapters) keep their values for :func:`materialize`: the value they had when they were
    moved to the meta device, in the dtype of that move (PEFT casts an adapter to its base layer's dtype there), so
    they match what the normally loaded network holds bit for bit. A no-op for a network that is not empty."""
    record = deferred(network)
    if record is None:
        yield
        return
    created: dict[tuple[int, str], tuple[nn.Module, nn.Parameter]] = {}

    def keep(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            created[(id(module), name)] = (module, param)  # the module too: its id stays unique while kept

    moves = _MovesToMeta(created)
    handle = torch.nn.modules.module.register_module_parameter_registration_hook(keep)
    try:
        with moves:
            yield
    finally:
        handle.remove()
    for module_name, module in network.named_modules():
        for name, param in module.named_parameters(recurse=False):
            module_and_param = created.get((id(module), name))
            if param.is_meta and module_and_param is not None and module_and_param[0] is module:
                made = module_and_param[1]
                record.initial[_join(module_name, name)] = moves.values.get(id(made), made.detach())


class _MovesToMeta(TorchFunctionMode):
    """Records, for the parameters in ``created``, the value of each ``.to()`` that moves one to the meta device."""

    def __init__(self, created: dict[tuple[int, str], tuple[nn.Module, nn.Parameter]]):
        super().__init__()
        self.created = created
        self.values: dict[int, torch.Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.to and isinstance(out, torch.Tensor) and out.is_meta and not args[0].is_meta:
            source = args[0]
            if any(param is source for _, param in self.created.values()):
                self.values[id(source)] = source.detach().to(dtype=out.dtype)
        return out


# ------------------------------------------------------------------------------------------------- materialising
def materialize(modules: Sequence[nn.Module], device: torch.device | str | None = None) -> LoadReport | None:
    """Give the empty networks inside ``modules`` real storage on ``device`` (CPU by default) and their weights.

    ``modules`` are what ``to_empty`` is called on: the FSDP roots once ``fully_shard`` has run (each rank then
    allocates and reads its own shard), or the networks themselves (:func:`deferred_networks`) to load them whole.
    Their buffers and other real tensors keep their values. Returns None when nothing inside was empty; a meta tensor
    inside ``modules`` that no empty network inside them accounts for is an error."""
    networks = list({id(n): n for module in modules for n in deferred_networks(module)}.values())
    if not networks and not any(t.is_meta for m in modules for t in itertools.chain(m.parameters(), m.buffers())):
        return None
    device = torch.device(device or "cpu")
    report = LoadReport()
    pending: dict[tuple[int, str], str] = {}  # (module id, tensor name) of every meta tensor -> its full name
    for module in modules:
        if not any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers())):
            continue
        kept = []
        for module_name, owner in module.named_modules():
            for name, tensor in itertools.chain(owner._parameters.items(), owner._buffers.items()):
                if tensor is None:
                    continue
                if tensor.is_meta:
                    pending[(id(owner), name)] = _join(module_name, name)
                else:  # a real tensor keeps its value (a detached alias of its storage; DTensors a copy)
                    value = tensor.to_local().clone() if isinstance(tensor, DTensor) else tensor.detach()
                    kept.append((owner, name, value))
        ties = _ties(module)
        module.to_empty(device=device)  # a new tensor for each module a tied one belongs to ...
        _retie(ties)  # ... so they are tied again
        with torch.no_grad():
            for owner, name, value in kept:
                _local(getattr(owner, name)).copy_(value)
    for network in networks:
        _fill(network, deferred(network), report, pending)
        delattr(network, ATTRIBUTE)
    if pending:
        raise RuntimeError(
            f"materialize left {len(pending)} tensors without values, e.g. {next(iter(pending.values()))}: they are "
            "in no network built empty inside the modules it was given"
        )
    return report


def _ties(module: nn.Module) -> list[list[tuple[dict, str]]]:
    """The meta tensors inside ``module`` that more than one module holds: for each, its places (the owner's
    ``_parameters`` or ``_buffers``, and the name there)."""
    places: dict[int, list[tuple[dict, str]]] = {}
    for owner in module.modules():
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is not None and tensor.is_meta:
                    places.setdefault(id(tensor), []).append((table, name))
    return [group for group in places.values() if len(group) > 1]


def _retie(ties: list[list[tuple[dict, str]]]) -> None:
    for (first_table, first_name), *rest in ties:
        for table, name in rest:
            table[name] = first_table[first_name]


def _fill(network: nn.Module, record: DeferredWeights, report: LoadReport, pending: dict) -> None:
    """Copy into every parameter (and persistent buffer) of ``network`` the part of its value this rank stores."""

    def reader(name: str) -> Callable[[tuple[slice, ...]], contextlib.AbstractContextManager[torch.Tensor]]:
        if name in record.initial:
            return lambda box: contextlib.nullcontext(record.initial[name][box])
        return functools.partial(_checkpoint_rows, *record.sources[_bare(name)])

    for aliases, tensor, owners in _tensors_by_identity(network, parameters=True, with_owners=True):
        name = next((a for a in aliases if a in record.initial or _bare(a) in record.sources), None)
        if name is None:
            raise RuntimeError(f"no value for {aliases[0]}: neither in the checkpoint nor made after the build")
        _write(tensor, reader(name), report)
        for owner in owners:
            pending.pop(owner, None)
    for aliases, tensor, owners in _tensors_by_identity(network, parameters=False, with_owners=True):
        name = next((a for a in aliases if _bare(a) in record.sources), None)
        if name is not None:  # a persistent buffer the checkpoint holds
            _write(tensor, reader(name), report)
            for owner in owners:
                pending.pop(owner, None)


@contextlib.contextmanager
def _checkpoint_rows(file: str, key: str, box: tuple[slice, ...]) -> Iterator[torch.Tensor]:
    """The ``box`` part of a checkpoint tensor, valid inside. The file is opened for this one read: safetensors maps
    it, and the pages a read touches count in this process's resident memory for as long as the file is open."""
    from safetensors import safe_open

    with safe_open(file, framework="pt") as handle:
        rows = handle.get_slice(key)
        yield rows[box] if rows.get_shape() else handle.get_tensor(key)


def _write(
    tensor: torch.Tensor,
    read: Callable[[tuple[slice, ...]], contextlib.AbstractContextManager[torch.Tensor]],
    report: LoadReport,
) -> None:
    local = _local(tensor)
    box = _local_box(tensor)
    if local.numel() == 0:
        return
    with torch.no_grad(), read(box) as value:
        if tuple(value.shape) != tuple(local.shape):
            raise RuntimeError(f"read {tuple(value.shape)} for a local shard of shape {tuple(local.shape)}")
        local.copy_(value)
        report.largest_read_bytes = max(report.largest_read_bytes, value.numel() * value.element_size())
    report.tensors += 1
    report.local_bytes += local.numel() * local.element_size()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _local_box(tensor: torch.Tensor) -> tuple[slice, ...]:
    """The slices of the full tensor that this rank stores: ``Shard(d)`` splits dim d in ``torch.chunk`` pieces (as
    FSDP2 does, the last ones short or empty), ``Replicate`` keeps it."""
    sizes, starts = list(tensor.shape), [0] * tensor.dim()
    if isinstance(tensor, DTensor):
        coordinate = _coordinate(tensor.device_mesh)
        for mesh_dim, placement in enumerate(tensor.placements):
            if type(placement) is Replicate:
                continue
            if type(placement) is not Shard:
                raise NotImplementedError(f"lean loading reads Shard and Replicate placements, not {placement}")
            dim, pieces = placement.dim, tensor.device_mesh.size(mesh_dim)
            chunk = math.ceil(sizes[dim] / pieces)
            start = min(coordinate[mesh_dim] * chunk, sizes[dim])
            starts[dim] += start
            sizes[dim] = min(chunk, sizes[dim] - start)
        if list(tensor.to_local().shape) != sizes:
            raise NotImplementedError(f"local shard {list(tensor.to_local().shape)} is not the chunk {sizes}")
    return tuple(slice(start, start + size) for start, size in zip(starts, sizes, strict=True))


def _coordinate(mesh) -> list[int]:
    """This process's position in ``mesh``, from its global rank (not ``get_coordinate``: DTensors may share one mesh
    object between equal meshes, and a mesh's coordinate is that of the process that made it)."""
    import torch.distributed as dist

    found = (mesh.mesh == dist.get_rank()).nonzero()
    if len(found) != 1:
        raise RuntimeError(f"rank {dist.get_rank()} is not in the mesh {mesh.mesh.tolist()}")
    return found[0].tolist()


def _tensors_by_identity(network: nn.Module, parameters: bool, with_owners: bool = False) -> list[tuple]:
    """``(names, tensor)`` (``with_owners``: ``(names, tensor, [(module id, name), ...])``) for each distinct
    parameter (or persistent buffer) of ``network``: tied weights once, with every name they go by."""
    found: dict[int, tuple[list[str], torch.Tensor, list[tuple[int, str]]]] = {}
    for module_name, module in network.named_modules(remove_duplicate=False):
        items = module._parameters.items() if parameters else module._buffers.items()
        for name, tensor in items:
            if tensor is None or (not parameters and name in module._non_persistent_buffers_set):
                continue
            entry = found.setdefault(id(tensor), ([], tensor, []))
            entry[0].append(_join(module_name, name))
            entry[2].append((id(module), name))
    return [entry if with_owners else entry[:2] for entry in found.values()]


def _bare(name: str) -> str:
    """A parameter's name in the network as built (PEFT keeps a wrapped layer's own weights under ``base_layer``)."""
    return name.replace(".base_layer.", ".")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name

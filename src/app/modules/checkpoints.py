"""Lean checkpoints: a checkpoint keeps the parameters an optimizer updates (and the buffers of the modules that hold
them) and leaves the rest out.

A LoRA run on SD3.5-medium would otherwise write the frozen transformer, VAE and three text encoders (about 16 GB in
bf16) into every checkpoint, and full fine-tuning its frozen reference copy too. What is left out is what the config
builds again unchanged (the same base checkpoint, frozen from the start): :func:`restore_frozen_parameters` puts the
model's own values back before Lightning loads the state strictly, so resuming (``fit --ckpt_path``) and
``python -m app export`` need the config the run was started with. A parameter that was trained for a while and then
frozen (the VAE after ``vae_train_steps``) stays in the optimizer, so it stays in the checkpoint. A buffer of a frozen
module that training changes (a BatchNorm's running statistics in train mode) would be lost: no policy here has one.

Checkpoints also carry every process's random state, each rank's own (:data:`RANK_STATES`: the global generators'
states, :func:`rng_states`, and a module's own generators), so a resumed run samples what an uninterrupted one would on
every rank. Lightning writes a checkpoint from rank 0 alone, so :func:`gather_rank_states` collects the states of all
ranks first and :func:`saved_rank_state` hands each rank its own back.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from app.parallel.fsdp import OMITTED  # checkpoint key: the names of the parameters left out

log = logging.getLogger(__name__)

RANK_STATES = "rank_states"
"""Checkpoint key: each process's random state (``{"rng": rng_states(), ...}``, a module adds its own generators), a
list indexed by global rank."""


def optimized_parameter_ids(optimizers: Sequence[torch.optim.Optimizer]) -> set[int]:
    return {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}


def fit_optimizers(module) -> list[torch.optim.Optimizer]:
    """The optimizers of the trainer ``module`` is attached to; none outside a trainer."""
    try:
        return list(module.trainer.optimizers)
    except RuntimeError:  # "not attached to a Trainer"
        return []


def omit_frozen_parameters(module: nn.Module, checkpoint: dict, optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Drop from ``checkpoint["state_dict"]`` every parameter no optimizer in ``optimizers`` holds, and the buffers of
    submodules without such a parameter (SD3's positional table, 0.2 G values at SD3.5-medium size, is one), except
    those of a submodule that keeps training state in buffers (``checkpoint_buffers = True``: the policy's moving
    average, :class:`~app.modules.ema.PolicyEMA`).

    Without optimizers (outside fit) nothing is dropped. A key that names a trained parameter under a second name (tied
    weights) stays, so loading cannot overwrite the trained value with a stale one."""
    if not optimizers:
        return
    trained_ids = optimized_parameter_ids(optimizers)
    variables = module.state_dict(keep_vars=True)  # every name of every parameter (tied ones too) and buffer
    trained_owners = {""}  # module names holding a trained parameter somewhere below them, or training state
    trained_owners.update(name for name, sub in module.named_modules() if getattr(sub, "checkpoint_buffers", False))
    for name, value in variables.items():
        if id(value) in trained_ids:
            parts = name.split(".")  # the module names above it, then its own
            trained_owners.update(".".join(parts[:i]) for i in range(len(parts)))
    state = checkpoint["state_dict"]
    frozen = []
    for key, value in variables.items():
        if key not in state or id(value) in trained_ids:
            continue
        owner = key.rpartition(".")[0]
        if isinstance(value, nn.Parameter) or owner not in trained_owners:
            frozen.append(key)
    for key in frozen:
        del state[key]
    checkpoint[OMITTED] = frozen


def restore_frozen_parameters(module: nn.Module, checkpoint: dict) -> None:
    """Put back the parameters a lean checkpoint names as left out, from ``module``'s current values (the config's
    base weights); any other missing key still fails the strict load. Checkpoints without the list are unchanged."""
    omitted = checkpoint.get(OMITTED) or []
    if not omitted:
        return
    current = module.state_dict()
    unknown = [key for key in omitted if key not in current]
    if unknown:
        raise ValueError(
            f"the checkpoint does not match this model: it left out frozen parameters the model does not have "
            f"({unknown[:3]}, {len(unknown)} in all); resume or export it with the config it was trained with"
        )
    state = checkpoint["state_dict"]
    for key in omitted:
        state[key] = current[key]


def rng_states() -> dict:
    """The global generators' states, as plain types and tensors (checkpoints load with ``weights_only=True``)."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    numpy_state = [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached]
    states = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_state}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    name, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy(), position, has_gauss, cached))  # numpy casts the keys back to uint32
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def seed_rng_states(seed: int) -> None:
    """Fresh global generators (torch and every CUDA device, numpy, python), all seeded from ``seed``."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


# ------------------------------------------------------------------------------------------------- per rank
def gather_rank_states(state: Any) -> list:
    """Every process's ``state``, as a list indexed by global rank.

    Under ``torch.distributed`` with several processes this is a collective (``all_gather_object``): call it on every
    rank at once, as Lightning calls ``on_save_checkpoint`` on every rank before rank 0 writes the checkpoint. Otherwise
    it is ``[state]``. ``state`` must be plain data and tensors, so the checkpoint loads with ``weights_only=True``."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed or torch.distributed.get_world_size() == 1:
        return [state]
    states: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return states


def saved_rank_state(checkpoint: dict, rank: int, world_size: int) -> tuple[dict, int | None]:
    """Process ``rank``'s entry of ``checkpoint``'s :data:`RANK_STATES`, and None; or, when the checkpoint holds none
    for it (resumed on more processes than saved), ``({}, seed)``: a seed for fresh states,
    ``derived_seed(fingerprint of rank 0's saved states, rank)``, so distinct on every rank, different for every
    checkpoint and the same on every resume from one, with a warning that this rank's draws do not continue the saved
    run. A checkpoint without random states gives ``({}, None)``: nothing to restore."""
    states = checkpoint.get(RANK_STATES) or []
    if not states:
        return {}, None
    if rank == 0 and len(states) > world_size:
        log.warning(
            "the checkpoint holds the random states of %d processes, this run has %d: those of ranks %d..%d are not "
            "used, so the resumed run draws differently from the saved one",
            len(states),
            world_size,
            world_size,
            len(states) - 1,
        )
    if rank < len(states):
        return states[rank], None
    processes = "process" if len(states) == 1 else "processes"
    log.warning(
        "the checkpoint holds the random states of %d %s, this run has %d: rank %d has none of its own and does not "
        "take rank 0's; it draws from fresh states seeded from the checkpoint and its rank instead (distinct from "
        "every other rank's), so the resumed run samples differently from an uninterrupted one",
        len(states),
        processes,
        world_size,
        rank,
    )
    return {}, derived_seed(_digest(states[0]), rank)


def derived_seed(*parts: Any) -> int:
    """A 63-bit seed that is a deterministic function of ``parts`` (their ``repr``), the same in every process."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _digest(value: Any) -> str:
    """A fingerprint of a saved state (tensors by their bytes), the same in every process that loaded it."""
    found = hashlib.sha256()

    def add(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            found.update(item.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(item, dict):
            for key in sorted(item, key=str):
                found.update(repr(key).encode())
                add(item[key])
        elif isinstance(item, (list, tuple)):
            for part in item:
                add(part)
        else:
            found.update(repr(item).encode())

    add(value)
    return found.hexdigest()

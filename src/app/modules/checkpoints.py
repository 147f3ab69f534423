"""Lean checkpoints: a checkpoint keeps the parameters an optimizer updates (and the buffers of the modules that hold
them) and leaves the rest out.

A LoRA run on SD3.5-medium would otherwise write the frozen transformer, VAE and three text encoders (about 16 GB in
bf16) into every checkpoint, and full fine-tuning its frozen reference copy too. What is left out is what the config
builds again unchanged (the same base checkpoint, frozen from the start): :func:`restore_frozen_parameters` puts the
model's own values back before Lightning loads the state strictly, so resuming (``fit --ckpt_path``) and
``python -m app export`` need the config the run was started with. A parameter that was trained for a while and then
frozen (the VAE after ``vae_train_steps``) stays in the optimizer, so it stays in the checkpoint. A buffer of a frozen
module that training changes (a BatchNorm's running statistics in train mode) would be lost: no policy here has one.

Checkpoints also carry the global random generators' states (:func:`rng_states`), so a resumed run samples what an
uninterrupted one would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from app.parallel.fsdp import OMITTED  # checkpoint key: the names of the parameters left out


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
    submodules without such a parameter (SD3's positional table, 0.2 G values at SD3.5-medium size, is one).

    Without optimizers (outside fit) nothing is dropped. A key that names a trained parameter under a second name (tied
    weights) stays, so loading cannot overwrite the trained value with a stale one."""
    if not optimizers:
        return
    trained_ids = optimized_parameter_ids(optimizers)
    variables = module.state_dict(keep_vars=True)  # every name of every parameter (tied ones too) and buffer
    trained_owners = {""}  # module names holding a trained parameter somewhere below them
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

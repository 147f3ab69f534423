"""What a policy tells the sharding code about its structure: which modules are FSDP units and which are roots.

A policy returns a :class:`ShardingPlan` from ``sharding_plan()``; :func:`app.parallel.fsdp.shard_policy` applies
``fully_shard`` to every unit, then to every root (so a root holds only the parameters no unit holds: embeddings,
output head, final norm). Each root's ``forward`` must be what the training step calls, because FSDP gathers a root's
own parameters in its forward hooks; code that reaches into a root's submodules directly would see sharded tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


@dataclass(frozen=True)
class ShardingPlan:
    """FSDP units of a policy, innermost first.

    Attributes:
        units: modules sharded on their own, each gathered only around its own forward (transformer blocks, the vision
            tower, which ``generate`` calls outside the language model's forward).
        roots: the modules whose forward the policy calls (the policy itself for VLMs, the transformer and its frozen
            reference for flow models); sharded after the units.
        replicated: frozen modules kept whole on every rank (VAE, text encoders), listed so the plan covers the policy.
    """

    units: list[nn.Module]
    roots: list[nn.Module]
    replicated: list[nn.Module] = field(default_factory=list)


def repeated_blocks(module: nn.Module, class_suffixes: tuple[str, ...]) -> list[nn.Module]:
    """The outermost submodules of ``module`` whose class name ends with one of ``class_suffixes`` (a transformer's
    blocks), in order."""
    found: list[tuple[str, nn.Module]] = []
    for name, child in module.named_modules():
        inside_found = any(name.startswith(f"{outer}.") for outer, _ in found)
        if not inside_found and type(child).__name__.endswith(class_suffixes):
            found.append((name, child))
    return [child for _, child in found]

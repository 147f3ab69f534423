"""LoRA ``target_modules`` checked against a model's module names before PEFT injects the adapters.

PEFT reads a string as a regular expression that must match a whole module name (``re.fullmatch``) and a list as names
that a module name equals or ends with (after a dot). It raises only when nothing at all matches, with a long message
that names neither the model nor what it holds, and it ignores a list entry that matches nothing when another one
matches. :func:`check_lora_targets` applies PEFT's rule itself and reports a pattern (or each list entry) that matches
no module, with the model and a few of the linear layers it does have.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from torch import nn

from app.errors import ConfigError

_EXAMPLES = 6  # linear-layer names shown in the error


def matches_target(target: str | Sequence[str], name: str) -> bool:
    """Whether PEFT's ``target_modules=target`` selects the module ``name``."""
    if isinstance(target, str):
        return re.fullmatch(target, name) is not None
    return any(name == t or name.endswith(f".{t}") for t in target)


def check_lora_targets(model: nn.Module, target: str | Sequence[str], model_name: str) -> list[str]:
    """The names of the modules of ``model`` that ``target`` selects; a :class:`~app.errors.ConfigError` naming the
    pattern, ``model_name`` and example layer names when the pattern (or any entry of a list) selects none."""
    names = [name for name, _ in model.named_modules() if name]
    if isinstance(target, str):
        try:
            re.compile(target)
        except re.error as error:
            raise ConfigError(f"LoRA target_modules {target!r} is not a valid regular expression: {error}") from None
        unmatched = [] if any(matches_target(target, n) for n in names) else [target]
    elif not list(target):
        raise ConfigError(f"LoRA target_modules of {model_name} is an empty list: name at least one module")
    else:
        unmatched = [t for t in target if not any(matches_target([t], n) for n in names)]
    if unmatched:
        what = ", ".join(f"'{t}'" for t in unmatched)  # as written (a repr would double a regex's backslashes)
        if isinstance(target, str):
            rule = "the regex must match a whole module name"
        else:
            rule = "each name must be a module's name or its last dotted parts"
        examples = example_layer_names(model, close_to=unmatched[0])
        raise ConfigError(
            f"LoRA target_modules {what} matches no module of {model_name} ({rule}); its linear layers include: "
            f"{', '.join(examples)}"
        )
    return [n for n in names if matches_target(target, n)]


def example_layer_names(model: nn.Module, close_to: str = "", limit: int = _EXAMPLES) -> list[str]:
    """Names of ``limit`` linear layers of ``model``: one per name once layer indices are ignored
    (``...visual.blocks.0.attn.qkv`` stands for every block's), those closest to ``close_to`` first, then taking
    each part of the model (vision blocks, merger, language-model layers, head) in turn."""
    seen, parts = set(), {}
    for name, module in model.named_modules():
        shape = re.sub(r"\.\d+(?=\.|$)", ".N", name)
        if isinstance(module, nn.Linear) and shape not in seen:
            seen.add(shape)
            parts.setdefault(shape.split(".N", 1)[0], []).append(name)
    rounds = max(map(len, parts.values()), default=0)
    in_turn = [names[i] for i in range(rounds) for names in parts.values() if i < len(names)]
    close = difflib.get_close_matches(close_to, in_turn, n=2, cutoff=0.3) if close_to else []
    ordered = close + [n for n in in_turn if n not in close]
    return ordered[:limit] + ([f"... ({len(ordered) - limit} more)"] if len(ordered) > limit else [])

"""Short error messages for ``python -m app``: a configuration or input error is reported as the field, the bad value,
what is accepted and a close match, in a few lines; ``APP_DEBUG=1`` (or ``--debug``) shows the full traceback instead.

jsonargparse reports a bad config as a nested text (``Parser key "model": Does not validate against any of the Union
subtypes ... Errors: - Problem with given class_path ...``), and an exception raised by a constructor arrives wrapped
the same way. :func:`describe_parse_error` and :func:`describe_instantiation_error` reduce these to the innermost
message and the dotted config path that leads to it. The exception a layer raises for a user's mistake,
:class:`~app.errors.ConfigError`, is defined apart (:mod:`app.errors`), so that those layers need none of this.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import re
import traceback
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

DEBUG_ENV = "APP_DEBUG"
DEBUG_HINT = f"{DEBUG_ENV}=1 (or --debug) shows the full error"


def debug_enabled() -> bool:
    """``APP_DEBUG`` is set to anything but empty, ``0``, ``false`` or ``no``."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate (difflib), or ``""``.

    >>> did_you_mean("eps_lowww", ["eps_low", "eps_high", "beta"])
    "; did you mean 'eps_low'?"
    """
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def _nearest_file(path: Path) -> str:
    """``"; did you mean 'x'?"`` for a missing file: the closest name beside it or, with its suffix, in a subfolder
    (recipes sit in ``configs/<purpose>/``, so ``configs/quickstart.yaml`` finds
    ``configs/quickstart/quickstart.yaml``).
    """
    folder = path.parent
    if not folder.is_dir():
        return ""
    candidates = {p.name: p for p in sorted(folder.iterdir())}
    if path.suffix:  # one level down only: a missing file in a large folder (a home) must not walk its tree
        for found in sorted(folder.glob(f"*/*{path.suffix}")):
            candidates.setdefault(found.name, found)
    match = difflib.get_close_matches(path.name, list(candidates), n=1, cutoff=0.6)
    if not match:
        return ""
    found = candidates[match[0]]
    shown = os.path.relpath(found) if found.is_relative_to(Path.cwd()) else str(found)
    return f"; did you mean {shown!r}?"


def _shorten(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _listing(names: list[str], limit: int = 160) -> str:
    """Names joined with commas, cut to about ``limit`` characters with a count of the rest."""
    shown: list[str] = []
    for name in names:
        if shown and len(", ".join([*shown, name])) > limit:
            return f"{', '.join(shown)}, ... ({len(names) - len(shown)} more)"
        shown.append(name)
    return ", ".join(shown)


# ------------------------------------------------------------------------------------------------- parse errors
_NOISE = re.compile(
    r"^(Does not validate against any of the Union subtypes|Subtypes: .*|Errors:|Expected a <class 'NoneType'>.*"
    r"|Given value type: .*|Given value: .*|Expected a path but .* either not accessible or invalid|)$"
)
_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS = re.compile(r"^Problem with given class_path '([^']+)':\s*(.*)$")


@dataclasses.dataclass
class _Leaf:
    message: str
    context: list[tuple[str, str]]  # ("key", name) / ("class", class path), outermost first


def _leaves(message: str) -> list[_Leaf]:
    """The innermost messages of a jsonargparse error text, each with the keys and class paths that enclose it."""
    stack: list[tuple[int, str, str]] = []
    leaves = []
    for raw in message.splitlines():
        stripped = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if stripped.startswith("- "):
            stripped, indent = stripped[2:].strip(), indent + 2
        while stack and stack[-1][0] >= indent:
            stack.pop()
        # "Parser key "a": rest" and "Problem with given class_path 'C': rest" may carry their message on the same line
        while True:
            for kind, pattern in (("key", _KEY), ("class", _CLASS)):
                found = pattern.match(stripped)
                if found:
                    stack.append((indent, kind, found.group(1)))
                    stripped, indent = found.group(2).strip(), indent + 1
                    break
            else:
                break
        given = re.match(r"^Given value: (.*)$", stripped)
        if given:  # a union's members say only what they expected: each gets the value (an Optional's None dropped)
            for leaf in leaves:
                if leaf.message.startswith("Expected a") and "Got value" not in leaf.message:
                    leaf.message += f". Got value: {given.group(1)}"
        if not _NOISE.match(stripped):
            leaves.append(_Leaf(stripped, [(kind, value) for _, kind, value in stack]))
    return leaves


MOVED_MODULES = {
    "app.cli": "app.command_line.commands",
    "app.config_search": "app.command_line.config_search",
    "app.console": "app.command_line.console",
    "app.faults": "app.command_line.faults",
    "app.output_folders": "app.command_line.output_folders",
    "app.embedded": "app.tiny",
    "app.report": "app.run_report",
}
"""Modules that moved (old dotted path -> new), so that a config naming a class by its old path is told the new one."""


def moved_class_path(class_path: str) -> str | None:
    """``class_path`` with its module's new path, for a module of :data:`MOVED_MODULES` (or one inside it); else None.

    >>> moved_class_path("app.faults.PreemptionCheckpoint")
    'app.command_line.faults.PreemptionCheckpoint'
    """
    for old, new in MOVED_MODULES.items():
        if class_path.startswith(old + "."):
            return new + class_path[len(old) :]
    return None


_VLM_LOSS_OPTIONS = (
    "eps_low",
    "eps_high",
    "importance_sampling_level",
    "objective",
    "off_policy_max_log_ratio",
    "off_policy_max_kl",
    "top_entropy_quantile",
)
_FLOW_GRPO_TRAJECTORY = (
    "sde_window",
    "window_stride",
    "window_every_n_steps",
    "ode_tail",
    "ode_tail_steps",
    "step_weighting",
)

MOVED_KEYS: dict[str, dict[str, str | None]] = {
    "app.modules.VLMGRPOModule": {
        **{f"grpo.{name}": f"loss.{name}" for name in _VLM_LOSS_OPTIONS},
        "loss_aggregation": "loss.aggregation",
        "mask_truncated": "loss.mask_truncated",
        "fused_linear_loss": "loss.fused_linear",
        "fused_loss_compiled": "loss.fused_compiled",
    },
    "app.modules.FlowGRPOModule": {
        "grpo.eps_low": "loss.eps_low",
        "grpo.eps_high": "loss.eps_high",
        **{f"grpo.{name}": None for name in _VLM_LOSS_OPTIONS[2:]},
    },
    "app.modules.FlowNFTModule": {
        "sampling.timestep_fraction": "nft.timestep_fraction",
        **{f"sampling.{name}": None for name in _FLOW_GRPO_TRAJECTORY},
        **{f"grpo.{name}": None for name in _VLM_LOSS_OPTIONS},
    },
}
"""Keys of a module's ``init_args`` that moved when each family's settings went to its own blocks (issue 55): the old
dotted path -> the new one, or None where the family has no such option (it held another family's field, which an
older config could leave at its default), so that an older config is told where each key went."""


def moved_key(context: list[tuple[str, str]], name: str) -> str | None:
    """What became of option ``name`` refused at ``context`` (a leaf's keys and classes), for a key of
    :data:`MOVED_KEYS`: ``moved to <new path>``, or that the module has no such option; None for any other option."""
    for index, (kind, value) in enumerate(context):
        if kind != "class" or value not in MOVED_KEYS:
            continue
        keys = [key for key_kind, key in context[index + 1 :] if key_kind == "key"]
        old = ".".join([*keys, name])
        if old not in MOVED_KEYS[value]:
            return None
        new = MOVED_KEYS[value][old]
        if new is None:
            module = value.rpartition(".")[2]
            return f"{module} has no such option: it belongs to another family's settings; drop it"
        return f"moved to {_field(context[: index + 1], new)}"
    return None


def accepted_path(class_path: str, dotted: str) -> bool:
    """Whether the class at ``class_path`` takes ``dotted``: an init argument, or a field of the settings block an
    argument is typed as (``loss.aggregation``)."""
    name, _, field = dotted.partition(".")
    if name not in accepted_arguments(class_path):
        return False
    if not field:
        return True
    block = _dataclass_in(typing.get_type_hints(_import(class_path).__init__).get(name))
    return block is not None and field in {f.name for f in dataclasses.fields(block)}


def closest_class(name: str, names: Iterable[str]) -> str | None:
    """The class name among ``names`` closest to ``name``, judged without the last word of the name when a candidate
    shares it (``Reward``, ``Dataset``): a family's common suffix makes any two of its names look alike.

    >>> closest_class("AccuracyRewrd", ["AccuracyReward", "FormatReward"])
    'AccuracyReward'
    >>> closest_class("NoSuchReward", ["TriSRReward", "FormatReward"]) is None
    True
    """
    tail = re.search(r"[A-Z][a-z0-9]*$", name)
    suffix = tail.group(0) if tail and tail.start() > 0 else ""

    def likeness(candidate: str) -> float:
        if suffix and candidate.endswith(suffix) and len(candidate) > len(suffix):
            return difflib.SequenceMatcher(None, name[: -len(suffix)], candidate[: -len(suffix)]).ratio()
        return difflib.SequenceMatcher(None, name, candidate).ratio()

    scored = [(likeness(candidate), candidate) for candidate in names]
    best = max(scored, default=(0.0, None))
    return best[1] if best[0] >= 0.6 else None


def settings_errors(tree: Any) -> list[Exception]:
    """The error of every settings block (an argument typed as a dataclass, ``grpo: {beta: ...}``) of the classes
    under ``tree`` (a parsed ``class_path`` / ``init_args`` node, or a list of them), each block built alone from its
    plain values: jsonargparse stops at the first bad block, these say whether others are bad too. A block holding a
    nested block is left out (it is not built alone)."""
    if isinstance(tree, (list, tuple)):
        return [error for item in tree for error in settings_errors(item)]
    class_path = tree.get("class_path") if hasattr(tree, "get") else None
    if not isinstance(class_path, str):
        return []
    try:
        hints = typing.get_type_hints(_import(class_path).__init__)
    except Exception:  # a class whose hints cannot be resolved: nothing more to say about it
        return []
    found: list[Exception] = []
    for name, value in _branches(tree.get("init_args")).items():
        block = _dataclass_in(hints.get(name))
        if block is None:
            found += settings_errors(value)
            continue
        fields = _branches(value)
        if fields and not any(hasattr(v, "get") or isinstance(v, (list, tuple)) for v in fields.values()):
            try:
                block(**fields)
            except (ValueError, TypeError) as error:
                found.append(error)
    return found


def _dataclass_in(annotation: Any) -> type | None:
    """The dataclass an argument is typed as (``X``, ``X | None``, ``X | dict``), or None."""
    candidates = typing.get_args(annotation) or (annotation,)
    return next((c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None)


def _branches(node: Any) -> dict[str, Any]:
    """The first-level entries of a config node (a jsonargparse ``Namespace`` or a dict), nested ones unflattened."""
    if isinstance(node, Namespace):
        return {key: value for key, value in vars(node).items() if not key.startswith("__")}
    return dict(node) if isinstance(node, dict) else {}


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def accepted_arguments(class_path: str) -> list[str]:
    """The init arguments jsonargparse accepts for ``class_path`` (empty if it cannot be imported)."""
    from jsonargparse import ArgumentParser

    try:
        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(_import(class_path), fail_untyped=False)
        return list(dict.fromkeys(key.split(".")[0] for key in parser.get_defaults().keys()))
    except Exception:  # a class jsonargparse cannot describe: no list, no suggestion
        return []


def _is_dataclass(class_path: str) -> bool:
    try:
        return dataclasses.is_dataclass(_import(class_path))
    except Exception:
        return False


def _field(context: list[tuple[str, str]], *extra: str) -> str:
    """The dotted config path of a leaf: keys joined, with ``init_args`` after a class (not after a dataclass, which
    configs write as plain fields: ``sampling: {group_size: 8}``)."""
    parts: list[str] = []
    for kind, value in context:
        if kind == "key":
            parts.append(value)
        elif not _is_dataclass(value):
            parts.append("init_args")
    parts += extra
    while parts and parts[-1] == "init_args":
        parts.pop()
    return ".".join(parts)


def _describe_leaf(leaf: _Leaf) -> list[str]:
    """A leaf as ``error: field: message`` plus a suggestion and what is accepted."""
    classes = [value for kind, value in leaf.context if kind == "class"]
    owner = classes[-1] if classes else None
    message = leaf.message
    callable_type = re.match(r"^Type .* expects a function or a callable class: (.*)$", message)
    if callable_type:  # a data set factory / augment hook: the class inside is named in the "Got value" namespace
        message = callable_type.group(1)
        inner = re.search(r"class_path='([^']+)'", message)
        if inner:
            owner = inner.group(1)
            leaf = _Leaf(message, [*leaf.context, ("class", owner)])
        message = re.sub(r"\.? ?Got value: Namespace\(.*$", "", message)

    option = re.search(r"Option '([^']+)' is not accepted", message)
    if option:
        name = option.group(1)
        moved = moved_key(leaf.context, name)
        if moved is not None:
            return [f"error: {_field(leaf.context, name)}: {moved}"]
        accepted = accepted_arguments(owner) if owner else []
        lines = [f"error: {_field(leaf.context, name)}: {message}" + (f" by {owner}" if owner else "")]
        if accepted:
            lines[0] += did_you_mean(name, accepted)
            lines.append(f"  accepted: {_listing(accepted)}")
        return lines

    expected = re.match(r"^Expected an? (.*?)\. Got value: (.*)$", message)
    if expected:
        kind, value = expected.groups()
        kind = re.sub(r"<class '([\w.]+)'>", r"\1", kind)
        literal = re.match(r"^typing\.Literal\[(.*)\]$", kind)
        if literal:
            choices = re.findall(r"'([^']*)'", literal.group(1))
            return [
                f"error: {_field(leaf.context)}: got {value!r}, expected one of {', '.join(choices)}"
                + did_you_mean(value, choices)
            ]
        return [f"error: {_field(leaf.context)}: expected {kind}, got {value!r}"]

    missing_class = re.match(r"^module '([\w.]+)' has no attribute '(\w+)'$", message)
    if missing_class and owner:
        module, name = missing_class.groups()
        try:
            names = [n for n in dir(importlib.import_module(module)) if not n.startswith("_")]
        except Exception:
            names = []
        match = closest_class(name, names)
        hint = f"; did you mean '{module}.{match}'?" if match else ""
        moved = moved_class_path(owner)
        if moved is not None:
            hint = f"; it moved to {moved!r}"
        return [f"error: {_field(leaf.context[:-1])}: unknown class_path {owner!r}: {message}{hint}"]

    subclass = re.match(r"^Import path does not correspond to a subclass of (\w+)$", message)
    if subclass:
        return [f"error: {_field(leaf.context)}: not a subclass of {subclass.group(1)}"]

    return [f"error: {_field(leaf.context) or 'config'}: {_shorten(message, 400)}"]


def describe_parse_error(message: str, options: Iterable[str] = (), command: str | None = "fit") -> str:
    """A few lines for a jsonargparse error ``message``; ``options`` are the command's option strings, for
    suggestions on unrecognised ones."""
    unrecognized = re.match(r"^unrecognized arguments: (.*)$", message.strip())
    required = re.search(r"the following arguments are required: (.*)$", message.strip())
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    missing_file = re.search(r"File does not exist: '([^']*)'", message)
    if required:
        names = [f"--{name.strip().split('.', 1)[-1]}" for name in required.group(1).split(",")]
        lines = [f"error: {command} needs {', '.join(names)}"]
        if "--model" in names:
            lines[0] += " (a recipe gives it: --config configs/X.yaml)"
    elif choice:
        word, choices = choice.group(1), re.findall(r"'([^']*)'", choice.group(2))
        lines = [f"error: unknown command {word!r}{did_you_mean(word, choices)} (commands: {', '.join(choices)})"]
        command = None
    elif missing_file:
        path = Path(missing_file.group(1))
        lines = [f"error: no such file: {path}{_nearest_file(path)}"]
    elif unrecognized:
        options = list(options)
        lines = []
        for token in unrecognized.group(1).split():
            if token.startswith("--"):
                name = token.split("=", 1)[0]
                lines.append(f"error: unknown option {name}{did_you_mean(name, options)}")
        lines = lines or [f"error: {message.strip()}"]
    else:
        leaves = _leaves(message)
        depth = max((len(leaf.context) for leaf in leaves), default=0)
        if depth == 0:  # no key named: the message as one line (a YAML syntax error, a missing command)
            lines = [f"error: {_shorten(' '.join(leaf.message for leaf in leaves) or message, 400)}"]
        else:
            innermost = [leaf for leaf in leaves if len(leaf.context) == depth]
            lines = [line for leaf in innermost for line in _describe_leaf(leaf)][:6]
            keys = [value for kind, value in innermost[0].context if kind == "key"]
            if keys:  # jsonargparse's own words, to search for
                lines.append(f'  (jsonargparse: Parser key "{keys[-1]}")')
    lines.append(f"see: python -m app {command + ' ' if command else ''}--help; {DEBUG_HINT}")
    return "\n".join(lines)


def parse_error_fields(message: str) -> list[str]:
    """The dotted config paths a jsonargparse error ``message`` is about (``model.init_args.eps_lowww``; an
    unrecognised command-line option without its dashes); empty when it names none (a YAML syntax error).

    >>> parse_error_fields("unrecognized arguments: --trainer.max_stepz 3")
    ['trainer.max_stepz']

    A field that is required and missing is named in full, so that an error caused by taking a field out (its class
    path was unknown) is known as such.
    """
    unrecognized = re.match(r"^unrecognized arguments: (.*)$", message.strip())
    if unrecognized:
        return [token[2:].split("=", 1)[0] for token in unrecognized.group(1).split() if token.startswith("--")]
    leaves = _leaves(message)
    depth = max((len(leaf.context) for leaf in leaves), default=0)
    fields = []
    for leaf in leaves:
        if depth and len(leaf.context) == depth:
            option = re.search(r"Option '([^']+)' is not accepted", leaf.message)
            required = re.match(r"^the following arguments are required: (.*)$", leaf.message.strip())
            if option:
                fields.append(_field(leaf.context, option.group(1)))
            elif required:
                fields += [_field(leaf.context, name.strip()) for name in required.group(1).split(",")]
            else:
                fields.append(_field(leaf.context))
    return list(dict.fromkeys(field for field in fields if field))


_NESTED_HELP = re.compile(r"^--(model|data)\.(?:init_args\.)?[\w.]+\.help(?:=.*)?$")


def nested_help_without_class(args: list[str]) -> str | None:
    """The error for ``--model.<arg>.help`` asked before anything names the module (or data module) class.

    jsonargparse knows the nested arguments only once the class is named on the command line, by ``--model CLASS`` or
    ``--model.help CLASS`` before it (a ``--config`` is not enough for a settings block); without it jsonargparse
    reports a puzzling ``--model: expected one argument``. Called only once parsing failed.

    >>> nested_help_without_class(["fit", "--model.sampling.help"]).splitlines()[0]
    'error: --model.sampling.help needs the model class before it: --model.help CLASS --model.sampling.help'
    >>> nested_help_without_class(["fit", "--model.help", "app.modules.VLMGRPOModule", "--model.sampling.help"]) is None
    True
    """
    for index, arg in enumerate(args):
        match = _NESTED_HELP.match(arg)
        if not match:
            continue
        key = match.group(1)
        named = (f"--{key}", f"--{key}.help", f"--{key}.class_path")  # a --config alone does not do for a block
        if any(a.split("=", 1)[0] in named for a in args[:index]):
            return None
        option = arg.split("=", 1)[0]
        if "=" not in arg and index + 1 < len(args) and not args[index + 1].startswith("-"):
            arg = f"{arg} {args[index + 1]}"  # the subclass it asks about
        example = "app.modules.VLMGRPOModule" if key == "model" else "app.data.VisualTaskDataModule"
        return (
            f"error: {option} needs the {key} class before it: --{key}.help CLASS {arg}\n"
            f"  (for example --{key}.help {example} {arg})\n"
            f"see: python -m app fit --help; {DEBUG_HINT}"
        )
    return None


def describe_parse_errors(
    messages: list[str], options: Iterable[str] = (), command: str | None = "fit", max_lines: int = 10
) -> str:
    """:func:`describe_parse_error` of each of several jsonargparse errors, in one text: every error's first line,
    the details (what is accepted) while they fit in ``max_lines``, and the closing ``see:`` line once."""
    options = list(options)
    bodies = []
    for index, message in enumerate(messages):
        body = describe_parse_error(message, options, command).splitlines()[:-1]
        if index:  # jsonargparse's own words only for the first error
            body = [line for line in body if not line.lstrip().startswith("(jsonargparse:")]
        bodies.append(body)
    see = describe_parse_error(messages[0], options, command).splitlines()[-1]
    heads = [line for body in bodies for line in body if line.startswith("error: ")]
    budget = max_lines - len(heads)
    lines = []
    for body in bodies:
        for line in body:
            if line.startswith("error: "):
                lines.append(line)
            elif budget > 0:
                lines.append(line)
                budget -= 1
    return "\n".join([*lines, see])


# ------------------------------------------------------------------------------------------ instantiation errors
def root_cause(error: BaseException) -> BaseException:
    """The innermost exception of ``error``'s chain (``__cause__``, else ``__context__``)."""
    seen = {id(error)}
    while True:
        inner = error.__cause__ or error.__context__
        if inner is None or id(inner) in seen:
            return error
        seen.add(id(inner))
        error = inner


def _rejecting_class(error: BaseException) -> str | None:
    """The class whose constructor raised ``error``: the innermost ``__init__`` / ``__post_init__`` frame."""
    found = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name in ("__init__", "__post_init__") and owner is not None:
            cls = type(owner)
            if not cls.__module__.startswith("jsonargparse"):
                found = f"{cls.__module__}.{cls.__qualname__}"
    return found


def _config_leaves(config: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """``(dotted path, value)`` of every leaf of a jsonargparse ``Namespace`` (or dict) tree."""
    from jsonargparse import Namespace

    for key, value in (config if isinstance(config, dict) else vars(config)).items():
        if isinstance(value, (dict, Namespace)):
            yield from _config_leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def locate_field(config: Any, message: str) -> tuple[str, Any] | None:
    """The config field an error message is most likely about: a leaf whose name is a word of the message, preferring
    one whose value also appears in it."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message))
    candidates = [(path, value) for path, value in _config_leaves(config) if path.rsplit(".", 1)[-1] in words]
    for path, value in candidates:
        if value is not None and str(value) and str(value) in message:
            return path, value
    return candidates[0] if len(candidates) == 1 else None


def describe_instantiation_error(error: BaseException, config: Any = None, command: str = "fit") -> str:
    """A few lines for an exception raised while the config's classes were built."""
    root = root_cause(error)
    message = str(root) or type(root).__name__
    field = locate_field(config, message) if config is not None else None
    head = f"error: {field[0]} = {field[1]!r}: " if field else "error: "
    lines = [head + _shorten(message, 400)]
    owner = _rejecting_class(root)
    kind = type(root).__name__
    lines.append(f"  raised by {owner} ({kind})" if owner else f"  ({kind} while building the config's objects)")
    lines.append(f"see: python -m app {command} --help; {DEBUG_HINT}")
    return "\n".join(lines)

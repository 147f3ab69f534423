"""Every argument a recipe can set has its own help text: what ``python -m app fit --model.help CLASS`` (and
``--data.help``, ``--trainer.strategy.help``, ...) shows comes from the constructor's docstring (Google style:
``Args:``, or ``Attributes:`` for the settings dataclasses), read by jsonargparse through ``docstring_parser``.

The classes are those the YAML files under ``configs/`` and ``tests/fixtures/`` name (``class_path``, inline ones and
lists included), the settings dataclasses and other classes their constructors take, recursively, and the classes
whose ``__init__`` actually receives an argument (a base class reached through ``super().__init__(**kwargs)``). An
abstract base taken as an argument (``rewards: Sequence[RewardComponent]``) is covered by the subclasses the configs
name. The docstrings must also stay renderable by mkdocstrings/griffe, whose strict docs build fails on an ``Args:``
entry that is not a parameter (a grouped entry such as ``weight, name: ...`` is one).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from pathlib import Path

import docstring_parser
import pytest
import yaml
from jsonargparse import ArgumentParser

# jsonargparse's own resolver and docstring reader (not public API): the parameters it shows, each with the function
# that receives it and the help it found, exactly as the CLI builds them
from jsonargparse._optionals import parse_docstring
from jsonargparse._parameter_resolvers import ParamData, get_signature_parameters

from app.command_line.commands import AppCLI

ROOT = Path(__file__).resolve().parents[1]
YAMLS = sorted([*(ROOT / "configs").rglob("*.yaml"), *(ROOT / "tests" / "fixtures").glob("*.yaml")])
OURS = ("app", "callbacks")

# Arguments that jsonargparse resolves out of a ``**kwargs`` which is passed through, unchanged, to a third-party
# constructor: their text would be that library's, not ours to write. None today: RewardComponent names the
# torchmetrics options it passes on (an entry here is ``Class.__init__: "what it is"``).
PASS_THROUGH: dict[object, str] = {}


def _ours(obj: object) -> bool:
    return getattr(obj, "__module__", "").split(".")[0] in OURS


def _load(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def class_paths(node: object) -> typing.Iterator[str]:
    """Every ``class_path`` value in a parsed YAML document, at any depth, in mappings and lists."""
    if isinstance(node, dict):
        if isinstance(node.get("class_path"), str):
            yield node["class_path"]
        for value in node.values():
            yield from class_paths(value)
    elif isinstance(node, list):
        for value in node:
            yield from class_paths(value)


def _classes_in(annotation: object) -> typing.Iterator[type]:
    """Our classes inside a type annotation (``X | None``, ``Sequence[X]``, ``dict[str, X]``, ...)."""
    if inspect.isclass(annotation) and _ours(annotation):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _classes_in(argument)


def _owner(function: typing.Callable) -> type:
    """The class that defines a method (``_TripletReward.__init__`` -> ``_TripletReward``)."""
    owner: object = importlib.import_module(function.__module__)
    for part in function.__qualname__.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner  # type: ignore[return-value]


def parameters(cls: type) -> list[ParamData]:
    """The arguments jsonargparse shows for ``cls``, less those of :data:`PASS_THROUGH`."""
    return [p for p in get_signature_parameters(cls, None) if p.component not in PASS_THROUGH]


def covered_classes() -> dict[str, type]:
    named = set()
    for path in YAMLS:
        for document in yaml.safe_load_all(path.read_text()):
            named.update(class_paths(document))
    todo = [_load(p) for p in sorted(named) if p.split(".")[0] in OURS]  # not lightning's, nor the fixtures' own
    found: dict[str, type] = {}
    while todo:
        cls = todo.pop()
        key = f"{cls.__module__}.{cls.__qualname__}"
        if key in found:
            continue
        found[key] = cls
        for param in get_signature_parameters(cls, None):
            receiver = param.component if inspect.isclass(param.component) else _owner(param.component)
            if _ours(receiver):
                todo.append(receiver)  # the class that documents it: cls itself, or a base reached via **kwargs
            # a settings dataclass or a concrete class taken as an argument; an abstract base is covered by the
            # subclasses that the configs name
            todo.extend(t for t in _classes_in(param.annotation) if not inspect.isabstract(t))
    return dict(sorted(found.items()))


CLASSES = covered_classes()


def test_the_coverage_reaches_modules_settings_rewards_callbacks_and_strategies():
    for name in (
        "app.modules.vlm_grpo.VLMGRPOModule",
        "app.settings.SamplingSettings",
        "app.settings.GRPOSettings",
        "app.settings.LoRASettings",
        "app.rewards.format.FormatReward",
        "app.rewards.base.RewardComponent",  # the receiver of every reward's weight and name
        "app.parallel.fsdp.FSDP2Strategy",
        "app.data.datamodule.VisualTaskDataModule",
        "app.tasks.dots.dots.DotsDataset",  # inline: {class_path: app.tasks.dots.DotsDataset, init_args: {...}}
        "callbacks.completion_table.CompletionTableLogger",
        "app.export.ExportPolicy",
    ):
        assert name in CLASSES
    assert len(CLASSES) > 50


def _own_docs(param: ParamData) -> dict[str, str]:
    """The parameter descriptions of the class that receives ``param`` and of its ``__init__``, without what its base
    classes document (jsonargparse falls back on those, so a missing entry would hide behind the base's text)."""
    receiver = param.component
    sources = [receiver] if inspect.isclass(receiver) else [_owner(receiver), receiver]
    docs = {}
    for source in sources:
        parsed = parse_docstring(source, params=True)
        for entry in parsed.params if parsed else []:
            if entry.description and entry.description.strip():
                docs[entry.arg_name] = entry.description
    return docs


@pytest.mark.parametrize("cls", CLASSES.values(), ids=CLASSES.keys())
def test_every_argument_has_its_own_help(cls):
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "x", fail_untyped=False, sub_configs=True)
    shown = {action.dest: action.help for action in parser._actions}
    problems = []
    for param in parameters(cls):
        receiver = param.component if inspect.isclass(param.component) else _owner(param.component)
        where = f"{cls.__name__}({param.name}) [received by {receiver.__qualname__}]"
        if f"x.{param.name}" not in shown:
            problems.append(f"{where}: jsonargparse shows no argument for it")
        elif not (shown[f"x.{param.name}"] or "").strip():
            problems.append(f"{where}: no help text in --help")
        if not _ours(receiver):
            problems.append(f"{where}: reaches a third-party constructor; document it, or add it to PASS_THROUGH")
        elif param.name not in _own_docs(param):
            problems.append(f"{where}: no '{param.name}:' entry in {receiver.__qualname__}'s docstring")
    assert not problems, "\n".join(problems)


def _entries(obj: object) -> list[docstring_parser.DocstringParam]:
    """Parameter-like entries (``Args:``, ``Attributes:``, ...) of ``obj``'s own docstring, read as Google style."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    return docstring_parser.parse(doc, style=docstring_parser.DocstringStyle.GOOGLE).params if doc else []


@pytest.mark.parametrize("cls", CLASSES.values(), ids=CLASSES.keys())
def test_documented_arguments_are_in_the_signature(cls):
    signature = set(inspect.signature(cls).parameters)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None
    init = cls.__dict__.get("__init__")
    problems = []
    for source in [cls] + ([init] if init is not None else []):
        for entry in _entries(source):
            section, name = entry.args[0], entry.arg_name.lstrip("*")
            if not name.isidentifier():  # "weight, name, kwargs: see ..." documents none of them
                problems.append(f"{source.__qualname__}: '{entry.arg_name}' is not one name: one entry per argument")
            elif section == "param" and name not in signature:
                problems.append(
                    f"{source.__qualname__}: Args entry '{name}' is not in the signature {sorted(signature)}"
                )
            elif section == "attribute" and fields is not None and name not in fields:
                problems.append(f"{source.__qualname__}: Attributes entry '{name}' is not a field {sorted(fields)}")
    assert not problems, "\n".join(problems)


def test_model_help_shows_each_argument_with_its_text(capsys):
    """What a user sees, end to end: ``python -m app fit --model.help app.modules.VLMGRPOModule`` in process."""
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--model.help", "app.modules.VLMGRPOModule"])
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err[-2000:]
    text = " ".join(captured.out.split())  # the formatter wraps lines
    for option, help_text in [
        ("--model.policy POLICY", "the model to train."),
        ("--model.rewards [ITEM,...], --model.rewards+ [ITEM,...]", "reward components, each with its ``weight``"),
        ("--model.sampling SAMPLING", "group size K, temperature, top_p, max_new_tokens"),
        ("--model.loss LOSS", "every option of the loss: clip range (default 0.2 each way), aggregation"),
        ("--model.eval_max_new_tokens EVAL_MAX_NEW_TOKENS", "generation budget for greedy evaluation."),
    ]:
        assert f"{option} {help_text}" in text, f"{option}: expected its help '{help_text}'"


def test_strategy_help_documents_the_process_group(capsys):
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--trainer.strategy.help", "app.parallel.FSDP2Strategy"])
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err[-2000:]
    text = " ".join(captured.out.split())
    assert "--trainer.strategy.process_group_backend PROCESS_GROUP_BACKEND the ``torch.distributed`` backend" in text
    assert "--trainer.strategy.timeout TIMEOUT how long a collective may wait" in text

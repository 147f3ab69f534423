"""MkDocs hook (``hooks:`` in ``mkdocs.yml``): every constructor argument of every class on the API pages has its own
docstring entry, so that ``mkdocs build --strict`` fails on an undocumented argument as it does on a broken link.

A class's own ``__init__`` parameters (or a dataclass's fields) must each be named in the ``Args:`` / ``Attributes:``
section of the class or ``__init__`` docstring; ``*args`` / ``**kwargs`` are exempt, and a class without an ``__init__``
of its own is covered by the base that has it (the base is on the API pages too). ``tests/test_docstrings.py`` checks
the same, and more, through jsonargparse for the classes the configs name.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import re
from pathlib import Path

from docstring_parser import parse

log = logging.getLogger("mkdocs.plugins.app_docstrings")
DIRECTIVE = re.compile(r"^::: *([\w.]+) *$", re.MULTILINE)


def _resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def undocumented(cls: type) -> list[str]:
    """The constructor arguments of ``cls`` that no docstring entry of the class or its ``__init__`` names."""
    if dataclasses.is_dataclass(cls):
        arguments = [f.name for f in dataclasses.fields(cls) if f.init]
    elif "__init__" in cls.__dict__:
        parameters = inspect.signature(cls.__dict__["__init__"]).parameters.values()
        plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        arguments = [p.name for p in parameters if p.kind in plain and p.name != "self"]
    else:
        return []
    documented = set()
    for source in (cls, cls.__dict__.get("__init__")):
        if source is not None and source.__doc__:
            documented |= {param.arg_name.lstrip("*") for param in parse(inspect.cleandoc(source.__doc__)).params}
    return [name for name in arguments if name not in documented]


def on_pre_build(config, **kwargs) -> None:
    api = Path(config["docs_dir"]) / "api"
    for page in sorted(api.glob("*.md")):
        for path in DIRECTIVE.findall(page.read_text()):
            obj = _resolve(path)
            if inspect.isclass(obj):
                for name in undocumented(obj):
                    log.warning(f"{path}: argument '{name}' has no docstring entry (api/{page.name})")

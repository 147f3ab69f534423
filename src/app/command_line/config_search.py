"""Every bad field of a config at once: jsonargparse stops at the first error, so :func:`further_parse_errors` takes
the fields reported so far out of the config files and the command line and parses again, collecting what comes next.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from app.command_line.error_messages import parse_error_fields


def further_parse_errors(parser: Any, given: list[str], message: str, limit: int = 4) -> list[str]:
    """The errors jsonargparse would report after ``message`` for the command line ``given`` to ``parser``: it stops at
    the first bad field, so the arguments are parsed again without each field reported so far (taken out of the config
    files and the command line), until they parse, an error names a field already taken out, or ``limit`` more errors
    are found."""
    args = [a for a in given if a.split("=", 1)[0] not in ("--print_config", "--help", "-h")]
    removed: list[str] = []
    found: list[str] = []
    try:
        while len(found) < limit:
            fields = parse_error_fields(message)
            for field in fields:
                taken = _without_field(args, field)
                if taken is None:
                    return found
                args, prefix = taken
                removed.append(prefix)
            if not fields:
                return found
            try:
                parser.parse_args(args)
                return found
            except argparse.ArgumentError as error:
                message = str(error)
            again = parse_error_fields(message)
            caused = any(_within(f, r) for f in again for r in removed)
            if not again or caused or "does not exist" in message or "not accessible" in message:
                return found  # an error of the taking out itself (a required field), or of a relative path
            found.append(message)
    except Exception:  # collecting more errors is a courtesy: never let it hide the first one
        return found
    return found


def _normal(key: str) -> str:
    """A dotted config key without ``init_args`` (``--model.eps_low`` and ``model.init_args.eps_low`` are one field)
    and without an append ``+``."""
    return ".".join(part for part in key.rstrip("+").split(".") if part != "init_args")


def _within(field: str, key: str) -> bool:
    """``field`` is ``key`` or a field under it."""
    field, key = _normal(field), _normal(key)
    return field == key or field.startswith(key + ".")


def _is_file(value: str) -> bool:
    try:
        return Path(value).is_file()
    except (OSError, ValueError):  # YAML text passed as --config: a name too long, a NUL
        return False


def _delete_key(tree: Any, parts: list[str]) -> bool:
    """Delete the key at ``parts`` from a YAML tree (``init_args`` may be written or left out); whether it was there."""
    if not isinstance(tree, dict) or not parts:
        return False
    head, rest = parts[0], parts[1:]
    if head in tree:
        if not rest:
            del tree[head]
            return True
        if _delete_key(tree[head], rest):
            return True
    if head == "init_args":
        return _delete_key(tree, rest)
    return False


def _without_field(args: list[str], field: str) -> tuple[list[str], str] | None:
    """``args`` without ``field``: taken out of each ``--config`` (passed on as YAML text) and the command line. When
    no source holds the field itself, the nearest key above it that one holds is taken out. Returns the new arguments
    and the key taken out, or None when no source holds any."""
    parts = field.split(".")
    for length in range(len(parts), 0, -1):
        key = _normal(".".join(parts[:length]))
        result, changed, index = [], False, 0
        while index < len(args):
            token = args[index]
            name, inline = (token[2:].split("=", 1)[0], "=" in token) if token.startswith("--") else (None, False)
            takes_value = name is not None and not inline and index + 1 < len(args)
            takes_value = takes_value and not args[index + 1].startswith("--")
            value = args[index + 1] if takes_value else token.split("=", 1)[1] if inline else None
            if name == "config" and value is not None:
                source = Path(value).read_text() if _is_file(value) else value
                tree = yaml.safe_load(source)
                if _delete_key(tree, parts[:length]):
                    result += ["--config", yaml.safe_dump(tree, sort_keys=False)]
                    changed = True
                else:
                    result += ["--config", value]
            elif name is not None and _within(name, key):
                changed = True
            else:
                result.append(token)
                if takes_value:
                    result.append(args[index + 1])
            index += 2 if takes_value else 1
        if changed:
            return result, ".".join(parts[:length])
    return None

"""Task generators to shards: ``python -m app.tasks <generator> --out DIR --num N --seed S`` (deterministic for a seed).

Each generator lives in its own module, which exposes ``register(commands)``: it adds one sub-parser to ``commands``
(the ``argparse`` sub-parsers object) and sets its ``run`` default to a function of the parsed arguments. List a new
generator's module in :data:`GENERATOR_MODULES`.
"""

from __future__ import annotations

import argparse
import importlib

GENERATOR_MODULES = (
    "app.tasks.dots.cli",
    "app.tasks.vbvr.cli",
    "app.tasks.core.cli",
    "app.tasks.reason_rft.cli",
    "app.tasks.spatial.cli",
)
"""Modules with a ``register(commands)`` function, one sub-command each, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.tasks", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="generator", required=True)
    for module in GENERATOR_MODULES:
        importlib.import_module(module).register(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()

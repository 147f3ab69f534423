#!/usr/bin/env bash
# Re-pin the lock files from pyproject.toml (pip-tools). Run after changing a dependency; commit both files.
# The pins are for Linux x86_64 / CPython 3.11 (torch's CUDA build pulls its nvidia-* wheels there).
set -euo pipefail
cd "$(dirname "$0")/.."
export CUSTOM_COMPILE_COMMAND="bash requirements/compile.sh"
flags=(--quiet --strip-extras --no-emit-index-url --no-emit-find-links --resolver=backtracking)
pip-compile "${flags[@]}" -o requirements/main.lock pyproject.toml
pip-compile "${flags[@]}" --extra dev -o requirements/dev.lock pyproject.toml

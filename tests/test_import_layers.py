"""The package's import structure: no import cycles among the modules of ``src/app``, and the layers import downwards.

Imports are read statically from the source (``ast``), wherever they are written: at the top of a module, inside a
function, or under ``if TYPE_CHECKING``, since each is a dependency a reader has to follow. The cycle check is the one
of the team's ``import_cycles.py`` tool: a module depends on the modules it imports (``from a.b import c`` on ``a.b.c``
when that is a module, else on ``a.b``), and a strongly connected component of more than one module is a cycle, except
one that only joins a package with its own submodules (a package ``__init__`` re-exporting its submodules).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

VBVR_SCORING = tuple(
    f"app.tasks.vbvr.{name}" for name in ("core", "draw", "regimes", "registry", "scoring", "validation", "puzzles")
)
"""The VBVR scoring core: the task programs and their classical-CV scorers."""

VBVR_OUTER = ("app.tasks.vbvr.prompts", "app.tasks.vbvr.reward", "app.tasks.vbvr.shards", "app.tasks.vbvr.cli")
"""The modules of :mod:`app.tasks.vbvr` built on its scoring core: the prompts, the reward (on :mod:`app.rewards`), the
shard writer (on :mod:`app.data`) and its command line. With the package's face, these and :data:`VBVR_SCORING` are
all its modules (test_every_vbvr_module_is_placed)."""

_NO_TRAINING_STACK = ("app.data", "app.rewards", "app.modules")

LAYER_RULES = {
    "app.rewards": ("app.tasks", "app.data", "app.modules"),
    "app.data": ("app.tasks", "app.modules", "app.rewards"),
    "app.tasks": ("app.modules",),
    # the models decode and score; the rollouts that drive them are sampling's, the training loop the modules'
    "app.models": ("app.modules", "app.sampling.vlm_rollout", "app.sampling.flow_rollout", "app.sampling.batching"),
    "app.sampling": ("app.modules",),
    **{name: (*_NO_TRAINING_STACK, *VBVR_OUTER) for name in VBVR_SCORING},
    "app.tasks.vbvr.prompts": (*_NO_TRAINING_STACK, "app.tasks.vbvr.reward", "app.tasks.vbvr.cli"),
    "app.formats": ("app",),
    "app.cv": ("app",),
    "app.errors": ("app",),
}
"""Package (or module) -> what none of its modules may import (a package forbids its submodules too)."""

FRONT = "app.command_line"
"""The command line, the top layer: the commands, their error messages, config search, start-up checks, console."""

FRONT_USERS = ("app.__main__", "app.rehearsal", "app.export", "app.rewards.serve")
"""The modules outside :data:`FRONT` that may import it: the entry point and the other commands (``rehearse``;
``export``, whose checkpoint reading and writing is the front's; the reward server's command line, which shortens its
jsonargparse errors with the front's messages). Every other module imports only :class:`app.errors.ConfigError`."""


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(SRC.rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    return modules


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """Each import statement of a module: ``(base, candidates)``; ``base`` is the imported module (``a.b`` for ``from
    a.b import c``), the candidates what it may name, most specific first (``a.b.c``, then ``a.b``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((base, [f"{base}.{alias.name}" for alias in node.names] + [base]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, [alias.name]) for alias in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ``src`` it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, candidates in _imports(name, path):
            for candidate in candidates:
                if candidate in modules and candidate != name:
                    graph[name].add(candidate)
                    break
    return graph


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit); each component sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def is_package_with_its_submodules(component: list[str]) -> bool:
    package = min(component, key=len)
    return all(m == package or m.startswith(package + ".") for m in component)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    return [c for c in strongly_connected_components(graph) if len(c) > 1 and not is_package_with_its_submodules(c)]


def test_the_cycle_finder_finds_cycles_and_ignores_package_reexports():
    graph = {
        "app.a": {"app.b"},
        "app.b": {"app.c"},
        "app.c": {"app.a"},
        "app.p": {"app.p.x"},
        "app.p.x": {"app.p"},
        "app.d": {"app.a"},
    }
    assert import_cycles(graph) == [["app.a", "app.b", "app.c"]]


def test_there_are_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50, "src/app was not found"
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_every_vbvr_module_is_placed():
    """A new module of app.tasks.vbvr is either part of the scoring core (under its rules) or named an outer one."""
    placed = (*VBVR_SCORING, *VBVR_OUTER)
    modules = [name for name in _modules() if _within(name, "app.tasks.vbvr") and name != "app.tasks.vbvr"]
    unplaced = [name for name in modules if not any(_within(name, p) for p in placed)]
    assert not unplaced, f"add to VBVR_SCORING or VBVR_OUTER: {unplaced}"
    missing = [p for p in placed if not any(_within(name, p) for name in modules)]
    assert not missing, f"no such modules: {missing}"


def test_the_vbvr_scoring_rule_catches_scoring_importing_rewards(tmp_path, monkeypatch):
    """The VBVR rules are per module, so check that they bite: scoring importing app.rewards is reported."""
    scoring = tmp_path / "app/tasks/vbvr/scoring.py"
    scoring.parent.mkdir(parents=True)
    scoring.write_text("from app.rewards.base import RewardComponent\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    with pytest.raises(AssertionError, match="app.tasks.vbvr.scoring imports app.rewards.base"):
        test_layers_import_downwards("app.tasks.vbvr.scoring")


def test_only_the_commands_import_the_command_line():
    modules = _modules()
    assert any(_within(name, FRONT) for name in modules), f"no module {FRONT}"
    violations = [
        f"{name} imports {base}"
        for name, path in modules.items()
        if not any(_within(name, p) for p in (FRONT, *FRONT_USERS))
        for base, _ in _imports(name, path)
        if _within(base, FRONT)
    ]
    assert not violations, f"only {', '.join(FRONT_USERS)} may import {FRONT}:\n" + "\n".join(violations)


def test_the_command_line_rule_catches_a_module_importing_it(tmp_path, monkeypatch):
    """The data layer formatting an error with the front's messages is reported."""
    module = tmp_path / "app/data/files.py"
    module.parent.mkdir(parents=True)
    module.write_text("from app.command_line.error_messages import describe_parse_error\n")
    (tmp_path / "app/command_line").mkdir()
    (tmp_path / "app/command_line/error_messages.py").write_text("")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    with pytest.raises(AssertionError, match="app.data.files imports app.command_line.error_messages"):
        test_only_the_commands_import_the_command_line()


@pytest.mark.parametrize("layer", sorted(LAYER_RULES))
def test_layers_import_downwards(layer):
    forbidden = LAYER_RULES[layer]
    modules = _modules()
    assert any(_within(name, layer) for name in modules), f"no module {layer}"
    violations = []
    for name, path in modules.items():
        if not _within(name, layer):
            continue
        for base, _ in _imports(name, path):
            if any(_within(base, f) for f in forbidden):
                violations.append(f"{name} imports {base}")
    assert not violations, f"{layer} must not import {', '.join(forbidden)}:\n" + "\n".join(violations)

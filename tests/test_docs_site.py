"""The documentation site (``mkdocs.yml``, built with ``mkdocs build --strict`` in ``.ci/run``) documents every class a
config can name: the ``class_path`` values of ``configs/`` and of the test fixtures, and every concrete subclass of the
types those values are checked against (rewards, data sets, data modules, modules, callbacks), so that a new reward or
data set cannot ship without an API entry."""

import importlib
import inspect
import os
import re
from pathlib import Path

import lightning as L
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^::: *([\w.]+) *$", re.MULTILINE)


def resolve(path: str):
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:  # a nested name: module.Class.Inner
        return getattr(resolve(module), name)


def class_paths(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["class_path"]} if isinstance(node.get("class_path"), str) else set()
        return found.union(*(class_paths(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(class_paths(v) for v in node))
    return set()


def documented() -> dict[object, str]:
    objects = {}
    for page in sorted(API.glob("*.md")):
        for path in DIRECTIVE.findall(page.read_text()):
            objects[resolve(path)] = f"{page.name}: {path}"
    return objects


def concrete_subclasses(base: type) -> set[type]:
    found, todo = set(), [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            parts = [*sub.__module__.split("."), sub.__name__]
            if parts[0] in ("app", "callbacks") and not any(part.startswith("_") for part in parts):
                found.add(sub)
    # the rehearsal's probe and rewards are added by ``python -m app rehearse``, never named in a config
    return {c for c in found if not c.__module__.startswith("app.rehearsal") and not inspect.isabstract(c)}


def named_in_configs() -> dict[str, type]:
    names = set()
    for path in [*sorted((ROOT / "configs").rglob("*.yaml")), *sorted((ROOT / "tests" / "fixtures").glob("*.yaml"))]:
        names |= class_paths(yaml.safe_load(path.read_text()))
    return {name: resolve(name) for name in sorted(names) if name.split(".")[0] in ("app", "callbacks")}


def test_every_directive_of_the_api_pages_resolves():
    assert len(documented()) >= 50  # resolve() raises on a directive naming nothing


@pytest.mark.parametrize("name", sorted(named_in_configs()))
def test_every_class_a_config_names_has_an_api_entry(name):
    assert resolve(name) in documented(), f"{name} is named in configs/ but no docs/api page has '::: {name}'"


def nameable_classes() -> list[type]:
    import pkgutil

    import app.rewards
    import app.tasks
    import app.tasks.base
    import callbacks

    for package in (app.rewards, app.tasks, callbacks):  # every subclass defined anywhere in them, imported or not
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.endswith(("__main__", ".cli")):
                importlib.import_module(module.name)
    import app.modules

    bases = [app.rewards.RewardComponent, app.tasks.base.SeededDataset, L.LightningDataModule, L.Callback]
    found = set().union(*(concrete_subclasses(b) for b in bases))
    found |= {c for c in concrete_subclasses(L.LightningModule) if c.__name__ in app.modules.__all__}
    internal = {"SplitDataset"}  # Reason-RFT's base of one split, subclassed by the documented suites
    return sorted((c for c in found if c.__name__ not in internal), key=lambda c: f"{c.__module__}.{c.__qualname__}")


@pytest.mark.parametrize("cls", nameable_classes(), ids=lambda c: c.__qualname__)
def test_every_class_a_config_could_name_has_an_api_entry(cls):
    assert cls in documented(), f"{cls.__module__}.{cls.__qualname__} has no '::: ...' entry in docs/api/"


def test_every_page_is_in_the_nav():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def pages(node):
        if isinstance(node, str):
            return {node}
        if isinstance(node, dict):
            return set().union(*(pages(v) for v in node.values()))
        return set().union(*(pages(v) for v in node))

    listed = pages(config["nav"])
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    notebooks = {p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb")}  # docs_notebooks.py
    assert listed == on_disk | notebooks


# a matplotlib figure as nbconvert writes it into the page: an <img> with the PNG inline (tens of kB of base64)
PLOT = re.compile(r'<img [^>]*src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}')
SHOWN = "ot_grpo"  # executed here; the cheapest notebook with a plot (about 8 s in tests/test_notebooks.py)


@pytest.mark.slow
def test_a_built_notebook_page_shows_its_plot(tmp_path, monkeypatch):
    """The site's notebook pages show their outputs, not code only: a strict build with mkdocs.yml's hooks and
    plugins, the Markdown pages left out and every notebook but one rendered without executing it, to keep the
    suite's time (tests/test_notebooks.py runs them all)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    monkeypatch.delenv("APP_DOCS_EXECUTE_NOTEBOOKS", raising=False)  # .ci/run sets it for its own build
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "PYTHONWARNINGS"):
        # tools/docs_notebooks.py sets them for the kernels; monkeypatch puts the old values back afterwards
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    docs, site = tmp_path / "docs", tmp_path / "site"
    docs.mkdir()
    (docs / "index.md").write_text("# Notebooks\n")
    notebooks = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb"))
    config = load_config(
        str(ROOT / "mkdocs.yml"), docs_dir=str(docs), site_dir=str(site), nav=["index.md", *notebooks], strict=True
    )
    jupyter = config.plugins["mkdocs-jupyter"].config
    jupyter["execute_ignore"] = [f"*/{p}" for p in notebooks if not p.endswith(f"/{SHOWN}.ipynb")]
    build(config)

    pages = {p.parent.name: p.read_text() for p in (site / "notebooks").glob("*/index.html")}
    assert set(pages) == {Path(p).stem for p in notebooks}
    assert PLOT.search(pages[SHOWN]), f"notebooks/{SHOWN}/index.html shows no plot: is execute on in mkdocs.yml?"
    # the pages rendered without executing show code only: what the assertion above tells apart
    assert not [name for name, html in pages.items() if name != SHOWN and PLOT.search(html)]

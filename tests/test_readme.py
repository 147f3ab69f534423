"""The README stays a five-minute read whose paths all exist: every ``configs/...`` path and every ``docs/...`` link it
names (and every config path the docs pages name) is a file of the repository."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIG_PATH = re.compile(r"configs/[\w./-]+\.yaml")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 250, "README.md grew past 250 lines: move the depth to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_config_path_named_exists(page):
    # a line that shows the error for a missing file names one on purpose
    text = re.sub(r"\$ python -m app fit --config \S+\nerror: no such file[^\n]*", "", page.read_text())
    missing = sorted({path for path in CONFIG_PATH.findall(text) if not (ROOT / path).is_file()})
    assert not missing, f"{page.name} names configs that do not exist: {missing}"


def test_every_docs_link_of_the_readme_exists():
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README)
    assert links
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"README.md links to missing pages: {missing}"


def test_the_readme_runs_the_quickstart_configs_it_names():
    commands = re.findall(r"python -m app fit --config (configs/\S+\.yaml)", README)
    assert "configs/quickstart/quickstart_sft.yaml" in commands and "configs/quickstart/quickstart.yaml" in commands

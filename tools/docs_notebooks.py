"""MkDocs hook (``hooks:`` in ``mkdocs.yml``): the notebooks of ``notebooks/`` are pages of the site, under
``notebooks/<name>/``, rendered (and executed, with ``execute`` on) by the ``mkdocs-jupyter`` plugin.

The notebooks stay in ``notebooks/``, stored without outputs, where ``tests/test_notebooks.py`` runs them; the hook
adds them to the site's files instead of copying them into ``docs/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
QUIET = "ignore:IProgress not found"  # a PYTHONWARNINGS entry (action:message)


def notebook_files(config: MkDocsConfig, root: Path = ROOT) -> list[File]:
    """One site file per ``notebooks/*.ipynb`` of ``root``, at the same path in the site as in ``root``."""
    # src_dir is the repository root, not docs/: the file's path (and so the page's URL) keeps its notebooks/ folder
    return [
        File(path.relative_to(root).as_posix(), str(root), config.site_dir, config.use_directory_urls)
        for path in sorted((root / "notebooks").glob("*.ipynb"))
    ]


def on_config(config: MkDocsConfig, **kwargs) -> MkDocsConfig:
    # the kernels that execute the notebooks inherit this environment: a notebook that would reach the Hugging Face
    # hub fails the build at once instead of downloading (the notebooks use the embedded tiny models only)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    # the models are tiny: a second OpenMP thread gains nothing and, on a busy machine, spins (as in tests/conftest.py)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # tqdm's warning that a kernel lacks ipywidgets, with the builder's own paths in it, would open every page
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), QUIET]))
    return config


@event_priority(50)  # before mkdocs-jupyter's on_files (priority 0), which makes pages of the .ipynb files it sees
def on_files(files: Files, config: MkDocsConfig, **kwargs) -> Files:
    for file in notebook_files(config):
        files.append(file)
    return files

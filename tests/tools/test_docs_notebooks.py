"""``tools/docs_notebooks.py``: the MkDocs hook that makes pages of ``notebooks/*.ipynb`` (the built pages are checked
in ``tests/test_docs_site.py``)."""

import os

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from tool_scripts import load_tool  # the scripts are not a package

hooks = load_tool("docs_notebooks")


def site_config(tmp_path, **options) -> MkDocsConfig:
    config = MkDocsConfig()
    config.load_dict({"site_name": "t", "docs_dir": str(tmp_path), "site_dir": str(tmp_path / "site"), **options})
    config.validate()
    return config


def test_each_notebook_of_the_folder_is_a_site_file_under_notebooks(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for name in ("b.ipynb", "a.ipynb", "notes.md"):
        (tmp_path / "notebooks" / name).write_text("{}")
    files = hooks.notebook_files(site_config(tmp_path), root=tmp_path)
    assert [f.src_uri for f in files] == ["notebooks/a.ipynb", "notebooks/b.ipynb"]
    assert files[0].abs_src_path == str(tmp_path / "notebooks" / "a.ipynb")


def test_mkdocs_jupyter_makes_pages_of_the_repository_notebooks(tmp_path):
    """The hook's on_files runs before the plugin's, which turns only the .ipynb files it sees into pages."""
    config = site_config(tmp_path, hooks=[str(hooks.ROOT / "tools" / "docs_notebooks.py")], plugins=["mkdocs-jupyter"])
    files = config.plugins.on_files(Files([]), config=config)
    assert {f.src_uri for f in files} == {f"notebooks/{p.name}" for p in (hooks.ROOT / "notebooks").glob("*.ipynb")}
    assert all(f.is_documentation_page() for f in files)
    assert "notebooks/rewards/index.html" in {f.dest_path for f in files}


def test_the_kernels_run_offline_and_without_the_widget_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("PYTHONWARNINGS", "error::ResourceWarning")
    hooks.on_config(site_config(tmp_path))
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["PYTHONWARNINGS"] == f"error::ResourceWarning,{hooks.QUIET}"

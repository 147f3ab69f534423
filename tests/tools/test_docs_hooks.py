"""``tools/docs_hooks.py``: the MkDocs hook that fails the strict docs build on an undocumented constructor argument."""

import dataclasses
import logging

from tool_scripts import load_tool  # the scripts are not a package

hooks = load_tool("docs_hooks")


class Documented:
    """A class.

    Args:
        alpha: the first.
        beta: the second.
    """

    def __init__(self, alpha: int, beta: int = 0, *args, **kwargs):
        pass


class HalfDocumented:
    """A class.

    Args:
        alpha: the first.
    """

    def __init__(self, alpha: int, *, beta: int = 0):
        pass


class InitDocumented:
    """The arguments are in ``__init__``'s docstring."""

    def __init__(self, alpha: int):
        """Build it.

        Args:
            alpha: the first.
        """


class Inherits(HalfDocumented):
    """No ``__init__`` of its own: its base is checked, not it."""


@dataclasses.dataclass
class Settings:
    """Settings.

    Attributes:
        alpha: the first.
    """

    alpha: int = 0
    beta: int = 1
    derived: int = dataclasses.field(default=0, init=False)


def test_a_missing_entry_is_named_and_catch_alls_are_exempt():
    assert hooks.undocumented(Documented) == []
    assert hooks.undocumented(HalfDocumented) == ["beta"]
    assert hooks.undocumented(InitDocumented) == []
    assert hooks.undocumented(Inherits) == []
    assert hooks.undocumented(Settings) == ["beta"]


def test_the_build_hook_warns_for_every_api_page_class(tmp_path, caplog):
    api = tmp_path / "api"
    api.mkdir()
    (api / "page.md").write_text(f"# Page\n\n::: {__name__}.HalfDocumented\n\n::: {__name__}.Documented\n")
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.app_docstrings"):
        hooks.on_pre_build({"docs_dir": str(tmp_path)})
    assert [r.getMessage() for r in caplog.records] == [
        f"{__name__}.HalfDocumented: argument 'beta' has no docstring entry (api/page.md)"
    ]

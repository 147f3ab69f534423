"""docs/algorithms.md names real code, and the package documents itself: no docstring points outside the repository.

Every inline-code span of the page that starts with a dotted name ``app.x.y`` must resolve: the longest importable
module prefix is imported and the rest is looked up with ``getattr``. Sources under ``src/`` must link to the page
(``docs/algorithms.md#<section>``) instead of ``ALGORITHMS.md`` or ``papers/00N``, files a user of the package lacks.
"""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "algorithms.md"
SRC = ROOT / "src"

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_DOTTED = re.compile(r"app(?:\.[A-Za-z_]\w*)+")
_OUTSIDE = re.compile(r"ALGORITHMS\.md|papers/0")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_LINK = re.compile(r"docs/algorithms\.md#([\w-]+)")


def doc_references(text: str) -> list[str]:
    """The dotted ``app.`` names that open an inline-code span, in order of first appearance, without duplicates.

    >>> doc_references("see `app.a.b` and `app.c(x)`, not `python -m app.d` or app.e; ```\\n`app.f`\\n```")
    ['app.a.b', 'app.c']
    """
    text = _FENCE.sub("", text)
    names = []
    for match in _CODE_SPAN.finditer(text):
        name = _DOTTED.match(match.group(2).strip())
        if name and name.group(0) not in names:
            names.append(name.group(0))
    return names


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the page's headings: lowercase, punctuation dropped, spaces to hyphens, ``-1``... on
    repeats.

    >>> sorted(anchors("# Title\\n## GRPO loss\\n### Flow-GRPO SDE step (s = 1)\\n## GRPO loss"))
    ['flow-grpo-sde-step-s--1', 'grpo-loss', 'grpo-loss-1', 'title']
    """
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen.setdefault(f"{slug}-{count}", 1)
    return set(seen)


def resolve(name: str) -> object:
    """The object a dotted name refers to: import the longest importable module prefix, ``getattr`` the rest.

    Raises ``LookupError`` saying which part is missing; an import error inside an existing module propagates.
    """
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # only "this prefix is not a module" moves on to a shorter prefix; a missing dependency is a real failure
            if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
                raise
            continue
        for depth, attribute in enumerate(parts[split:], start=split + 1):
            try:
                obj = getattr(obj, attribute)
            except AttributeError:
                raise LookupError(
                    f"{'.'.join(parts[: depth - 1])} has no attribute {attribute!r} (module {module_name} imported)"
                ) from None
        return obj
    raise LookupError(f"no module {parts[0]!r}")


REFERENCES = doc_references(DOC.read_text(encoding="utf-8")) if DOC.is_file() else []


def test_page_exists_and_names_code():
    assert DOC.is_file(), f"{DOC.relative_to(ROOT)} is missing"
    assert len(REFERENCES) >= 20, f"expected the page to name the implementing functions, found only {REFERENCES}"


@pytest.mark.parametrize("name", REFERENCES)
def test_reference_resolves(name):
    try:
        resolve(name)
    except (LookupError, ImportError) as error:
        pytest.fail(f"docs/algorithms.md names `{name}`, which does not resolve: {error}")


def test_links_into_the_page_have_targets():
    """Every ``docs/algorithms.md#<anchor>`` in the sources and the README names a heading of the page."""
    targets = anchors(DOC.read_text(encoding="utf-8"))
    broken = []
    for path in [ROOT / "README.md", *sorted(SRC.rglob("*.py"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            broken += [f"{path.relative_to(ROOT)}:{number}: #{a}" for a in _LINK.findall(line) if a not in targets]
    assert not broken, "links to missing sections of docs/algorithms.md:\n  " + "\n  ".join(broken)


def test_no_outside_references_in_sources():
    hits = []
    for path in sorted(SRC.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    files = sorted({hit.split(":", 1)[0] for hit in hits})
    assert not hits, (
        f"{len(files)} file(s) under src/ still cite ALGORITHMS.md or papers/0 (files outside the repository); link "
        f"docs/algorithms.md#<section> instead:\n  " + "\n  ".join(files) + "\nlines:\n  " + "\n  ".join(hits)
    )

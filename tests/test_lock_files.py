"""The lock files that the README's commands and CI install from pin every requirement of ``pyproject.toml``, at a
version that the requirement admits, and exactly once. A dependency added to ``pyproject.toml`` without re-running
``bash requirements/compile.sh`` fails here instead of being installed unpinned."""

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def pins(path: Path) -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        if line.startswith((" ", "#", "-")) or not line.strip():
            continue
        match = PIN.match(line)
        assert match, f"{path.name}: not an exact pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"{path.name} pins {name} twice"
        found[name] = Version(match.group(2))
    return found


@pytest.mark.parametrize(
    "lock, requirements",
    [
        ("main.lock", PROJECT["dependencies"]),
        ("dev.lock", PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"]),
    ],
)
def test_every_requirement_is_pinned_within_its_range(lock, requirements):
    pinned = pins(ROOT / "requirements" / lock)
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not pinned in requirements/{lock}: run requirements/compile.sh"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"requirements/{lock} pins {name}=={pinned[name]}, outside {requirement}: run requirements/compile.sh"
        )


def test_the_two_locks_agree_on_shared_packages():
    main, dev = pins(ROOT / "requirements" / "main.lock"), pins(ROOT / "requirements" / "dev.lock")
    assert set(main) <= set(dev)
    assert {name: version for name, version in dev.items() if name in main} == main

"""CLEVR-like scene descriptions for the Reason-RFT counting and transformation suites (Reason-RFT Appendix A.1,
A.3; docs/algorithms.md#papers): the attribute vocabulary, one object's record, and rejection sampling of
non-overlapping layouts.

Decisions where the papers are silent: the vocabulary is CLEVR's (8 colours with their RGB values, cube / sphere /
cylinder, rubber / metal, small 0.35 / large 0.7) plus TRANCE's ``medium`` size (0.5) and two shapes for the domain
shift that read clearly at 128 px, ``cone`` and ``pyramid`` (Super-CLEVR's vehicles need meshes). TRANCE's ``glass``
is left out: a renderer without refraction shows it as pale plastic. World frame: ``x`` to the right and ``y`` away
from the front camera, ``z`` up, lengths in CLEVR units; object centres lie in a disc of radius
:data:`REGION_RADIUS`, so every viewpoint around the vertical axis frames the same region.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

COLORS = {
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
"""CLEVR's eight colours (RGB)."""
SHAPES = ("cube", "sphere", "cylinder")
"""CLEVR's shapes: the in-domain vocabulary."""
NEW_SHAPES = ("cone", "pyramid")
"""Shapes that only domain-shift splits use."""
SIZES = {"small": 0.35, "medium": 0.5, "large": 0.7}
"""Half-extent of an object per size (CLEVR: small / large; TRANCE adds medium)."""
MATERIALS = ("rubber", "metal")
ATTRIBUTES = ("size", "color", "material", "shape")
"""Attribute names, in the order they are written (``"large red metal cube"``)."""
REGION_RADIUS = 3.0
"""Object centres lie in the disc of this radius around the origin."""
BOX_SCALE = 0.8
"""Half side of a cube or a pyramid's base relative to its size, so a cube looks about as big as a sphere."""


@dataclass(frozen=True)
class SceneObject:
    """One object: its attributes, its centre ``(x, y)`` on the ground and its rotation ``yaw`` (degrees)."""

    shape: str
    color: str
    size: str
    material: str
    x: float = 0.0
    y: float = 0.0
    yaw: float = 0.0

    def __post_init__(self) -> None:
        vocabulary = {"shape": SHAPES + NEW_SHAPES, "color": tuple(COLORS), "size": tuple(SIZES), "material": MATERIALS}
        for name, known in vocabulary.items():
            if getattr(self, name) not in known:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; known: {', '.join(known)}")

    @property
    def radius(self) -> float:
        """Radius of the object's footprint on the ground (what placement keeps apart)."""
        r = SIZES[self.size]
        return r * math.sqrt(2) * BOX_SCALE if self.shape in ("cube", "pyramid") else r

    @property
    def height(self) -> float:
        r = SIZES[self.size]
        return (
            2 * r * BOX_SCALE * (1.1 if self.shape == "pyramid" else 1.0)
            if self.shape in ("cube", "pyramid")
            else 2 * r
        )

    def attributes(self) -> dict[str, str]:
        """``{"size": ..., "color": ..., "material": ..., "shape": ...}``."""
        return {name: getattr(self, name) for name in ATTRIBUTES}

    def describe(self) -> str:
        """``"large red metal cube"``."""
        return " ".join(getattr(self, name) for name in ATTRIBUTES)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def fits(obj: SceneObject, others: Sequence[SceneObject], gap: float = 0.15) -> bool:
    """Whether ``obj`` lies inside the region and clear of ``others`` by ``gap``."""
    inside = math.hypot(obj.x, obj.y) <= REGION_RADIUS - obj.radius + 1e-9
    return inside and all(math.hypot(obj.x - o.x, obj.y - o.y) >= obj.radius + o.radius + gap for o in others)


def place(rng: random.Random, obj: SceneObject, others: Sequence[SceneObject], tries: int = 100) -> SceneObject | None:
    """``obj`` moved to a uniform random spot of the region where it :func:`fits` among ``others``, or None."""
    for _ in range(tries):
        rho, phi = (REGION_RADIUS - obj.radius) * math.sqrt(rng.random()), rng.uniform(0, 2 * math.pi)
        moved = dataclasses.replace(obj, x=round(rho * math.cos(phi), 3), y=round(rho * math.sin(phi), 3))
        if fits(moved, others):
            return moved
    return None


def random_object(rng: random.Random, shapes: Sequence[str], sizes: Sequence[str]) -> SceneObject:
    """An object with uniform attributes (from ``shapes`` and ``sizes``), at the origin, with a random yaw."""
    return SceneObject(
        rng.choice(list(shapes)),
        rng.choice(list(COLORS)),
        rng.choice(list(sizes)),
        rng.choice(MATERIALS),
        yaw=round(rng.uniform(0, 90), 1),
    )


def sample_scene(
    rng: random.Random,
    make_objects: Callable[[random.Random], list[SceneObject]],
    accept: Callable[[list[SceneObject]], bool],
    tries: int = 200,
) -> list[SceneObject]:
    """Place the objects of ``make_objects(rng)`` without overlap until ``accept`` takes the scene.

    Raises:
        RuntimeError: when no try in ``tries`` gives an accepted scene (the settings ask for too crowded a scene).
    """
    for _ in range(tries):
        placed: list[SceneObject] = []
        for obj in make_objects(rng):
            moved = place(rng, obj, placed)
            if moved is None:
                break
            placed.append(moved)
        else:
            if accept(placed):
                return placed
    raise RuntimeError(f"no acceptable scene in {tries} tries; use fewer or smaller objects")

"""The procedural annotation source of the CoRe triplets: rendered scenes with the annotations real sources provide.

Paper 002 (section 3.2) builds triplets from data sets that come with metadata. This module stands in for them offline:
it draws a small 3D scene on a ground plane, ray-casts it (:mod:`app.tasks.core.render`) and returns an
:class:`~app.tasks.core.annotations.ImageAnnotation` with every format the metric experts read:

- ``crowd_scene``: people (a box body and a sphere head) with one point per head, the crowd-counting format, among a few
  cubes and balls that are not people;
- ``object_scene``: cubes and balls of distinct categories (``"yellow cube"``, ...); one object may be *queried*: its
  visible mask is the depth region and a red box marks it in the image (red is kept for the marker);
- ``relation_scene``: a subject and a reference object placed so that the subject is ``left``/``right``/``above``/
  ``below`` the reference in the picture, plus distractors.

Every scene also carries the dense depth map, the camera-frame 3D objects and the visible 2D boxes. Objects do not
overlap in the picture (placement rejects overlapping projections), except people behind people with their heads
clear, so every annotated point is visible and every cube or ball is whole. The camera's height and pitch vary a little
between images. All randomness comes from the ``random.Random`` passed in, so a scene is a function of that generator's
state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import ImageDraw

from app.tasks.core.annotations import Box2D, ImageAnnotation, Object3D
from app.tasks.core.metrics import spatial_relation
from app.tasks.core.render import Camera, Primitive, cuboid_box, instance_box, render

COLORS: dict[str, tuple[int, int, int]] = {
    "yellow": (225, 195, 40),
    "blue": (45, 95, 215),
    "green": (55, 160, 70),
    "purple": (140, 70, 175),
    "orange": (235, 125, 35),
    "white": (235, 235, 235),
}
SHAPES = ("cube", "ball")
CATEGORIES = tuple(f"{color} {shape}" for color in COLORS for shape in SHAPES)
"""Object categories of the object and relation scenes; each appears at most once in a scene."""
MARKER = (230, 25, 25)
PERSON = "person"
_CLOTHES = ((70, 80, 120), (120, 60, 60), (60, 110, 90), (110, 100, 70), (90, 90, 90), (150, 110, 60))
_SKIN = ((225, 185, 150), (190, 140, 100), (140, 95, 65))
_PLACE_TRIES = 200


@dataclass(frozen=True)
class SceneConfig:
    """Ranges the scenes draw from (metres unless noted).

    Attributes:
        count_range: people in a crowd scene, inclusive.
        crowd_depth: ground depth range of people.
        object_depth: ground depth range of cubes and balls.
        object_size: edge / diameter range of cubes and balls.
        distractors: number of extra objects, inclusive.
        gap_px: minimum gap between objects' projected boxes, in pixels.
    """

    count_range: tuple[int, int] = (2, 10)
    crowd_depth: tuple[float, float] = (3.0, 10.0)
    object_depth: tuple[float, float] = (2.5, 16.0)
    object_size: tuple[float, float] = (0.5, 1.0)
    distractors: tuple[int, int] = (1, 3)
    gap_px: float = 2.0

    def __post_init__(self) -> None:
        for name in ("count_range", "crowd_depth", "object_depth", "object_size", "distractors"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"SceneConfig.{name} must be (lo, hi) with 0 <= lo <= hi, got {(lo, hi)}")


@dataclass(frozen=True)
class _Object:
    category: str
    center: tuple[float, float, float]  # world frame
    size: tuple[float, float, float]
    parts: tuple[Primitive, ...]
    box: tuple[float, float, float, float]  # projected bounding cuboid, pixels
    head: tuple[float, float, float, float] | None = None  # a person's head, projected


def _make_object(camera: Camera, category: str, x: float, z: float, scale: float, rng: random.Random) -> _Object:
    h = camera.height
    if category == PERSON:
        body, head = 1.25 * scale, 0.3 * scale
        size = (0.45 * scale, body + head, 0.3 * scale)
        parts = (
            Primitive("box", (x, h - body / 2, z), (size[0], body, size[2]), rng.choice(_CLOTHES)),
            Primitive("sphere", (x, h - body - head / 2, z), (head, head, head), rng.choice(_SKIN)),
        )
    else:
        color, shape = category.split()
        size = (scale, scale, scale)
        kind = "box" if shape == "cube" else "sphere"
        parts = (Primitive(kind, (x, h - scale / 2, z), size, COLORS[color]),)
    center = (x, h - size[1] / 2, z)
    head = cuboid_box(camera, parts[1].center, parts[1].size) if category == PERSON else None
    return _Object(category, center, size, parts, cuboid_box(camera, center, size), head)


def _apart(a: tuple[float, ...] | None, b: tuple[float, ...], gap: float) -> bool:
    return a is None or a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def _fits(obj: _Object, placed: list[_Object], camera: Camera, gap: float) -> bool:
    """In the picture, and hiding nothing: boxes are disjoint, except that people may stand behind people as long as
    the farther one's head stays clear of the nearer one (a crowd, every head visible)."""
    if obj.box is None:
        return False
    s = camera.image_size
    if obj.box[0] < 1 or obj.box[1] < 1 or obj.box[2] > s - 1 or obj.box[3] > s - 1:
        return False
    for other in placed:
        if obj.category == other.category == PERSON:
            near, far = (obj, other) if obj.center[2] < other.center[2] else (other, obj)
            if not _apart(far.head, near.box, gap):
                return False
        elif not _apart(obj.box, other.box, gap):
            return False
    return True


def _place(
    rng: random.Random,
    camera: Camera,
    placed: list[_Object],
    category: str,
    depth: tuple[float, float],
    scale: tuple[float, float],
    gap: float,
    column: tuple[float, float] = (0.0, 1.0),
) -> _Object | None:
    """Put ``category`` at a random depth and image column (a fraction of the width) where it overlaps nothing."""
    s = camera.image_size
    for _ in range(_PLACE_TRIES):
        z, size = rng.uniform(*depth), rng.uniform(*scale)
        height = size * (1.55 if category == PERSON else 1.0)
        x = camera.world_x(rng.uniform(*column) * s, z, camera.height - height / 2)
        obj = _make_object(camera, category, x, z, size, rng)
        if _fits(obj, placed, camera, gap):
            return obj
    return None


def _camera(rng: random.Random, image_size: int) -> Camera:
    return Camera(image_size=image_size, height=rng.uniform(1.4, 1.8), pitch_deg=rng.uniform(9.0, 15.0))


def _annotate(camera: Camera, objects: list[_Object], query: int | None = None) -> ImageAnnotation:
    """Render ``objects`` and read every annotation off the render; ``query`` indexes the queried object."""
    parts = [(k, part) for k, obj in enumerate(objects) for part in obj.parts]
    shadows = [(o.center[0], o.center[2], 0.6 * max(o.size[0], o.size[2])) for o in objects]
    view = render(camera, parts, shadows)
    objects3d = [Object3D(o.category, tuple(float(v) for v in camera.to_camera(o.center)), o.size) for o in objects]
    boxes = [Box2D(o.category, tuple(instance_box(view.instances, k))) for k, o in enumerate(objects)]
    points = [tuple(float(v) for v in camera.project(o.parts[1].center)) for o in objects if o.category == PERSON]
    annotation = ImageAnnotation(view.image, points, view.depth, None, objects3d, boxes)
    if query is not None:
        annotation.region = view.instances == query
        x0, y0, x1, y1 = boxes[query].box
        width = max(1, camera.image_size // 96)
        ImageDraw.Draw(annotation.image).rectangle((x0 - 2, y0 - 2, x1 + 1, y1 + 1), outline=MARKER, width=width)
    return annotation


def _with_distractors(
    rng: random.Random, camera: Camera, placed: list[_Object], config: SceneConfig, exclude: set[str], people: bool
) -> list[_Object]:
    pool = [c for c in CATEGORIES if c not in exclude]
    for category in rng.sample(pool, rng.randint(*config.distractors)):
        depth, scale = (config.crowd_depth, (0.35, 0.6)) if people else (config.object_depth, config.object_size)
        if (obj := _place(rng, camera, placed, category, depth, scale, config.gap_px)) is not None:
            placed.append(obj)  # a distractor that does not fit is left out: it carries no label
    return placed


def crowd_scene(
    rng: random.Random, image_size: int, count: int, config: SceneConfig = SceneConfig()
) -> ImageAnnotation:
    """``count`` people (one head point each) and a few cubes and balls that are not people."""
    for _ in range(20):
        camera, placed = _camera(rng, image_size), []
        for _ in range(count):
            person = _place(rng, camera, placed, PERSON, config.crowd_depth, (0.9, 1.1), config.gap_px)
            if person is None:
                break
            placed.append(person)
        else:
            return _annotate(camera, _with_distractors(rng, camera, placed, config, set(), people=True))
    raise ValueError(f"cannot place {count} people in a {image_size} px image; lower count_range or raise image_size")


def object_scene(
    rng: random.Random,
    image_size: int,
    target: str | None = None,
    query: bool = False,
    config: SceneConfig = SceneConfig(),
) -> ImageAnnotation:
    """Cubes and balls of distinct categories, ``target`` (a category) among them; with ``query`` the target (or, when
    ``target`` is None, a random object) is the queried region and is boxed in red."""
    camera = _camera(rng, image_size)
    category = target if target is not None else rng.choice(CATEGORIES)
    first = _place(rng, camera, [], category, config.object_depth, config.object_size, config.gap_px)
    if first is None:
        raise ValueError(f"cannot place a {category} in a {image_size} px image with depths {config.object_depth}")
    placed = _with_distractors(rng, camera, [first], config, {category}, people=False)
    order = list(range(len(placed)))
    rng.shuffle(order)  # the queried / target object is not always drawn first
    placed = [placed[k] for k in order]
    return _annotate(camera, placed, order.index(0) if query else None)


def relation_scene(
    rng: random.Random,
    image_size: int,
    subject: str,
    reference: str,
    relation: str,
    config: SceneConfig = SceneConfig(),
) -> ImageAnnotation:
    """``subject`` ``relation`` (left / right / above / below) ``reference`` in the picture, plus distractors.

    Aims for the relation with the projected boxes; the visible boxes of the render are what the annotation keeps, so
    the relation expert, not this placement, is the ground truth.
    """
    camera = _camera(rng, image_size)
    lo, hi = config.object_depth
    for _ in range(_PLACE_TRIES):
        if relation in ("left", "right"):
            depth = rng.uniform(lo, min(hi, lo + 6.0))
            ref = _place(rng, camera, [], reference, (depth, depth), config.object_size, config.gap_px, (0.15, 0.85))
            sub_depth = (depth * 0.85, depth * 1.15)
            sub = ref and _place(rng, camera, [ref], subject, sub_depth, config.object_size, config.gap_px)
        else:
            near, far = (lo, lo + 0.25 * (hi - lo)), (lo + 0.5 * (hi - lo), hi)
            column = rng.uniform(0.2, 0.8)
            ref_depth, sub_depth = (far, near) if relation == "below" else (near, far)
            ref = _place(rng, camera, [], reference, ref_depth, config.object_size, config.gap_px, (column, column))
            span = (column - 0.04, column + 0.04)
            sub = ref and _place(rng, camera, [ref], subject, sub_depth, config.object_size, config.gap_px, span)
        if (
            sub
            and spatial_relation([Box2D(subject, sub.box), Box2D(reference, ref.box)], subject, reference) == relation
        ):
            placed = _with_distractors(rng, camera, [sub, ref], config, {subject, reference}, people=False)
            return _annotate(camera, placed)
    raise ValueError(f"cannot place a {subject} {relation} a {reference} in a {image_size} px image")

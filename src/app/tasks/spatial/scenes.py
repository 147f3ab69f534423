"""Procedural 3D scenes with known boxes: an offline stand-in for Omni3D's SUN RGB-D (indoor) and KITTI (outdoor).

Papers/000 (Appendix D.1) takes images and 3D boxes from Omni3D; this module samples scenes of the same two kinds so
the whole pipeline runs without a download. A scene is a level camera frame (y down, the floor or road at
``y = camera_height``) holding cuboid objects that stand on the ground with a random yaw; the camera looks down by
``pitch``. Object sizes follow real ones (:data:`CATEGORIES`) with +-15 % jitter, and depth ranges follow Appendix D.1
(indoor 1-9 m, outdoor 4-30 m). :mod:`app.tasks.spatial.render` draws a scene and writes its Omni3D-style record.

Departures: objects are single cuboids with one colour per category; footprints never overlap (a circle test), so the
painter's algorithm over faces draws occlusions correctly.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from app.tasks.spatial.geometry import box_corners, project

DOMAINS = ("indoor", "outdoor")


@dataclass(frozen=True)
class CategorySpec:
    """A kind of object: mean size ``[w, h, l]`` in metres, colour, and where it stands (``"floor"``, ``"lane"``,
    ``"sidewalk"`` or ``"roadside"``)."""

    name: str
    dimensions: tuple[float, float, float]
    color: tuple[int, int, int]
    placement: str


CATEGORIES: dict[str, tuple[CategorySpec, ...]] = {
    "indoor": (
        CategorySpec("chair", (0.5, 0.9, 0.5), (196, 112, 52), "floor"),
        CategorySpec("table", (1.2, 0.75, 0.8), (120, 78, 46), "floor"),
        CategorySpec("sofa", (2.0, 0.85, 0.9), (64, 132, 122), "floor"),
        CategorySpec("lamp", (0.35, 1.6, 0.35), (236, 226, 200), "floor"),
        CategorySpec("bed", (1.6, 0.6, 2.1), (150, 150, 196), "floor"),
    ),
    "outdoor": (
        CategorySpec("car", (1.8, 1.5, 4.3), (96, 104, 126), "lane"),
        CategorySpec("truck", (2.5, 3.2, 8.0), (212, 212, 218), "lane"),
        CategorySpec("pedestrian", (0.6, 1.75, 0.6), (104, 64, 52), "sidewalk"),
        CategorySpec("cyclist", (0.6, 1.7, 1.8), (226, 128, 40), "sidewalk"),
        CategorySpec("tree", (1.4, 4.5, 1.4), (44, 104, 48), "roadside"),
    ),
}
"""Per domain, the object categories of its scenes (colours avoid the marker colours' hues)."""

_SIZE_JITTER = 0.15
_MAX_PLACEMENT_TRIES = 60


@dataclass
class Camera:
    """A pinhole camera: intrinsics, image size, height above the ground and downward pitch (radians)."""

    K: np.ndarray
    width: int
    height: int
    camera_height: float
    pitch: float

    @property
    def level_to_camera(self) -> np.ndarray:
        """``[3, 3]`` rotation from the level frame (gravity along +y) to the camera frame."""
        return rotation_x(self.pitch)


@dataclass
class SceneObject:
    """An object of a scene: category, colour and 3D box, in the level frame (yaw about the vertical y axis)."""

    category: str
    center: np.ndarray
    dimensions: tuple[float, float, float]
    yaw: float
    color: tuple[int, int, int]


@dataclass
class Scene:
    """A sampled scene: its domain, camera, objects and the layout the background needs.

    ``layout`` holds, indoor: ``room_width``, ``room_depth``, ``room_height``; outdoor: ``road_half_width``.
    ``palette`` holds the background colours.
    """

    domain: str
    camera: Camera
    objects: list[SceneObject]
    layout: dict[str, float] = field(default_factory=dict)
    palette: dict[str, tuple[int, int, int]] = field(default_factory=dict)


def rotation_x(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def rotation_y(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def to_camera(scene: Scene, obj: SceneObject) -> tuple[np.ndarray, np.ndarray]:
    """An object's centre ``[3]`` and rotation ``[3, 3]`` in the camera frame (Omni3D's ``center_cam``, ``R_cam``)."""
    level_to_camera = scene.camera.level_to_camera
    return level_to_camera @ obj.center, level_to_camera @ rotation_y(obj.yaw)


def _camera(rng: random.Random, domain: str, image_size: int) -> Camera:
    hfov = math.radians(rng.uniform(60, 72) if domain == "indoor" else rng.uniform(50, 65))
    focal = image_size / 2 / math.tan(hfov / 2)
    K = np.array([[focal, 0.0, image_size / 2], [0.0, focal, image_size / 2], [0.0, 0.0, 1.0]])
    if domain == "indoor":
        return Camera(K, image_size, image_size, rng.uniform(1.2, 1.6), math.radians(rng.uniform(10, 22)))
    return Camera(K, image_size, image_size, rng.uniform(1.5, 1.8), math.radians(rng.uniform(4, 10)))


def _layout(rng: random.Random, domain: str) -> tuple[dict[str, float], dict[str, tuple[int, int, int]]]:
    if domain == "indoor":
        layout = {"room_width": rng.uniform(5.0, 8.0), "room_depth": rng.uniform(6.0, 9.0), "room_height": 2.8}
        floor = rng.choice([(168, 140, 108), (150, 120, 92), (176, 168, 150), (128, 112, 100)])
        wall = rng.choice([(214, 208, 196), (200, 206, 210), (218, 204, 186), (190, 196, 184)])
        return layout, {"floor": floor, "wall": wall, "ceiling": (236, 234, 228)}
    layout = {"road_half_width": rng.uniform(3.5, 6.5)}
    return layout, {"road": (92, 92, 96), "sidewalk": (170, 168, 162), "grass": (112, 140, 84), "sky": (150, 190, 228)}


def _position(rng: random.Random, spec: CategorySpec, scene: Scene, radius: float) -> tuple[float, float]:
    """A footprint centre ``(x, z)`` for ``spec`` in ``scene`` (not yet checked against the view or other objects)."""
    if scene.domain == "indoor":
        half_width = scene.layout["room_width"] / 2 - radius
        z = rng.uniform(1.6, scene.layout["room_depth"] - radius)
        return rng.uniform(-half_width, half_width), z
    road = scene.layout["road_half_width"]
    if spec.placement == "lane":
        return rng.uniform(-road + 1.2, road - 1.2), rng.uniform(5.0, 28.0)
    if spec.placement == "sidewalk":
        side = rng.choice((-1.0, 1.0))
        return side * rng.uniform(max(0.5, road - 1.5), road + 2.5), rng.uniform(4.0, 16.0)
    side = rng.choice((-1.0, 1.0))
    return side * rng.uniform(road + 2.5, road + 7.0), rng.uniform(6.0, 30.0)


def _yaw(rng: random.Random, spec: CategorySpec) -> float:
    if spec.placement == "lane":  # vehicles follow the road, some parked askew
        return rng.choice((0.0, math.pi)) + rng.gauss(0.0, 0.12)
    if spec.placement == "sidewalk":
        return rng.choice((0.0, math.pi / 2, math.pi, -math.pi / 2)) + rng.gauss(0.0, 0.3)
    return rng.uniform(-math.pi, math.pi)


def _in_view(scene: Scene, obj: SceneObject, margin: float) -> bool:
    """The whole box is at least 0.3 m in front of the camera and its centre projects inside the image."""
    center, rotation = to_camera(scene, obj)
    if box_corners(center, obj.dimensions, rotation)[:, 2].min() < 0.3:
        return False
    u, v = project(center[None], scene.camera.K)[0]
    cam = scene.camera
    return margin * cam.width <= u <= (1 - margin) * cam.width and 0 <= v <= cam.height


def _place(rng: random.Random, spec: CategorySpec, scene: Scene, placed: list[tuple[float, float, float]]) -> bool:
    """Try to add one object of ``spec`` to ``scene`` without overlapping footprints; False when no spot was found."""
    for _ in range(_MAX_PLACEMENT_TRIES):
        w, h, length = (d * rng.uniform(1 - _SIZE_JITTER, 1 + _SIZE_JITTER) for d in spec.dimensions)
        radius = math.hypot(w, length) / 2
        x, z = _position(rng, spec, scene, radius)
        if any(math.hypot(x - px, z - pz) < radius + pr + 0.15 for px, pz, pr in placed):
            continue
        center = np.array([x, scene.camera.camera_height - h / 2, z])
        obj = SceneObject(spec.name, center, (w, h, length), _yaw(rng, spec), spec.color)
        if _in_view(scene, obj, margin=0.02):
            scene.objects.append(obj)
            placed.append((x, z, radius))
            return True
    return False


def sample_scene(
    rng: random.Random,
    domain: str = "indoor",
    image_size: int = 256,
    num_objects: tuple[int, int] = (3, 6),
    required: tuple[str, int] | None = None,
) -> Scene:
    """A random scene of ``domain``.

    Args:
        rng: the only source of randomness.
        domain: ``"indoor"`` (room with floor and walls) or ``"outdoor"`` (road, sidewalks, sky).
        image_size: side of the square image in pixels.
        num_objects: inclusive range of the number of objects (besides the required ones); fewer when the scene is
            full.
        required: ``(category, n)``: exactly ``n`` objects of ``category`` (for counting); the others are then drawn
            from the remaining categories. Fewer are placed if the scene has no room; callers check.
    """
    if domain not in CATEGORIES:
        raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")
    specs = {spec.name: spec for spec in CATEGORIES[domain]}
    if required is not None and required[0] not in specs:
        raise ValueError(f"category {required[0]!r} is not in the {domain} domain; expected one of {sorted(specs)}")
    layout, palette = _layout(rng, domain)
    scene = Scene(domain, _camera(rng, domain, image_size), [], layout, palette)
    placed: list[tuple[float, float, float]] = []
    if required is not None:
        for _ in range(required[1]):
            _place(rng, specs[required[0]], scene, placed)
    others = [spec for name, spec in specs.items() if required is None or name != required[0]]
    for _ in range(rng.randint(*num_objects)):
        _place(rng, rng.choice(others), scene, placed)
    return scene

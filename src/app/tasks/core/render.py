"""A tiny ray caster for the CoRe procedural scenes: a pinhole camera over a ground plane, boxes and spheres.

Every pixel's ray is intersected analytically with each primitive and the nearest hit wins (a z-buffer), so the
RGB image, the dense depth map and the instance map come from one pass and agree by construction.

Frames (metres): the *world* frame has the camera at the origin, X right, Y down, Z forward (horizontal); the ground is
the plane ``Y = camera.height``. The *camera* frame (OpenCV: x right, y down, z along the optical axis) is the world
frame pitched down by ``camera.pitch_deg``. Depth is the camera-frame z of the visible surface (the convention of
depth data sets such as NYU and KITTI), capped at ``max_depth`` (sky and the far ground read ``max_depth``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

SKY_TOP = np.array([150.0, 185.0, 230.0])
SKY_HORIZON = np.array([215.0, 228.0, 240.0])
GROUND_TILES = (np.array([178.0, 170.0, 150.0]), np.array([150.0, 143.0, 125.0]))
_LIGHT = np.array([-0.45, -0.8, -0.4]) / np.linalg.norm([-0.45, -0.8, -0.4])  # towards the light: up, left, behind
_AMBIENT = 0.45


@dataclass(frozen=True)
class Camera:
    """A pinhole camera ``height`` metres above the ground, pitched down by ``pitch_deg``; square images."""

    image_size: int = 128
    fov_deg: float = 60.0
    height: float = 1.6
    pitch_deg: float = 12.0

    @property
    def focal(self) -> float:
        """Focal length in pixels."""
        return self.image_size / 2 / math.tan(math.radians(self.fov_deg) / 2)

    @property
    def rotation(self) -> np.ndarray:
        """``[3, 3]`` world-from-camera rotation (its columns are the camera axes in world coordinates)."""
        c, s = math.cos(math.radians(self.pitch_deg)), math.sin(math.radians(self.pitch_deg))
        return np.array([[1.0, 0.0, 0.0], [0.0, c, s], [0.0, -s, c]])

    def to_camera(self, point: np.ndarray) -> np.ndarray:
        """World point(s) ``[..., 3]`` in the camera frame."""
        return np.asarray(point, dtype=float) @ self.rotation

    def project(self, point: np.ndarray) -> np.ndarray:
        """Pixel coordinates ``[..., 2]`` (x right, y down; pixel centres at half-integers) of world point(s)."""
        p = self.to_camera(point)
        c = self.image_size / 2
        return np.stack([c + self.focal * p[..., 0] / p[..., 2], c + self.focal * p[..., 1] / p[..., 2]], axis=-1)

    def world_x(self, u: float, z: float, y: float) -> float:
        """The world X that puts a point at world depth ``z`` and height ``y`` on image column ``u``."""
        rot = self.rotation
        depth = rot[1, 2] * y + rot[2, 2] * z  # camera-frame z of (X, y, z), independent of X
        return (u - self.image_size / 2) * depth / self.focal

    def rays(self) -> np.ndarray:
        """``[S, S, 3]`` world directions through the pixel centres, scaled so that their camera-frame z is 1."""
        s = self.image_size
        grid = (np.arange(s) + 0.5 - s / 2) / self.focal
        xs, ys = np.meshgrid(grid, grid)
        return np.stack([xs, ys, np.ones_like(xs)], axis=-1) @ self.rotation.T


@dataclass(frozen=True)
class Primitive:
    """An axis-aligned box (``shape="box"``, ``size`` = full extents) or a sphere (``size[0]`` = diameter)."""

    shape: str
    center: tuple[float, float, float]
    size: tuple[float, float, float]
    color: tuple[int, int, int]

    def intersect(self, rays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ray parameter ``t`` of the first hit (``inf`` on a miss) ``[S, S]`` and the unit normal ``[S, S, 3]``."""
        c = np.asarray(self.center)
        if self.shape == "sphere":
            r = self.size[0] / 2
            a = np.einsum("...k,...k->...", rays, rays)
            b = rays @ c
            disc = b * b - a * (c @ c - r * r)
            t = np.where(disc >= 0, (b - np.sqrt(np.maximum(disc, 0.0))) / a, np.inf)
            t = np.where(t > 0, t, np.inf)
            with np.errstate(invalid="ignore"):  # misses give nan normals, which are never read
                return t, (rays * t[..., None] - c) / r
        half = np.asarray(self.size) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            t1, t2 = (c - half) / rays, (c + half) / rays
        near = np.nan_to_num(np.minimum(t1, t2), nan=-np.inf)
        far = np.nan_to_num(np.maximum(t1, t2), nan=np.inf)
        t_near, t_far = near.max(axis=-1), far.min(axis=-1)
        t = np.where((t_near <= t_far) & (t_near > 0), t_near, np.inf)
        axis = near.argmax(axis=-1)
        normal = np.zeros_like(rays)
        np.put_along_axis(normal, axis[..., None], -np.sign(np.take_along_axis(rays, axis[..., None], -1)), -1)
        return t, normal


@dataclass
class Render:
    """One rendered view: ``image`` (RGB), ``depth`` ``[S, S]`` float32 metres, ``instances`` ``[S, S]`` int32 (the
    index of the object seen at each pixel, -1 for ground and sky)."""

    image: Image.Image
    depth: np.ndarray
    instances: np.ndarray


def render(
    camera: Camera,
    parts: list[tuple[int, Primitive]],
    shadows: list[tuple[float, float, float]] = (),
    max_depth: float = 100.0,
) -> Render:
    """Ray-cast ``parts`` (``(instance index, primitive)``; an object may have several parts) over the ground.

    ``shadows`` are ``(X, Z, radius)`` discs on the ground, darkened as contact shadows (a depth cue, nothing more).
    """
    rays = camera.rays()
    s = camera.image_size
    with np.errstate(divide="ignore"):
        t_ground = np.where(rays[..., 1] > 0, camera.height / rays[..., 1], np.inf)
    best = t_ground.copy()
    instances = np.full((s, s), -1, dtype=np.int32)
    normals = np.zeros_like(rays)
    colors = np.zeros_like(rays)
    for index, part in parts:
        window = _window(camera, part)  # only the pixels the part can cover: a large speed-up for small objects
        t, normal = part.intersect(rays[window])
        hit = t < best[window]
        best[window][hit], instances[window][hit] = t[hit], index
        normals[window][hit], colors[window][hit] = normal[hit], part.color

    objects = instances >= 0
    shade = _AMBIENT + (1 - _AMBIENT) * np.clip(normals @ _LIGHT, 0.0, 1.0)
    rgb = colors * shade[..., None]

    ground = ~objects & np.isfinite(best)
    points = rays * np.where(ground, best, 0.0)[..., None]
    tile = (np.floor(points[..., 0]) + np.floor(points[..., 2])).astype(int) % 2
    ground_rgb = np.where(tile[..., None] == 0, GROUND_TILES[0], GROUND_TILES[1])
    for x, z, radius in shadows:
        d2 = ((points[..., 0] - x) ** 2 + (points[..., 2] - z) ** 2) / radius**2
        ground_rgb = ground_rgb * (1 - 0.45 * np.clip(1.2 - d2, 0.0, 1.0))[..., None]
    haze = np.clip(best / max_depth, 0.0, 1.0)[..., None] ** 0.7  # distant ground fades into the horizon colour
    ground_rgb = ground_rgb * (1 - haze) + SKY_HORIZON * haze
    rgb = np.where(ground[..., None], ground_rgb, rgb)

    sky = ~objects & ~ground
    height = np.linspace(0.0, 1.0, s)[:, None, None]
    rgb = np.where(sky[..., None], SKY_TOP * (1 - height) + SKY_HORIZON * height, rgb)

    depth = np.minimum(np.where(np.isfinite(best), best, max_depth), max_depth).astype(np.float32)
    image = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")
    return Render(image=image, depth=depth, instances=instances)


CORNERS = np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1).T / 2
"""``[8, 3]`` corners of the unit cube centred at the origin."""


def cuboid_box(camera: Camera, center, size) -> tuple[float, float, float, float] | None:
    """Pixel box ``(x0, y0, x1, y1)`` of the projection of a world cuboid, or None if it reaches behind the camera."""
    corners = np.asarray(center, dtype=float) + CORNERS * np.asarray(size, dtype=float)
    if (camera.to_camera(corners)[:, 2] <= 1e-3).any():
        return None
    uv = camera.project(corners)
    return float(uv[:, 0].min()), float(uv[:, 1].min()), float(uv[:, 0].max()), float(uv[:, 1].max())


def _window(camera: Camera, part: Primitive) -> tuple[slice, slice]:
    box = cuboid_box(camera, part.center, part.size)
    if box is None:
        return slice(None), slice(None)
    s = camera.image_size
    x0, y0, x1, y1 = (min(max(int(v), 0), s) for v in (box[0] - 1, box[1] - 1, box[2] + 2, box[3] + 2))
    return slice(y0, y1), slice(x0, x1)


def instance_box(instances: np.ndarray, index: int) -> list[int] | None:
    """The visible 2D box ``[x0, y0, x1, y1]`` (pixels, ``x1``/``y1`` exclusive) of instance ``index``, or None."""
    ys, xs = np.nonzero(instances == index)
    if xs.size == 0:
        return None
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]

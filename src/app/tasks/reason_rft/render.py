"""A small CLEVR-like renderer shared by the Reason-RFT counting and transformation suites (Reason-RFT Appendix A.1,
A.3: CLEVR-Math, Super-CLEVR and TRANCE scenes, which the paper renders with Blender; docs/algorithms.md#papers).

Scenes are solid objects standing on an infinite grey ground plane, seen by a perspective pinhole camera. Rendering
is a vectorised ray cast in numpy (one ray per pixel, 2x2 supersampled), which gives exact occlusion, a shadow ray
per pixel toward one directional light and per-pixel shading: rubber is matte (Lambert plus a faint, broad highlight);
metal reflects a bright sky / dark ground environment, has a sharp white specular highlight and a darker diffuse
term, so it reads as shiny. The ground fades with distance, which makes the perspective visible.

The light is fixed in the world (coordinates of :mod:`~app.tasks.reason_rft.scene`), so the three viewpoints of
:data:`VIEWS` (front, and the camera turned 45 degrees about the vertical axis to the left or right, as in TRANCE's
Center / Left / Right settings; the paper does not give the angle) see the same lit scene. :func:`render` also
returns what the generators need to reject bad scenes, as CLEVR and the paper's filtering do: each object's visible
fraction and its 2D box; :func:`visible_fractions` is the quick low-resolution check used while sampling.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from app.tasks.reason_rft.scene import BOX_SCALE, COLORS, SIZES, SceneObject

VIEWS = {"front": 0.0, "left": -45.0, "right": 45.0}
"""Camera azimuth in degrees per viewpoint; negative turns the camera to the left of the scene."""

_LIGHT = np.array([-0.45, -0.55, 1.0]) / np.linalg.norm([-0.45, -0.55, 1.0])  # toward the light
_LIGHT_AZIMUTH = _LIGHT[:2] / np.linalg.norm(_LIGHT[:2])
_GROUND = 0.62
_EPS = 1e-4


@dataclass(frozen=True)
class Camera:
    """A pinhole camera on a circle around the origin, looking at ``(0, 0, look_z)``."""

    azimuth: float = 0.0
    elevation: float = 42.0
    distance: float = 12.5
    fov: float = 35.0
    look_z: float = 0.2

    @classmethod
    def view(cls, name: str) -> Camera:
        if name not in VIEWS:
            raise ValueError(f"unknown view {name!r}; known: {', '.join(VIEWS)}")
        return cls(azimuth=VIEWS[name])

    def frame(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Position, and the unit forward / right / up axes of the image (cached; read-only)."""
        return _frame(self)

    def rays(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Origin ``[3]`` and unit directions ``[size * size, 3]`` through pixel centres, row-major (cached;
        read-only)."""
        return _rays(self, size)

    def _compute_frame(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        a, e = math.radians(self.azimuth), math.radians(self.elevation)
        origin = np.array([math.cos(e) * math.sin(a), -math.cos(e) * math.cos(a), math.sin(e)]) * self.distance
        forward = np.array([0.0, 0.0, self.look_z]) - origin
        forward /= np.linalg.norm(forward)
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        return origin, forward, right, np.cross(right, forward)

    def _compute_rays(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        origin, forward, right, up = self.frame()
        coords = ((np.arange(size) + 0.5) / size * 2 - 1) * math.tan(math.radians(self.fov) / 2)  # [size]
        u, v = np.meshgrid(coords, -coords)  # [size, size] each; v grows upward
        dirs = forward + u.reshape(-1, 1) * right + v.reshape(-1, 1) * up  # [M, 3]
        return origin, dirs / np.linalg.norm(dirs, axis=1, keepdims=True)

    def project(self, point: Sequence[float], size: int) -> tuple[float, float]:
        """Pixel coordinates ``(column, row)`` of a world point in a ``size`` x ``size`` image."""
        ((u, v),) = self.project_many(np.asarray([point], dtype=float), size)
        return float(u), float(v)

    def project_many(self, points: np.ndarray, size: int) -> np.ndarray:
        """``[P, 2]`` pixel coordinates ``(column, row)`` of world points ``[P, 3]``."""
        origin, forward, right, up = self.frame()
        rel = points - origin  # [P, 3]
        scale = (rel @ forward) * math.tan(math.radians(self.fov) / 2)  # [P]
        return np.stack([(rel @ right / scale + 1) / 2 * size, (1 - rel @ up / scale) / 2 * size], axis=1)


def _read_only(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for array in arrays:
        array.setflags(write=False)
    return arrays


# A sample renders a handful of cameras at one or two sizes, so caching their rays saves most of the set-up cost.
@functools.lru_cache(maxsize=64)
def _frame(camera: Camera) -> tuple[np.ndarray, ...]:
    return _read_only(*camera._compute_frame())


@functools.lru_cache(maxsize=16)
def _rays(camera: Camera, size: int) -> tuple[np.ndarray, ...]:
    return _read_only(*camera._compute_rays(size))


# ---------------------------------------------------------------------------------------------------------------------
# Ray-object intersection: distance along each ray (inf on a miss) and the surface normal at a hit point.


def _planes(obj: SceneObject) -> tuple[np.ndarray, np.ndarray]:
    """Outward normals ``[F, 3]`` and offsets ``[F]`` of a cube or pyramid (inside: ``n . p <= d``)."""
    s, yaw = SIZES[obj.size] * BOX_SCALE, math.radians(obj.yaw)
    u = np.array([math.cos(yaw), math.sin(yaw), 0.0])
    v = np.array([-math.sin(yaw), math.cos(yaw), 0.0])
    base = np.array([obj.x, obj.y, 0.0])
    z = np.array([0.0, 0.0, 1.0])
    if obj.shape == "cube":
        normals = np.stack([u, -u, v, -v, z, -z])
        return normals, normals @ (base + s * z) + s
    height = 2.2 * s  # = obj.height
    sides = np.stack([height * w + s * z for w in (u, -u, v, -v)])
    sides /= np.linalg.norm(sides, axis=1, keepdims=True)
    edges = np.stack([base + s * w for w in (u, -u, v, -v)])
    normals = np.concatenate([sides, -z[None]])
    return normals, np.concatenate([np.einsum("fk,fk->f", sides, edges), [0.0]])


def _solve(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both roots of ``a t^2 + 2 b t + c = 0`` (nan where there is none), smaller first."""
    disc = b * b - a * c
    with np.errstate(invalid="ignore", divide="ignore"):
        root = np.sqrt(np.where(disc >= 0, disc, np.nan))
        t1, t2 = (-b - root) / a, (-b + root) / a
    return np.fmin(t1, t2), np.fmax(t1, t2)


def _first(ts: Sequence[np.ndarray]) -> np.ndarray:
    """The smallest valid (positive, finite) candidate distance per ray; inf where none is."""
    out = np.full(ts[0].shape, np.inf)
    for t in ts:
        out = np.where(np.isfinite(t) & (t > _EPS) & (t < out), t, out)
    return out


def hit_distance(obj: SceneObject, origins: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """``[M]`` distance from ``origins`` (``[M, 3]`` or ``[3]``) along unit ``dirs`` ``[M, 3]`` to ``obj``."""
    # Only rays that pass through the object's bounding sphere are tested exactly: most rays miss most objects.
    half = obj.height / 2
    oc = origins - np.array([obj.x, obj.y, half])  # [M, 3] or [3]
    b = dirs @ oc if oc.ndim == 1 else np.einsum("mk,mk->m", dirs, oc)
    c = oc @ oc - (obj.radius**2 + half**2) if oc.ndim == 1 else np.einsum("mk,mk->m", oc, oc) - obj.radius**2 - half**2
    disc = b * b - c
    rows = np.flatnonzero((disc >= 0) & (-b + np.sqrt(np.maximum(disc, 0.0)) > 0))
    out = np.full(len(dirs), np.inf)
    if len(rows):
        out[rows] = _exact_distance(obj, origins if oc.ndim == 1 else origins[rows], dirs[rows])
    return out


def _exact_distance(obj: SceneObject, origins: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    r = SIZES[obj.size]
    o = np.broadcast_to(origins, dirs.shape) - np.array([obj.x, obj.y, 0.0])  # [M, 3], relative to the base centre
    ox, oy, oz, dx, dy, dz = o[:, 0], o[:, 1], o[:, 2], dirs[:, 0], dirs[:, 1], dirs[:, 2]
    if obj.shape == "sphere":
        oc_z = oz - r
        t, _ = _solve(np.ones_like(dx), ox * dx + oy * dy + oc_z * dz, ox * ox + oy * oy + oc_z * oc_z - r * r)
        return _first([t])
    if obj.shape in ("cylinder", "cone"):
        height = 2 * r
        if obj.shape == "cylinder":  # rho = r
            t1, t2 = _solve(dx * dx + dy * dy, ox * dx + oy * dy, ox * ox + oy * oy - r * r)
        else:  # rho = k (h - z), a double cone of which the half 0 <= z <= h is kept
            k2 = (r / height) ** 2
            w = height - oz
            t1, t2 = _solve(
                dx * dx + dy * dy - k2 * dz * dz, ox * dx + oy * dy + k2 * w * dz, ox * ox + oy * oy - k2 * w * w
            )
        inside = [np.where((oz + t * dz >= 0) & (oz + t * dz <= height), t, np.nan) for t in (t1, t2)]
        if obj.shape == "cone":
            return _first(inside)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_top = (height - oz) / dz
        on_top = (ox + t_top * dx) ** 2 + (oy + t_top * dy) ** 2 <= r * r
        return _first([*inside, np.where(on_top, t_top, np.nan)])
    normals, offsets = _planes(obj)
    full = np.broadcast_to(origins, dirs.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = dirs @ normals.T  # [M, F]
        t = (offsets - full @ normals.T) / denom  # [M, F]
    near = np.where(denom < 0, t, -np.inf).max(axis=1)
    far = np.where(denom > 0, t, np.inf).min(axis=1)
    parallel_out = ((denom == 0) & (full @ normals.T > offsets)).any(axis=1)
    return _first([np.where((near <= far) & ~parallel_out, near, np.nan)])


def surface_normal(obj: SceneObject, points: np.ndarray) -> np.ndarray:
    """``[M, 3]`` unit outward normals of ``obj`` at surface points ``[M, 3]``."""
    r = SIZES[obj.size]
    p = points - np.array([obj.x, obj.y, 0.0])
    if obj.shape == "sphere":
        return (p - [0.0, 0.0, r]) / r
    if obj.shape in ("cylinder", "cone"):
        rho = np.maximum(np.hypot(p[:, 0], p[:, 1]), 1e-9)
        slope = np.zeros_like(rho) if obj.shape == "cylinder" else np.full_like(rho, 0.5)  # k = r / h
        n = np.stack([p[:, 0] / rho, p[:, 1] / rho, slope], axis=1)
        if obj.shape == "cylinder":
            n[p[:, 2] > 2 * r - 1e-3] = [0.0, 0.0, 1.0]
        return n / np.linalg.norm(n, axis=1, keepdims=True)
    normals, offsets = _planes(obj)
    return normals[np.argmax(points @ normals.T - offsets, axis=1)]


# ---------------------------------------------------------------------------------------------------------------------
# Rendering.


@dataclass
class Rendering:
    """A rendered scene and what the generators check about it.

    Attributes:
        image: the RGB image.
        visible_fraction: per object, its visible pixels over the pixels of its unoccluded silhouette; 0 for an object
            not wholly in the picture (:func:`in_frame`).
        boxes: per object, the ``[x0, y0, x1, y1]`` pixel box of its visible pixels (exclusive ends), or None.
    """

    image: Image.Image
    visible_fraction: list[float]
    boxes: list[list[int] | None]


def _environment(reflected: np.ndarray) -> np.ndarray:
    """``[M, 1]`` brightness a mirror sees along ``reflected`` ``[M, 3]``: ground that darkens away from the horizon
    except in a bright band toward the light (a lit studio floor: it puts a vertical highlight on metal cylinders and
    cones, whose sides only ever reflect the ground), a sharp horizon, a brightening sky and a soft box around the
    light."""
    z = reflected[:, 2:3]
    horizontal = reflected[:, :2] / np.maximum(np.linalg.norm(reflected[:, :2], axis=1, keepdims=True), 1e-9)
    band = 0.8 * np.clip(horizontal @ _LIGHT_AZIMUTH, 0.0, None)[:, None] ** 16
    ground = 0.06 + 0.45 * np.exp(np.minimum(z, 0.0) / 0.12) + band
    sky = 0.55 + 0.45 * np.clip(z, 0.0, 1.0)
    horizon = np.clip(z / 0.04 + 0.5, 0.0, 1.0)
    soft_box = 1.6 * np.clip(reflected @ _LIGHT, 0.0, None)[:, None] ** 24
    return ground * (1 - horizon) + sky * horizon + soft_box


def _metal(base, normals, dirs, diffuse, spec, lit) -> np.ndarray:
    """Metal: the environment tinted by the colour, a little diffuse light, a sharp white highlight and a white rim at
    grazing angles (Schlick's Fresnel)."""
    cos = np.clip(-np.einsum("mk,mk->m", dirs, normals), 0.0, 1.0)[:, None]
    reflected = dirs + 2 * cos * normals
    fresnel = 0.04 + 0.96 * (1 - cos) ** 5
    env = _environment(reflected)
    return base * (0.08 + 0.25 * diffuse + 0.9 * env) + fresnel * 0.5 * env + 1.2 * spec**80 * lit


def _shade(objects: Sequence[SceneObject], nearest: np.ndarray, t: np.ndarray, origin, dirs) -> np.ndarray:
    """``[M, 3]`` colours in [0, 1] of the surfaces the rays hit (ground where ``nearest == -1``)."""
    m = len(dirs)
    colors = np.empty((m, 3))
    ground = nearest < 0
    with np.errstate(divide="ignore"):
        t_ground = np.where(dirs[:, 2] < 0, -origin[2] / dirs[:, 2], np.inf)
    t_all = np.where(ground, t_ground, t)
    points = origin + t_all[:, None] * dirs  # [M, 3]; inf where a ray escapes to the sky
    normals = np.tile([0.0, 0.0, 1.0], (m, 1))
    for k, obj in enumerate(objects):
        sel = nearest == k
        if sel.any():
            normals[sel] = surface_normal(obj, points[sel])
    finite = np.isfinite(t_all)
    lit = np.ones(m)
    shadow_origins = points[finite] + normals[finite] * 1e-3
    blocked = np.zeros(int(finite.sum()), dtype=bool)
    light_dirs = np.broadcast_to(_LIGHT, shadow_origins.shape)
    for obj in objects:
        blocked |= np.isfinite(hit_distance(obj, shadow_origins, light_dirs))
    lit[np.flatnonzero(finite)[blocked]] = 0.0

    # Ground: Lambert under the light, fading with distance from the scene centre and toward the horizon.
    dist = np.hypot(points[ground, 0], points[ground, 1])
    fade = np.exp(-((np.nan_to_num(dist, posinf=1e3) / 9.0) ** 2))
    g = _GROUND * (0.78 + 0.22 * fade) * (0.55 + 0.45 * lit[ground])
    colors[ground] = np.nan_to_num(g, nan=_GROUND * 0.78)[:, None]

    diffuse = np.clip(normals @ _LIGHT, 0.0, None) * lit  # [M]
    half = _LIGHT - dirs
    half /= np.linalg.norm(half, axis=1, keepdims=True)
    spec_angle = np.clip(np.einsum("mk,mk->m", normals, half), 0.0, None)
    for k, obj in enumerate(objects):
        sel = nearest == k
        if not sel.any():
            continue
        base = np.array(COLORS[obj.color]) / 255.0
        d, s = diffuse[sel, None], spec_angle[sel, None]
        if obj.material == "rubber":
            colors[sel] = base * (0.32 + 0.78 * d) + 0.06 * s**6 * lit[sel, None]
        else:
            colors[sel] = _metal(base, normals[sel], dirs[sel], d, s, lit[sel, None])
    return np.clip(colors, 0.0, 1.0)


def _cast(objects: Sequence[SceneObject], origin: np.ndarray, dirs: np.ndarray):
    """Per-object hit distances ``[K, M]``, the index of the nearest object per ray (-1: none) and its distance."""
    if not objects:
        return np.full((0, len(dirs)), np.inf), np.full(len(dirs), -1), np.full(len(dirs), np.inf)
    t_obj = np.stack([hit_distance(obj, origin, dirs) for obj in objects])  # [K, M]
    nearest = np.where(np.isfinite(t_obj).any(axis=0), np.argmin(t_obj, axis=0), -1)  # [M]
    return t_obj, nearest, t_obj.min(axis=0)


def _fractions(objects: Sequence[SceneObject], camera: Camera, t_obj: np.ndarray, nearest: np.ndarray) -> list[float]:
    out = []
    for k, obj in enumerate(objects):
        silhouette = int(np.isfinite(t_obj[k]).sum())
        visible = float((nearest == k).sum() / silhouette) if silhouette else 0.0
        out.append(visible if in_frame(obj, camera) else 0.0)
    return out


def render(
    objects: Sequence[SceneObject], camera: Camera | str = "front", image_size: int = 128, supersample: int = 2
) -> Rendering:
    """Ray-cast ``objects`` seen by ``camera`` (a :class:`Camera` or a name in :data:`VIEWS`).

    >>> scene = [SceneObject("cube", "red", "large", "metal", -1.0, 0.0, 20.0),
    ...          SceneObject("sphere", "cyan", "small", "rubber", 1.5, 1.0)]
    >>> out = render(scene, "front", image_size=64)
    >>> out.image.size, [round(f, 2) for f in out.visible_fraction]
    ((64, 64), [1.0, 1.0])
    """
    if image_size < 16 or supersample < 1:
        raise ValueError(f"need image_size >= 16 and supersample >= 1, got {image_size} and {supersample}")
    camera = Camera.view(camera) if isinstance(camera, str) else camera
    size = image_size * supersample
    origin, dirs = camera.rays(size)
    t_obj, nearest, t = _cast(objects, origin, dirs)
    colors = _shade(objects, nearest, t, origin, dirs).reshape(image_size, supersample, image_size, supersample, 3)
    pixels = np.round(colors.mean(axis=(1, 3)) * 255).astype(np.uint8)
    ids = nearest.reshape(size, size)
    boxes: list[list[int] | None] = []
    for k in range(len(objects)):
        rows, cols = np.nonzero(ids == k)
        box = (cols.min(), rows.min(), cols.max() + supersample, rows.max() + supersample) if len(rows) else None
        boxes.append(None if box is None else [int(v) // supersample for v in box])
    return Rendering(Image.fromarray(pixels), _fractions(objects, camera, t_obj, nearest), boxes)


def in_frame(obj: SceneObject, camera: Camera, margin: float = 0.02) -> bool:
    """Whether the corners of ``obj``'s bounding box project inside the picture, ``margin`` (a fraction) from its
    edges."""
    r, h = obj.radius, obj.height
    corners = np.array([[obj.x + dx, obj.y + dy, z] for dx in (-r, r) for dy in (-r, r) for z in (0.0, h)])
    uv = camera.project_many(corners, 1)
    return bool(((uv >= margin) & (uv <= 1 - margin)).all())


def visible_fractions(objects: Sequence[SceneObject], view: str, resolution: int = 48) -> list[float]:
    """Per-object visible fractions (as :class:`Rendering`'s) from a quick low-resolution pass without shading, for
    rejecting occluded scenes while sampling."""
    camera = Camera.view(view)
    t_obj, nearest, _ = _cast(objects, *camera.rays(resolution))
    return _fractions(objects, camera, t_obj, nearest)

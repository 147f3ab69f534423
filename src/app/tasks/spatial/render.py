"""Draw a procedural scene through its pinhole camera and write the Omni3D-style record of what the image shows.

The background (floor, walls and ceiling of a room; road, sidewalks, grass and sky outdoors) is ray-cast per pixel
with distance shading, floor planks and lane markings, so the ground plane reads as depth. Objects are drawn with the
painter's algorithm over their camera-facing faces (far to near by face centroid distance), each face shaded by the
angle to a fixed light so that boxes read as solid, and outlined.

The record holds, per object, what Omni3D annotations hold (OT-GRPO, Appendix D.1, docs/algorithms.md#papers):
``center_cam``, ``dimensions``, ``R_cam``, ``bbox2D_proj`` (extents of the projected corners), ``bbox2D_trunc`` (those
clipped to the image), ``bbox2D_tight`` (extents of the object's visible pixels), ``visibility`` (visible pixels over
the pixels of the object drawn alone, from an object-id render in the same painter's order) and ``truncation`` (the
share of the projected box outside the image); and, from the same id render, whether the tight box's centre (where a dot
marker goes) shows the object itself.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from app.tasks.spatial.geometry import FACES, bounds, box_area, box_corners, clip_box, project
from app.tasks.spatial.omni3d import ImageRecord, Object3D
from app.tasks.spatial.scenes import Scene, rotation_y, to_camera

_LIGHT = np.array([-0.35, -1.0, -0.55]) / np.linalg.norm([-0.35, -1.0, -0.55])  # towards the light, level frame
_HAZE = np.array([204.0, 212.0, 222.0])


def _rays(scene: Scene) -> np.ndarray:
    """``[H, W, 3]`` level-frame directions (z component 1 in the camera frame) through every pixel centre."""
    cam = scene.camera
    u, v = np.meshgrid(np.arange(cam.width) + 0.5, np.arange(cam.height) + 0.5)
    K = cam.K
    y = (v - K[1, 2]) / K[1, 1]
    x = (u - K[0, 2] - K[0, 1] * y) / K[0, 0]
    dirs = np.stack([x, y, np.ones_like(x)], axis=-1)  # [H, W, 3] camera frame
    return dirs @ cam.level_to_camera  # row-vector form of R^T d


def _hit(numerator: float, denominator: np.ndarray, sign: int) -> np.ndarray:
    """Ray parameter where ``t * denominator == numerator`` for rays whose ``denominator`` has ``sign``, else inf."""
    ok = denominator * sign > 1e-9
    return np.where(ok, numerator / np.where(ok, denominator, 1.0), np.inf)


def _indoor_background(scene: Scene, dirs: np.ndarray) -> np.ndarray:
    h, (dx, dy, dz) = scene.camera.camera_height, np.moveaxis(dirs, -1, 0)
    half_width, depth, room_height = (
        scene.layout["room_width"] / 2,
        scene.layout["room_depth"],
        scene.layout["room_height"],
    )
    hits = np.stack(
        [
            _hit(h, dy, +1),  # floor
            _hit(h - room_height, dy, -1),  # ceiling
            _hit(depth, dz, +1),  # back wall
            _hit(-half_width, dx, -1),  # left wall
            _hit(half_width, dx, +1),  # right wall
        ]
    )  # [5, H, W]
    surface, t = hits.argmin(axis=0), hits.min(axis=0)
    point = dirs * t[..., None]  # [H, W, 3]
    dist = np.linalg.norm(point, axis=-1)
    palette = scene.palette
    colors = np.stack(
        [
            np.array(palette["floor"], float),
            np.array(palette["ceiling"], float),
            np.array(palette["wall"], float) * 0.96,
            np.array(palette["wall"], float) * 0.84,
            np.array(palette["wall"], float) * 0.9,
        ]
    )
    image = colors[surface]  # [H, W, 3]
    planks = (np.floor(point[..., 0] / 0.3) % 2 == 1) & (surface == 0)
    image[planks] *= 0.92
    baseboard = (surface >= 2) & (point[..., 1] > h - 0.1)
    image[baseboard] *= 0.7
    return image * np.clip(1.0 - 0.035 * dist, 0.6, 1.0)[..., None]


def _outdoor_background(scene: Scene, dirs: np.ndarray) -> np.ndarray:
    h, road = scene.camera.camera_height, scene.layout["road_half_width"]
    dx, dy, dz = np.moveaxis(dirs, -1, 0)
    palette = scene.palette
    t = _hit(h, dy, +1)
    ground = np.isfinite(t)
    x, z = dx * np.where(ground, t, 0.0), dz * np.where(ground, t, 0.0)
    image = np.empty(dirs.shape)
    image[...] = palette["grass"]
    image[np.abs(x) < road + 3.0] = palette["sidewalk"]
    image[np.abs(x) < road] = palette["road"]
    dashes = (np.abs(x) < 0.07) & (np.mod(z, 8.0) < 4.0)
    edges = np.abs(np.abs(x) - (road - 0.25)) < 0.07
    image[dashes | edges] = (228, 228, 220)
    dist = np.linalg.norm(dirs, axis=-1) * np.where(ground, t, 0.0)
    fog = (1.0 - np.exp(-dist / 90.0))[..., None]
    image = image * (1.0 - fog) + _HAZE * fog
    elevation = np.clip(-dy / np.linalg.norm(dirs, axis=-1) * 4.0, 0.0, 1.0)[..., None]
    sky = _HAZE * (1.0 - elevation) + np.array(palette["sky"], float) * elevation
    return np.where(ground[..., None], image, sky)


def render_scene(scene: Scene, source_id: str | None = None) -> tuple[Image.Image, ImageRecord]:
    """The scene's RGB image and its Omni3D-style record (objects in scene order; ``record.image`` is the image)."""
    cam = scene.camera
    dirs = _rays(scene)
    background = _indoor_background(scene, dirs) if scene.domain == "indoor" else _outdoor_background(scene, dirs)
    image = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8))

    faces = []  # (distance of the face centroid, object index, polygon, rgb)
    poses = []
    for k, obj in enumerate(scene.objects):
        center, rotation = to_camera(scene, obj)
        corners = box_corners(center, obj.dimensions, rotation)  # [8, 3]
        pixels = project(corners, cam.K)  # [8, 2]
        poses.append((center, rotation, pixels))
        fog = 1.0 - np.exp(-np.linalg.norm(center) / 90.0) if scene.domain == "outdoor" else 0.0
        for indices, normal in FACES:
            idx = list(indices)
            face_center = corners[idx].mean(axis=0)
            if (rotation @ np.array(normal, float)) @ face_center >= 0:  # faces away from the camera
                continue
            shade = 0.5 + 0.5 * max(0.0, float((rotation_y(obj.yaw) @ np.array(normal, float)) @ _LIGHT))
            rgb = np.array(obj.color, float) * shade * (1.0 - fog) + _HAZE * fog
            polygon = [(float(x), float(y)) for x, y in pixels[idx]]
            faces.append((float(np.linalg.norm(face_center)), k, polygon, tuple(int(c) for c in rgb)))
    faces.sort(key=lambda face: -face[0])

    draw = ImageDraw.Draw(image)
    ids = Image.new("L", (cam.width, cam.height), 0)  # 0: background, k + 1: object k
    draw_ids = ImageDraw.Draw(ids)
    alone = [Image.new("1", (cam.width, cam.height), 0) for _ in scene.objects]
    for _, k, polygon, rgb in faces:
        draw.polygon(polygon, fill=rgb, outline=tuple(int(c * 0.55) for c in rgb))
        draw_ids.polygon(polygon, fill=k + 1, outline=k + 1)
        ImageDraw.Draw(alone[k]).polygon(polygon, fill=1, outline=1)

    id_map = np.asarray(ids)
    objects = []
    for k, (obj, (center, rotation, pixels)) in enumerate(zip(scene.objects, poses, strict=True)):
        proj = bounds(pixels)
        trunc = clip_box(proj, cam.width, cam.height)
        rows, cols = np.nonzero(id_map == k + 1)
        tight = (
            None
            if rows.size == 0
            else [float(cols.min()), float(rows.min()), float(cols.max() + 1), float(rows.max() + 1)]
        )
        full = int(np.count_nonzero(np.asarray(alone[k])))
        center_visible = (
            tight is not None and id_map[int((tight[1] + tight[3]) / 2), int((tight[0] + tight[2]) / 2)] == k + 1
        )
        objects.append(
            Object3D(
                category=obj.category,
                center=center.tolist(),
                dimensions=[float(d) for d in obj.dimensions],
                rotation=rotation.tolist(),
                bbox2d_tight=tight,
                bbox2d_trunc=trunc,
                bbox2d_proj=proj,
                visibility=float(rows.size / full) if full else 0.0,
                truncation=float(1.0 - (box_area(trunc) / box_area(proj) if trunc else 0.0)),
                annotation_id=k,
                center_visible=bool(center_visible),
            )
        )
    record = ImageRecord(image, cam.K.tolist(), cam.width, cam.height, objects, source_id, scene.domain)
    return image, record

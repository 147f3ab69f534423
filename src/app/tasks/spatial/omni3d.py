"""Omni3D-style annotations (OT-GRPO, Appendix D.1, docs/algorithms.md#papers) as typed records, from real Omni3D JSON
or procedural scenes.

Real Omni3D files (COCO-like) load unchanged. The fields read are:

- ``images[]``: ``id``, ``width``, ``height``, ``K`` (3x3), ``file_path`` (relative to an image root);
- ``annotations[]``: ``image_id``, ``category_id`` (named through ``categories[]``; ``category_name`` when the id is
  not listed), ``center_cam`` ``[x, y, z]``, ``dimensions`` ``[w, h, l]``, ``R_cam`` (3x3), ``bbox2D_tight``,
  ``bbox2D_trunc``, ``bbox2D_proj`` (``[x0, y0, x1, y1]``), ``visibility``, ``truncation``, ``behind_camera``,
  ``valid3D``. Everything else (``depth_error``, ``segmentation_pts``, ``lidar_pts``, ...) is ignored.

Invalid entries are kept, flagged, and left out by the task filters rather than dropped here, because counting must
still see them (an image with an unusable chair cannot be asked how many chairs it holds):

- ``valid3D: false``, ``behind_camera: true``, a centre with ``z <= 0`` or a dimension ``<= 0`` (Omni3D writes ``-1``)
  make :attr:`Object3D.usable_3d` False;
- ``-1`` sentinels in ``visibility`` / ``truncation`` mean "unknown" (None); the filters let unknown values pass, since
  whole source data sets lack them;
- a 2D box of ``-1`` sentinels (or an empty one) is None; :attr:`Object3D.box2d` falls back from the tight box to the
  truncated and then to the projected box clipped to the image.

Structural problems (a missing field, a K that is not 3x3, an annotation of an unknown image) raise ``ValueError``
naming the entry and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from app.tasks.spatial.geometry import clip_box


@dataclass
class Object3D:
    """One annotated object: its category, 3D box in the camera frame and 2D boxes.

    Attributes:
        category: category name, e.g. ``"chair"``.
        center: ``[x, y, z]`` box centre in metres, camera frame.
        dimensions: ``[w, h, l]`` in metres.
        rotation: ``[3, 3]`` object-to-camera rotation (``R_cam``).
        bbox2d_tight: the tight 2D box of the visible object, or None when unknown.
        bbox2d_trunc: the projected 3D box clipped to the image, or None.
        bbox2d_proj: the projected 3D box (may reach outside the image), or None.
        visibility: fraction of the object not occluded, in [0, 1]; None when unknown.
        truncation: fraction of the object outside the image, in [0, 1]; None when unknown.
        behind_camera: the annotation says the object is behind the camera.
        valid3d: the annotation says its 3D box is valid.
        annotation_id: the source annotation's id (or index), for provenance.
        center_visible: whether the centre of the tight 2D box shows this object rather than an occluder (where a
            dot marker goes); None when unknown (Omni3D has no masks). Procedural scenes fill it in; not an Omni3D
            field, so JSON does not carry it.
    """

    category: str
    center: list[float]
    dimensions: list[float]
    rotation: list[list[float]]
    bbox2d_tight: list[float] | None = None
    bbox2d_trunc: list[float] | None = None
    bbox2d_proj: list[float] | None = None
    visibility: float | None = None
    truncation: float | None = None
    behind_camera: bool = False
    valid3d: bool = True
    annotation_id: int | str | None = None
    center_visible: bool | None = None

    @property
    def usable_3d(self) -> bool:
        """Whether the 3D box can be trusted: valid, in front of the camera, with positive dimensions."""
        return self.valid3d and not self.behind_camera and self.center[2] > 0 and min(self.dimensions) > 0


@dataclass
class ImageRecord:
    """One image with its camera and objects (the unit the task builders read).

    Attributes:
        image: a file path (relative to an image root), an ``[H, W, 3]`` uint8 array, a PIL image, or None.
        K: ``[3, 3]`` camera intrinsics.
        width: image width in pixels.
        height: image height in pixels.
        objects: the annotated objects, usable or not.
        source_id: where the image comes from (Omni3D image id, or a procedural scene id).
        domain: ``"indoor"``, ``"outdoor"`` or None when unknown.
    """

    image: str | Path | np.ndarray | Image.Image | None
    K: list[list[float]]
    width: int
    height: int
    objects: list[Object3D] = field(default_factory=list)
    source_id: int | str | None = None
    domain: str | None = None

    def box2d(self, obj: Object3D) -> list[float] | None:
        """The 2D box the tasks use: tight, else truncated, else projected, each clipped to the image; None if none."""
        for box in (obj.bbox2d_tight, obj.bbox2d_trunc, obj.bbox2d_proj):
            if box is not None and (clipped := clip_box(box, self.width, self.height)) is not None:
                return clipped
        return None


def load_image(record: ImageRecord, image_root: str | Path | None = None) -> Image.Image:
    """The record's image as RGB; a relative path is resolved against ``image_root``."""
    image = record.image
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray):
        return Image.fromarray(np.asarray(image, dtype=np.uint8)).convert("RGB")
    if image is None:
        raise ValueError(f"image record {record.source_id!r} has no image")
    path = Path(image) if image_root is None else Path(image_root) / image
    if not path.is_file():
        raise FileNotFoundError(f"image of record {record.source_id!r} not found: {path} (check --image-root)")
    with Image.open(path) as opened:
        return opened.convert("RGB")


# ---------------------------------------------------------------------------------------------------------- parsing
def _field(entry: Mapping, key: str, where: str) -> Any:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a JSON object, got {type(entry).__name__}")
    if key not in entry:
        raise ValueError(f"{where} is missing the field {key!r}")
    return entry[key]


def _floats(value: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be numbers of shape {list(shape)}, got {value!r}") from None
    if array.shape != shape:
        raise ValueError(f"{where} must have shape {list(shape)}, got {list(array.shape)}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{where} must be finite, got {value!r}")
    return array


def _box(value: Any, where: str) -> list[float] | None:
    """A 2D box, or None for Omni3D's ``-1`` sentinel boxes, missing and empty ones."""
    if value is None:
        return None
    box = _floats(value, (4,), where)
    if np.all(box == -1) or box[2] <= box[0] or box[3] <= box[1]:
        return None
    return box.tolist()


def _fraction(value: Any, where: str) -> float | None:
    if value is None or value == -1:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{where} must be a number in [0, 1] or -1, got {value!r}")
    return min(1.0, max(0.0, float(value)))


def parse_annotation(entry: Mapping, category: str, where: str) -> Object3D:
    """One Omni3D annotation as an :class:`Object3D` (``where`` names it in error messages)."""
    return Object3D(
        category=category,
        center=_floats(_field(entry, "center_cam", where), (3,), f"{where}['center_cam']").tolist(),
        dimensions=_floats(_field(entry, "dimensions", where), (3,), f"{where}['dimensions']").tolist(),
        rotation=_floats(_field(entry, "R_cam", where), (3, 3), f"{where}['R_cam']").tolist(),
        bbox2d_tight=_box(entry.get("bbox2D_tight"), f"{where}['bbox2D_tight']"),
        bbox2d_trunc=_box(entry.get("bbox2D_trunc"), f"{where}['bbox2D_trunc']"),
        bbox2d_proj=_box(entry.get("bbox2D_proj"), f"{where}['bbox2D_proj']"),
        visibility=_fraction(entry.get("visibility"), f"{where}['visibility']"),
        truncation=_fraction(entry.get("truncation"), f"{where}['truncation']"),
        behind_camera=bool(entry.get("behind_camera", False)),
        valid3d=bool(entry.get("valid3D", True)),
        annotation_id=entry.get("id"),
    )


def parse_omni3d(data: Mapping, domain: str | None = None) -> list[ImageRecord]:
    """The images of an Omni3D JSON document, in file order, each with its annotations in file order."""
    if not isinstance(data, Mapping):
        raise ValueError(f"an Omni3D document must be a JSON object, got {type(data).__name__}")
    images, annotations = _field(data, "images", "the Omni3D document"), data.get("annotations", [])
    if not isinstance(images, list) or not isinstance(annotations, list):
        raise ValueError("the Omni3D document's 'images' and 'annotations' must be lists")
    names = {}
    for i, category in enumerate(data.get("categories", [])):
        names[_field(category, "id", f"categories[{i}]")] = str(_field(category, "name", f"categories[{i}]"))

    records: dict[Any, ImageRecord] = {}
    for i, entry in enumerate(images):
        where = f"images[{i}]"
        image_id = _field(entry, "id", where)
        width, height = int(_field(entry, "width", where)), int(_field(entry, "height", where))
        if width <= 0 or height <= 0:
            raise ValueError(f"{where} must have a positive width and height, got {width}x{height}")
        K = _floats(_field(entry, "K", where), (3, 3), f"{where}['K']")
        if image_id in records:
            raise ValueError(f"{where} repeats the image id {image_id!r}")
        path = entry.get("file_path", entry.get("file_name"))
        records[image_id] = ImageRecord(path, K.tolist(), width, height, [], image_id, domain)

    for i, entry in enumerate(annotations):
        where = f"annotations[{i}]"
        image_id = _field(entry, "image_id", where)
        if image_id not in records:
            raise ValueError(f"{where} refers to image_id {image_id!r}, which is not in 'images'")
        category_id = entry.get("category_id")
        category = names.get(category_id, entry.get("category_name"))
        if category is None:
            raise ValueError(f"{where} has category_id {category_id!r}, which is not in 'categories'")
        records[image_id].objects.append(parse_annotation(entry, str(category), where))
    return list(records.values())


def load_omni3d(path: str | Path, domain: str | None = None) -> list[ImageRecord]:
    """:func:`parse_omni3d` of a JSON file."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    return parse_omni3d(data, domain)


def to_omni3d(records: Sequence[ImageRecord]) -> dict[str, Any]:
    """Records as an Omni3D JSON document (``-1`` for unknown values); images are written as their path or None."""
    categories = sorted({obj.category for record in records for obj in record.objects})
    category_ids = {name: i for i, name in enumerate(categories)}
    images, annotations = [], []
    for image_id, record in enumerate(records):
        path = str(record.image) if isinstance(record.image, (str, Path)) else None
        images.append(
            {"id": image_id, "width": record.width, "height": record.height, "K": record.K, "file_path": path}
        )
        for obj in record.objects:
            annotations.append(
                {
                    "id": len(annotations),
                    "image_id": image_id,
                    "category_id": category_ids[obj.category],
                    "category_name": obj.category,
                    "center_cam": obj.center,
                    "dimensions": obj.dimensions,
                    "R_cam": obj.rotation,
                    "bbox2D_tight": obj.bbox2d_tight or [-1.0] * 4,
                    "bbox2D_trunc": obj.bbox2d_trunc or [-1.0] * 4,
                    "bbox2D_proj": obj.bbox2d_proj or [-1.0] * 4,
                    "visibility": -1 if obj.visibility is None else obj.visibility,
                    "truncation": -1 if obj.truncation is None else obj.truncation,
                    "behind_camera": obj.behind_camera,
                    "valid3D": obj.valid3d,
                }
            )
    return {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i, "name": name} for name, i in category_ids.items()],
    }

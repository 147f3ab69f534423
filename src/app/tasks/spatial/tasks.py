"""Spatial VQA tasks from 3D boxes (OT-GRPO, Appendix D.2-D.3, Section 5.5, docs/algorithms.md#papers): filters,
scoring, selection, answers.

Boolean tasks ask whether a relation holds between marked objects; their ground truth is a metric per object:

- ``orientation``: x of the 2D box centre ("to the left of" / "to the right of");
- ``depth``: the smallest z over the eight 3D box corners ("closer to" / "farther from the camera than");
- ``size``: 3D volume w * h * l ("bigger than" / "smaller than");
- ``relative_distance``: distance between 3D centres, from each of two objects to an anchor chosen to maximise the gap
  between the two distances ("closer to" / "farther from").

Numeric tasks: ``counting`` (how many objects of a category, 2-5) and ``distance`` (metres between two 3D centres,
one decimal). Every answer is a function of the sample's meta alone (:func:`answer_from_meta`), which is how
augmentations and tests recompute ground truth from a transformed scene.

Filters (Appendix D.3): each object must have a usable 3D box in front of the camera, enough visibility, little
truncation, a 2D box neither tiny nor dominating and, where masks tell (procedural scenes), a box centre that shows
the object itself (a dot there would otherwise point at an occluder); each pair must overlap little in 2D (IoU and
coverage, stricter for two objects of one category), have box centres far enough apart for their markers not to touch,
and differ by a minimum gap along the task's metric. The paper's threshold tables (7, 8) are not in the text at hand:
:class:`SelectionConfig` holds this package's values, each gap with an absolute and a relative part so one setting
serves rooms (0.5-10 m) and roads (5-100 m). Counting needs every instance of the category clearly visible and apart
from the others (the same-category pair filter), since one hidden chair, or two chairs that read as one, make "how
many chairs" ambiguous.

Selection: candidates (pairs, or triples with their best anchor) are scored ``min(gap, 3) * sqrt(smaller box area /
image area)``, where ``gap`` is the metric gap over its threshold, so clear differences between easily seen objects
score high; one candidate is drawn among the ``top_k`` best with probability proportional to its score, which trades
unambiguity for diversity as the paper describes. The question order of the two compared objects is then drawn
uniformly and the phrase chosen to give the requested answer, so answers can be balanced exactly while the phrase and
the order stay independent of the answer.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

from app.tasks.spatial.geometry import box_area, box_center, box_volume, center_distance, coverage, iou, min_depth
from app.tasks.spatial.markers import make_markers
from app.tasks.spatial.omni3d import ImageRecord, Object3D
from app.tasks.spatial.templates import PHRASES, TEMPLATES, describe, plural

BOOL_TASKS = ("orientation", "depth", "size", "relative_distance")
NUMERIC_TASKS = ("counting", "distance")
TASK_NAMES = BOOL_TASKS + NUMERIC_TASKS
ANSWER_TYPES = {**dict.fromkeys(BOOL_TASKS, "bool"), "counting": "count", "distance": "distance"}
"""Answer type per task, as the consistency reward names them."""
MARKER_KINDS = {"orientation": "dot", "depth": "box", "size": "dot", "relative_distance": "dot", "distance": "dot"}
LABEL_KEY = "answer"
"""The meta key holding the ground truth (removed from label-free samples)."""


@dataclass(frozen=True)
class SelectionConfig:
    """Object filters, pair filters and selection (Appendix D.3); the values are this package's (see module doc)."""

    min_visibility: float = 0.5
    """Smallest visible fraction of an object (unknown visibility passes)."""
    max_truncation: float = 0.4
    """Largest fraction of an object outside the image (unknown truncation passes)."""
    min_box_fraction: float = 0.003
    """Smallest 2D box area over the image area (about 14 x 14 pixels at 256 x 256)."""
    max_box_fraction: float = 0.4
    """Largest 2D box area over the image area."""
    min_center_depth: float = 0.1
    """Smallest z of the 3D centre, metres: the object is in front of the camera."""
    max_iou: float = 0.3
    """Largest 2D IoU of a pair of objects of different categories."""
    max_iou_same_class: float = 0.15
    """Largest 2D IoU of a pair of objects of the same category."""
    max_coverage: float = 0.5
    """Largest fraction of either 2D box inside the other, different categories."""
    max_coverage_same_class: float = 0.3
    """Largest coverage for objects of the same category."""
    min_center_separation: float = 0.08
    """Smallest distance between two marked objects' 2D box centres, as a fraction of the shorter image side, so
    that their markers (dots of radius side / 45) stay apart."""
    min_orientation_gap: float = 0.08
    """Smallest horizontal distance between the 2D centres, as a fraction of the image width."""
    min_depth_gap: tuple[float, float] = (0.3, 0.1)
    """Smallest nearest-depth difference: ``max(metres, fraction * larger depth)``."""
    min_size_ratio: float = 1.5
    """Smallest ratio of the larger volume to the smaller."""
    min_distance_gap: tuple[float, float] = (0.3, 0.15)
    """Relative distance: smallest difference of the two distances, ``max(metres, fraction * larger distance)``."""
    min_distance: float = 0.5
    """Distance task: smallest distance between the two centres, metres."""
    count_range: tuple[int, int] = (2, 5)
    """Counting: inclusive range of the count."""
    count_min_visibility: float = 0.5
    """Counting: every instance of the category must be at least this visible."""
    top_k: int = 5
    """Selection draws among this many best-scored candidates."""


DEFAULT_CONFIG = SelectionConfig()


@dataclass(frozen=True)
class Candidate:
    """Objects a question could ask about (indices into the record's objects; the anchor last) and its score."""

    objects: tuple[int, ...]
    score: float


# ------------------------------------------------------------------------------------------------------- metrics
def object_meta(record: ImageRecord, obj: Object3D) -> dict[str, Any]:
    """The JSON-ready description of an object that a sample's meta carries."""
    return {
        "category": obj.category,
        "bbox2d": record.box2d(obj),
        "center_cam": [float(c) for c in obj.center],
        "dimensions": [float(d) for d in obj.dimensions],
        "R_cam": [[float(c) for c in row] for row in obj.rotation],
        "visibility": obj.visibility,
        "annotation_id": obj.annotation_id,
    }


def _depth(obj: dict) -> float:
    return min_depth(obj["center_cam"], obj["dimensions"], obj["R_cam"])


def _gap(task: str, a: dict, b: dict, width: float, cfg: SelectionConfig, anchor: dict | None = None) -> float:
    """How far apart two objects are along the task's metric, over the threshold (>= 1 passes)."""
    if task == "orientation":
        return abs(box_center(a["bbox2d"])[0] - box_center(b["bbox2d"])[0]) / (cfg.min_orientation_gap * width)
    if task == "depth":
        za, zb = _depth(a), _depth(b)
        return abs(za - zb) / max(cfg.min_depth_gap[0], cfg.min_depth_gap[1] * max(za, zb))
    if task == "size":
        va, vb = box_volume(a["dimensions"]), box_volume(b["dimensions"])
        return math.log(max(va, vb) / min(va, vb)) / math.log(cfg.min_size_ratio)
    da, db = (
        center_distance(a["center_cam"], anchor["center_cam"]),
        center_distance(b["center_cam"], anchor["center_cam"]),
    )
    return abs(da - db) / max(cfg.min_distance_gap[0], cfg.min_distance_gap[1] * max(da, db))


def relation_holds(meta: dict[str, Any]) -> bool:
    """Whether the relation a boolean question states (its phrase, objects in question order) holds in the scene."""
    task, objects, refs = meta["spatial_task"], meta["objects"], meta["refs"]
    a, b = objects[refs[0]], objects[refs[1]]
    if task == "orientation":
        first_smaller = box_center(a["bbox2d"])[0] < box_center(b["bbox2d"])[0]
    elif task == "depth":
        first_smaller = _depth(a) < _depth(b)
    elif task == "size":
        first_smaller = box_volume(a["dimensions"]) < box_volume(b["dimensions"])
    elif task == "relative_distance":
        anchor = objects[refs[2]]["center_cam"]
        first_smaller = center_distance(a["center_cam"], anchor) < center_distance(b["center_cam"], anchor)
    else:
        raise ValueError(f"{task!r} is not a boolean spatial task; expected one of {BOOL_TASKS}")
    phrase0_holds = first_smaller != (task == "size")  # size's phrase 0 is "bigger than"
    return phrase0_holds == (meta["phrase_id"] == 0)


def answer_from_meta(meta: dict[str, Any]) -> str:
    """The ground truth of a sample, computed from its scene meta alone (never from a stored answer)."""
    task = meta["spatial_task"]
    if task == "counting":
        return str(len(meta["refs"]))
    if task == "distance":
        a, b = (meta["objects"][i]["center_cam"] for i in meta["refs"][:2])
        return f"{center_distance(a, b):.1f}"
    return "yes" if relation_holds(meta) else "no"


def explain(meta: dict[str, Any]) -> str:
    """A one-line reasoning naming what must be seen (the relation that holds), without coordinates."""
    task, refs = meta["spatial_task"], meta["refs"]
    if task == "counting":
        count = len(refs)
        return f"there {'is' if count == 1 else 'are'} {count} {plural(meta['objects'][refs[0]]['category'])}"
    a, b = describe(meta, refs[0]), describe(meta, refs[1])
    if task == "distance":
        return f"{a} and {b} are about {answer_from_meta(meta)} meters apart"
    phrase = PHRASES[task][meta["phrase_id"] if relation_holds(meta) else 1 - meta["phrase_id"]]
    if task == "relative_distance":
        return f"{a} is {phrase} {describe(meta, refs[2])} than {b} is"
    return f"{a} is {phrase} {b}"


# ------------------------------------------------------------------------------------------------------- filters
def object_reject_reason(record: ImageRecord, obj: Object3D, cfg: SelectionConfig = DEFAULT_CONFIG) -> str | None:
    """Why a single object cannot be asked about (Appendix D.3, single-object filters), or None when it can."""
    if not obj.usable_3d:
        return "no usable 3D box (valid3D false, behind the camera, or a dimension <= 0)"
    if obj.center[2] < cfg.min_center_depth:
        return f"3D centre too close to the camera plane (z = {obj.center[2]:.2f} m)"
    if obj.visibility is not None and obj.visibility < cfg.min_visibility:
        return f"visibility {obj.visibility:.2f} below {cfg.min_visibility}"
    if obj.truncation is not None and obj.truncation > cfg.max_truncation:
        return f"truncation {obj.truncation:.2f} above {cfg.max_truncation}"
    box = record.box2d(obj)
    if box is None:
        return "no 2D box inside the image"
    if obj.center_visible is False:
        return "the centre of its 2D box shows another object (a dot marker would point at the occluder)"
    fraction = box_area(box) / (record.width * record.height)
    if fraction < cfg.min_box_fraction:
        return f"2D box too small ({fraction:.4f} of the image)"
    if fraction > cfg.max_box_fraction:
        return f"2D box too large ({fraction:.2f} of the image)"
    return None


def pair_reject_reason(
    a: dict, b: dict, cfg: SelectionConfig = DEFAULT_CONFIG, image_side: float | None = None
) -> str | None:
    """Why two objects (meta dicts) overlap too much in 2D to be compared (Appendix D.3), or None. With
    ``image_side`` (the shorter image side), box centres closer than ``cfg.min_center_separation`` of it fail too."""
    if image_side is not None:
        (ax, ay), (bx, by) = box_center(a["bbox2d"]), box_center(b["bbox2d"])
        if math.hypot(ax - bx, ay - by) < cfg.min_center_separation * image_side:
            return f"2D box centres closer than {cfg.min_center_separation} of the image side (markers would touch)"
    same = a["category"] == b["category"]
    max_iou, max_cov = (
        (cfg.max_iou_same_class, cfg.max_coverage_same_class) if same else (cfg.max_iou, cfg.max_coverage)
    )
    overlap = iou(a["bbox2d"], b["bbox2d"])
    if overlap > max_iou:
        return f"2D IoU {overlap:.2f} above {max_iou}{' (same category)' if same else ''}"
    covered = max(coverage(a["bbox2d"], b["bbox2d"]), coverage(b["bbox2d"], a["bbox2d"]))
    if covered > max_cov:
        return f"2D coverage {covered:.2f} above {max_cov}{' (same category)' if same else ''}"
    return None


def _countable(record: ImageRecord, objects: list[Object3D], cfg: SelectionConfig) -> bool:
    """Every instance is clearly visible and no two overlap like one object (the same-category pair filter)."""
    boxes = []
    for obj in objects:
        box = record.box2d(obj)
        if box is None or box_area(box) / (record.width * record.height) < cfg.min_box_fraction:
            return False
        if obj.visibility is not None and obj.visibility < cfg.count_min_visibility:
            return False
        if obj.truncation is not None and obj.truncation > cfg.max_truncation:
            return False
        boxes.append({"category": obj.category, "bbox2d": box})
    return all(pair_reject_reason(a, b, cfg) is None for a, b in itertools.combinations(boxes, 2))


def candidates(record: ImageRecord, task: str, cfg: SelectionConfig = DEFAULT_CONFIG) -> list[Candidate]:
    """Every filtered pair (triple, for relative distance; instance set, for counting) of the record, scored."""
    if task not in TASK_NAMES:
        raise ValueError(f"unknown spatial task {task!r}; expected one of {TASK_NAMES}")
    if task == "counting":
        groups: dict[str, list[int]] = {}
        for i, obj in enumerate(record.objects):
            if not obj.behind_camera:
                groups.setdefault(obj.category, []).append(i)
        lo, hi = cfg.count_range
        return [
            Candidate(tuple(members), 1.0)
            for members in groups.values()
            if lo <= len(members) <= hi and _countable(record, [record.objects[i] for i in members], cfg)
        ]
    metas = {
        i: object_meta(record, obj)
        for i, obj in enumerate(record.objects)
        if object_reject_reason(record, obj, cfg) is None
    }
    image_area = record.width * record.height

    def score(gap: float, members: tuple[int, ...]) -> float:
        smallest = min(box_area(metas[i]["bbox2d"]) for i in members) / image_area
        return min(gap, 3.0) * math.sqrt(smallest)

    side = min(record.width, record.height)
    pairs = [
        (i, j) for i, j in itertools.combinations(metas, 2) if pair_reject_reason(metas[i], metas[j], cfg, side) is None
    ]
    found = []
    if task == "distance":
        for i, j in pairs:
            if center_distance(metas[i]["center_cam"], metas[j]["center_cam"]) >= cfg.min_distance:
                found.append(Candidate((i, j), score(1.0, (i, j))))
    elif task == "relative_distance":
        ok = set(pairs)
        for i, j in pairs:
            anchors = [k for k in metas if (min(i, k), max(i, k)) in ok and (min(j, k), max(j, k)) in ok]
            gaps = [(_gap(task, metas[i], metas[j], record.width, cfg, metas[k]), k) for k in anchors]
            if gaps and (best := max(gaps))[0] >= 1.0:
                found.append(Candidate((i, j, best[1]), score(best[0], (i, j, best[1]))))
    else:
        for i, j in pairs:
            if (gap := _gap(task, metas[i], metas[j], record.width, cfg)) >= 1.0:
                found.append(Candidate((i, j), score(gap, (i, j))))
    return found


def select(found: list[Candidate], rng: random.Random, top_k: int = 5) -> Candidate:
    """One candidate among the ``top_k`` best-scored, drawn with probability proportional to its score."""
    best = sorted(found, key=lambda c: (-c.score, c.objects))[:top_k]
    return rng.choices(best, weights=[max(c.score, 1e-9) for c in best])[0]


def build_question(
    record: ImageRecord,
    task: str,
    rng: random.Random,
    answer: str | None = None,
    cfg: SelectionConfig = DEFAULT_CONFIG,
) -> dict[str, Any] | None:
    """The meta of one question about ``record`` (ground truth under :data:`LABEL_KEY`), or None when no candidate
    passes the filters.

    Args:
        answer: the answer to aim for: ``"yes"``/``"no"`` for boolean tasks (the phrase is chosen to match), a count
            for counting (only categories with that many instances qualify); None draws it. Ignored for distance.
    """
    found = candidates(record, task, cfg)
    if task == "counting" and answer is not None:
        found = [c for c in found if len(c.objects) == int(answer)]
    if not found:
        return None
    chosen = list(select(found, rng, cfg.top_k).objects)
    if task != "counting" and rng.random() < 0.5:
        chosen[0], chosen[1] = chosen[1], chosen[0]
    objects = [object_meta(record, record.objects[i]) for i in chosen]
    meta: dict[str, Any] = {
        "spatial_task": task,
        "answer_type": ANSWER_TYPES[task],
        "template_id": rng.randrange(len(TEMPLATES[task])),
        "phrase_id": 0,
        "refs": list(range(len(objects))),
        "objects": objects,
        "K": [[float(c) for c in row] for row in record.K],
        "image_size": [record.width, record.height],
        "domain": record.domain,
        "source_id": record.source_id,
        "markers": [],
    }
    if task in MARKER_KINDS:
        meta["markers"] = make_markers(
            rng, MARKER_KINDS[task], [o["bbox2d"] for o in objects], record.width, record.height
        )
    if task in BOOL_TASKS:
        if answer is None:
            meta["phrase_id"] = rng.randrange(2)
        elif answer not in ("yes", "no"):
            raise ValueError(f"answer of a boolean task must be 'yes', 'no' or None, got {answer!r}")
        elif relation_holds(meta) != (answer == "yes"):
            meta["phrase_id"] = 1
    meta[LABEL_KEY] = answer_from_meta(meta)
    return meta

"""Prompt augmentations with a known answer effect, and the pair maker for consistency training (OT-GRPO, Section 3
"Prompt Augmentation" and Appendix D.4; docs/algorithms.md#papers).

Transforms (each applied independently with probability ``prob``, 0.5 in the paper) and their answer effects:

- ``hflip``: the image mirrored; 2D boxes, markers, 3D centres (x -> -x), rotations (``M R M``) and the principal
  point follow. Orientation: negation; every other task: identity.
- ``crop``: a window of 70-100 % of each side holding every referenced object's box and every marker; boxes, markers
  and K shift. Identity. The crop is not resized back: its pixels stay the original's (the VLM processor takes any
  size), and an invariant transform should not add interpolation.
- ``color_jitter``: brightness, contrast and saturation scaled by U(0.75, 1.25); hue is kept, so marker colours keep
  their names. Identity.
- ``template``: another of the task's five templates. Identity.
- ``relation_swap``: the other relation phrase. Negation; boolean tasks only.
- ``order_swap``: the two compared objects change places in the question (an anchor stays). Negation for boolean
  tasks, identity for distance, not applied to counting.

Effects compose by parity (Appendix D.4, "Composition Rule"): an odd number of negations gives ``negation``. Numeric
tasks take only invariant transforms (Section 5.5). The twin's question is re-rendered from its meta; the pair maker
reads scene metadata only, never the answer, so it serves label-free samples; a labeled sample's twin gets the answer
that the relation implies.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from PIL import Image, ImageEnhance

from app.tasks.spatial.geometry import flip_box, flip_intrinsics, flip_pose, shift_box, shift_intrinsics, union_box
from app.tasks.spatial.markers import flip_marker, marker_extent, shift_marker
from app.tasks.spatial.tasks import BOOL_TASKS, LABEL_KEY, explain
from app.tasks.spatial.templates import TEMPLATES, render_question
from app.types import VisualSample

TRANSFORMS = ("hflip", "crop", "color_jitter", "template", "relation_swap", "order_swap")
"""Every transform, in the order they are applied."""

Meta = dict[str, Any]
Transform = Callable[[Image.Image, Meta, random.Random], Image.Image]
"""``transform(image, meta, rng) -> image``; updates ``meta`` (a private copy) in place."""


def effect(task: str, transform: str) -> str | None:
    """The answer effect of ``transform`` on a ``task`` question: ``"identity"``, ``"negation"``, or None when the
    transform does not apply to the task."""
    if transform not in TRANSFORMS:
        raise ValueError(f"unknown transform {transform!r}; expected one of {TRANSFORMS}")
    boolean = task in BOOL_TASKS
    if transform == "hflip":
        return "negation" if task == "orientation" else "identity"
    if transform == "relation_swap":
        return "negation" if boolean else None
    if transform == "order_swap":
        return "negation" if boolean else ("identity" if task == "distance" else None)
    return "identity"


def compose(task: str, transforms: Sequence[str]) -> str:
    """The answer effect of applying ``transforms`` together: parity of their negations."""
    negations = 0
    for transform in transforms:
        kind = effect(task, transform)
        if kind is None:
            raise ValueError(f"transform {transform!r} does not apply to the {task!r} task")
        negations += kind == "negation"
    return "negation" if negations % 2 else "identity"


def apply_relation(relation: str, answer: str | None) -> str | None:
    """A boolean answer under ``relation`` (``negation`` swaps yes and no); numeric answers only take identity."""
    if answer is None or relation == "identity":
        return answer
    if relation != "negation" or answer not in ("yes", "no"):
        raise ValueError(f"cannot apply relation {relation!r} to answer {answer!r}")
    return "no" if answer == "yes" else "yes"


# -------------------------------------------------------------------------------------------------- the transforms
def hflip(image: Image.Image, meta: Meta, rng: random.Random) -> Image.Image:
    """Mirror the image left-right; 2D boxes, markers, 3D poses and intrinsics follow."""
    width = image.width
    for obj in meta["objects"]:
        obj["bbox2d"] = flip_box(obj["bbox2d"], width)
        obj["center_cam"], obj["R_cam"] = flip_pose(obj["center_cam"], obj["R_cam"])
    meta["K"] = flip_intrinsics(meta["K"], width)
    meta["markers"] = [flip_marker(m, width) for m in meta["markers"]]
    return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


def crop(image: Image.Image, meta: Meta, rng: random.Random, min_scale: float = 0.7) -> Image.Image:
    """Crop a window of ``U(min_scale, 1)`` of each side (same aspect ratio; wider if the objects need it) that holds
    every referenced object's 2D box and every marker; boxes, markers and K move with it."""
    width, height = image.size
    keep = [meta["objects"][i]["bbox2d"] for i in meta["refs"]] + [marker_extent(m) for m in meta["markers"]]
    x0, y0, x1, y1 = union_box(keep)
    x0, y0 = max(0, math.floor(x0)), max(0, math.floor(y0))
    x1, y1 = min(width, math.ceil(x1)), min(height, math.ceil(y1))
    scale = rng.uniform(min_scale, 1.0)
    crop_w, crop_h = max(x1 - x0, min(width, round(scale * width))), max(y1 - y0, min(height, round(scale * height)))
    left = rng.randint(max(0, x1 - crop_w), min(x0, width - crop_w))
    top = rng.randint(max(0, y1 - crop_h), min(y0, height - crop_h))
    for obj in meta["objects"]:
        obj["bbox2d"] = shift_box(obj["bbox2d"], left, top)
    meta["K"] = shift_intrinsics(meta["K"], left, top)
    meta["markers"] = [shift_marker(m, left, top) for m in meta["markers"]]
    meta["image_size"] = [crop_w, crop_h]
    return image.crop((left, top, left + crop_w, top + crop_h))


def color_jitter(image: Image.Image, meta: Meta, rng: random.Random, strength: float = 0.25) -> Image.Image:
    """Scale brightness, contrast and saturation by factors in ``[1 - strength, 1 + strength]`` (hue is kept, so the
    marker colours keep their names)."""
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        image = enhance(image).enhance(rng.uniform(1 - strength, 1 + strength))
    return image


def resample_template(image: Image.Image, meta: Meta, rng: random.Random) -> Image.Image:
    """Another of the task's templates (a different one, so the question does change)."""
    others = [t for t in range(len(TEMPLATES[meta["spatial_task"]])) if t != meta["template_id"]]
    meta["template_id"] = rng.choice(others)
    return image


def swap_relation(image: Image.Image, meta: Meta, rng: random.Random) -> Image.Image:
    """Ask the opposite relation ("left of" <-> "right of")."""
    meta["phrase_id"] = 1 - meta["phrase_id"]
    return image


def swap_order(image: Image.Image, meta: Meta, rng: random.Random) -> Image.Image:
    """Swap the first two objects of the question (the compared ones; an anchor stays last)."""
    refs = meta["refs"]
    refs[0], refs[1] = refs[1], refs[0]
    return image


def _spatial_task(sample: VisualSample) -> str:
    task = sample.meta.get("spatial_task")
    if task is None:
        raise ValueError(
            f"SpatialPairAugmenter needs spatial samples (with meta['spatial_task']), got a {sample.task!r} sample"
        )
    return task


class SpatialPairAugmenter:
    """Makes ``(x, x')`` pairs for consistency rewards from spatial samples (the data modules' ``augment``).

    ``x`` is the sample with ``meta["pair_id"]`` and ``meta["transforms"] = []``; ``x'`` applies each applicable
    transform with probability ``prob`` and carries the same ``pair_id``, ``meta["transforms"]`` (in the order
    applied) and ``meta["relation"]``. Works on label-free samples: only scene metadata is read.

    Args:
        prob: probability of each transform (0.5 in the paper).
        transforms: the transforms to draw from (default: all of :data:`TRANSFORMS`).
        min_crop_scale: smallest crop side, as a fraction of the image side.
        jitter: colour jitter strength.

    Example:
        >>> from app.tasks.spatial import SpatialVQADataset
        >>> x, twin = SpatialPairAugmenter()(SpatialVQADataset(2, seed=0, image_size=96)[0], random.Random(0))
        >>> x.meta["pair_id"] == twin.meta["pair_id"], twin.meta["relation"] in ("identity", "negation")
        (True, True)
    """

    def __init__(
        self,
        prob: float = 0.5,
        transforms: Sequence[str] = TRANSFORMS,
        min_crop_scale: float = 0.7,
        jitter: float = 0.25,
    ) -> None:
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"prob must be in [0, 1], got {prob}")
        unknown = set(transforms) - set(TRANSFORMS)
        if unknown:
            raise ValueError(f"unknown transforms {sorted(unknown)}; expected a subset of {TRANSFORMS}")
        if not 0.0 < min_crop_scale <= 1.0:
            raise ValueError(f"min_crop_scale must be in (0, 1], got {min_crop_scale}")
        self.prob = prob
        self.transforms = tuple(t for t in TRANSFORMS if t in transforms)
        self.min_crop_scale = min_crop_scale
        self.jitter = jitter
        self._apply: dict[str, Transform] = {
            "hflip": hflip,
            "crop": functools.partial(crop, min_scale=min_crop_scale),
            "color_jitter": functools.partial(color_jitter, strength=jitter),
            "template": resample_template,
            "relation_swap": swap_relation,
            "order_swap": swap_order,
        }

    def __call__(self, sample: VisualSample, rng: random.Random) -> tuple[VisualSample, VisualSample]:
        task = _spatial_task(sample)
        chosen = [t for t in self.transforms if effect(task, t) is not None and rng.random() < self.prob]
        return self.pair(sample, chosen, rng)

    def pair(
        self, sample: VisualSample, transforms: Sequence[str], rng: random.Random
    ) -> tuple[VisualSample, VisualSample]:
        """The pair ``(x, x')`` with exactly ``transforms`` applied to ``x'`` (in :data:`TRANSFORMS` order)."""
        task = _spatial_task(sample)
        transforms = [t for t in TRANSFORMS if t in transforms]
        relation = compose(task, transforms)  # raises on a transform the task does not take
        pair_id = f"{sample.meta.get('sample_id', sample.task)}#{rng.getrandbits(48):012x}"
        x_meta = {k: v for k, v in sample.meta.items() if k != "relation"}
        x = dataclasses.replace(
            sample, images=list(sample.images), meta={**x_meta, "pair_id": pair_id, "transforms": []}
        )
        meta = copy.deepcopy(sample.meta)
        image = sample.images[0]
        for name in transforms:
            image = self._apply[name](image, meta, rng)
        meta.update(pair_id=pair_id, transforms=list(transforms), relation=relation)
        answer = apply_relation(relation, sample.answer)
        if LABEL_KEY in meta:
            meta[LABEL_KEY] = apply_relation(relation, meta[LABEL_KEY])
        twin = dataclasses.replace(
            sample,
            images=[image if image is not sample.images[0] else image.copy()],
            question=render_question(meta),
            answer=answer,
            reasoning=None if answer is None else explain(meta),
            meta=meta,
        )
        return x, twin

"""Reason-RFT spatial transformation (Reason-RFT Appendix A.3, docs/algorithms.md#papers): TRANCE-style initial / final
scene pairs whose answer is the sequence of atomic transformations between them.

A sample has two images: the initial scene (3-8 objects) from the front, and the final scene after 1-4 steps (TRANCE's
levels), each a function of :data:`FUNCTIONS` applied to a different object. Objects are named ``obj_1``, ``obj_2``,
... from left to right in the initial image, and the question lists them with their attributes, as the paper's
prompts give "the attributes of the initial objects". The answer is in the syntax of
:func:`~app.rewards.parsing.parse_steps`, ordered by object, e.g. ``change_color(obj_2, red), change_position(obj_4,
front_left)``, and :class:`~app.rewards.FunctionSequenceReward` scores it.

Values follow TRANCE / Reason-RFT: sizes small / medium / large, CLEVR's 8 colours, materials rubber / metal (TRANCE's
glass is left out, see :mod:`~app.tasks.reason_rft.scene`), shapes cube / sphere / cylinder, and 8 directions for
``change_position``: front, behind, left, right, front_left, front_right, behind_left, behind_right. Directions are
in the frame of the initial (front) image, whatever the final view: ``front`` is toward its camera, ``right`` to its
right; a move is a displacement of :data:`MOVE_DISTANCE` along the direction (diagonals too), so a multi-step
displacement never occurs (the paper's filter (3) merges those into one).

Splits: ``train`` and ``cot_sft`` (disjoint seeds) and ``test_in_domain`` show the final scene from the front
(Center-Center). ``test_left`` and ``test_right`` are the same test scenes with the final image from the left / right
camera (Center-Left, Center-Right: the paper's DS-L and DS-R built from its 6K test scenes); ``test_domain_shift``
alternates them (left for even indices, right for odd). Only ``cot_sft`` samples carry a chain of thought
(:mod:`~app.tasks.reason_rft.cot`), the stage-1 CoT-SFT set. A changed or moved object must still fit in the region
without overlap, and a pair is redrawn unless every object shows at least 40% of itself in the initial image and in
the final image from all three views (the paper's filter (1) against occluded objects), so all test views are valid.
``meta`` lists the initial objects in the open (the question names them) and puts the final scene under ``target``
and the steps under ``solution``, label keys that label-free shards drop.

>>> sample = next(make_samples(1, seed=0, split="test_left", image_size=64))
>>> sample.task, len(sample.images), sample.meta["view_final"]
('rrft_transformation', 2, 'left')
"""

from __future__ import annotations

import dataclasses
import math
import random
from functools import partial

from app.tasks.reason_rft.cot import left_to_right, transformation_reasoning
from app.tasks.reason_rft.programs import Step
from app.tasks.reason_rft.render import VIEWS, render, visible_fractions
from app.tasks.reason_rft.scene import COLORS, MATERIALS, SHAPES, SceneObject, fits, random_object, sample_scene
from app.tasks.reason_rft.split_dataset import SplitDataset
from app.types import VisualSample

TASK = "rrft_transformation"
SPLITS = ("train", "test_in_domain", "test_domain_shift", "test_left", "test_right", "cot_sft")
FUNCTIONS = ("change_size", "change_color", "change_material", "change_shape", "change_position")
SIZES = ("small", "medium", "large")
DIRECTIONS = {
    "front": (0.0, -1.0),
    "behind": (0.0, 1.0),
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "front_left": (-1.0, -1.0),
    "front_right": (1.0, -1.0),
    "behind_left": (-1.0, 1.0),
    "behind_right": (1.0, 1.0),
}
"""Direction name -> ``(x, y)`` on the ground in the front camera's frame (``y`` grows away from it)."""
MOVE_DISTANCE = 1.6
"""Length of a ``change_position`` displacement, in CLEVR units (about two small objects wide)."""
MAX_STEPS = 4
MIN_VISIBLE = 0.4
VALUES = {
    "change_size": SIZES,
    "change_color": tuple(COLORS),
    "change_material": MATERIALS,
    "change_shape": SHAPES,
    "change_position": tuple(DIRECTIONS),
}
_SEED_STREAMS = {
    "train": "train",
    "cot_sft": "cot",
    "test_in_domain": "test",
    "test_domain_shift": "test",
    "test_left": "test",
    "test_right": "test",
}
_VIEW_OF_SPLIT = {"test_left": "left", "test_right": "right"}


def apply_step(obj: SceneObject, function: str, value: str) -> SceneObject:
    """``obj`` after one transformation."""
    if function not in VALUES or value not in VALUES[function]:
        known = ", ".join(VALUES.get(function, FUNCTIONS))
        raise ValueError(
            f"unknown transformation {function}({value!r}); "
            f"known {'values' if function in VALUES else 'functions'}: {known}"
        )
    if function == "change_position":
        dx, dy = DIRECTIONS[value]
        scale = MOVE_DISTANCE / math.hypot(dx, dy)
        return dataclasses.replace(obj, x=round(obj.x + dx * scale, 3), y=round(obj.y + dy * scale, 3))
    return dataclasses.replace(obj, **{function.removeprefix("change_"): value})


def _current(obj: SceneObject, function: str) -> str | None:
    return None if function == "change_position" else getattr(obj, function.removeprefix("change_"))


def _draw_steps(rng: random.Random, initial: list[SceneObject], level: int) -> tuple[list[SceneObject], list[Step]]:
    """The final scene and its steps, or ``([], [])`` when a changed object fits nowhere.

    The function is drawn first and then the first of its values (in random order) whose result fits among the other
    objects, so that moves and growths, which often collide, are as frequent as the other functions.
    """
    final, steps = list(initial), []
    for index in sorted(rng.sample(range(len(initial)), level)):
        function = rng.choice(FUNCTIONS)
        values = [v for v in VALUES[function] if v != _current(initial[index], function)]
        rng.shuffle(values)
        others = final[:index] + final[index + 1 :]
        for value in values:
            changed = apply_step(initial[index], function, value)
            if fits(changed, others):
                final[index] = changed
                steps.append(Step(function, index, value))
                break
        else:
            return [], []
    return final, steps


def _all_visible(objects: list[SceneObject], views) -> bool:
    return all(min(visible_fractions(objects, view, 64)) >= MIN_VISIBLE for view in views)


def _random_objects(rng: random.Random, n: int) -> list[SceneObject]:
    return [random_object(rng, SHAPES, SIZES) for _ in range(n)]


def _draw_pair(rng: random.Random) -> tuple[list[SceneObject], list[SceneObject], list[Step]]:
    level = rng.randint(1, MAX_STEPS)
    for _ in range(50):
        n = rng.randint(max(3, level), 8)
        initial = sample_scene(rng, partial(_random_objects, n=n), lambda s: _all_visible(s, ["front"]))
        initial = [initial[i] for i in left_to_right(initial)]  # obj_1, obj_2, ... left to right
        for _ in range(20):
            final, steps = _draw_steps(rng, initial, level)
            if steps and _all_visible(final, VIEWS):
                return initial, final, steps
    raise RuntimeError("no valid transformation pair in 1000 draws")  # pragma: no cover


def _objects_json(objects: list[SceneObject], boxes: list[list[int] | None]) -> list[dict]:
    return [
        {"id": f"obj_{i + 1}", **o.to_json(), "box": box} for i, (o, box) in enumerate(zip(objects, boxes, strict=True))
    ]


def question(objects: list[SceneObject], final_view: str) -> str:
    """The prompt: what the two images show, the numbered initial objects and the answer format."""
    seen = "from the front as well" if final_view == "front" else f"from the {final_view} side"
    listing = "; ".join(f"obj_{i + 1}: {o.describe()}" for i, o in enumerate(objects))
    values = "; ".join(f"{f} ({', '.join(VALUES[f])})" for f in FUNCTIONS)
    return (
        f"The first image shows the initial scene from the front; the second shows the final scene {seen}. The initial"
        f" objects, numbered from left to right in the first image, are {listing}. Which transformations turn the"
        f" initial scene into the final one? Each object changes at most once. Answer with 1 to {MAX_STEPS} steps like"
        f" change_color(obj_1, red), separated by commas, using these functions and values: {values}. Directions are"
        " seen from the camera of the first image (front is toward it)."
    )


def make_sample(seed: int, split: str, index: int, image_size: int = 128, labeled: bool = True) -> VisualSample:
    """Sample ``index`` of ``split``; the scenes depend only on ``(seed, seed stream of split, index)``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    rng = random.Random(f"rrft-transformation:{_SEED_STREAMS[split]}:{seed}:{index}")
    initial, final, steps = _draw_pair(rng)
    view = ("left", "right")[index % 2] if split == "test_domain_shift" else _VIEW_OF_SPLIT.get(split, "front")
    first, second = render(initial, "front", image_size), render(final, view, image_size)
    answer = ", ".join(step.text() for step in steps)
    meta = {
        "suite": "transformation",
        "split": split,
        "index": index,
        "view_initial": "front",
        "view_final": view,
        "level": len(steps),
        "objects": _objects_json(initial, first.boxes),
        "target": {"objects": _objects_json(final, second.boxes)},
        "solution": [{"function": s.function, "object": f"obj_{s.index + 1}", "value": s.value} for s in steps],
    }
    reasoning = transformation_reasoning(initial, steps, view) if labeled and split == "cot_sft" else None
    return VisualSample(
        [first.image, second.image], question(initial, view), TASK, answer if labeled else None, reasoning, meta
    )


class SpatialTransformationDataset(SplitDataset):
    """``num_samples`` spatial-transformation prompts of one split, rendered lazily (see the module docstring).

    Args:
        num_samples: number of samples.
        seed: seed of the data set; sample ``i`` depends only on ``(seed, split, i)``.
        image_size: side of the square images in pixels.
        split: one of :data:`SPLITS`.
        labeled: when False, ``answer`` and ``reasoning`` are None.
    """

    splits = SPLITS

    def sample(self, index: int) -> VisualSample:
        return make_sample(self.seed, self.split, index, self.image_size, self.labeled)


make_samples = SpatialTransformationDataset.make_samples
"""Samples ``0 .. num - 1`` of a split, labeled, one at a time (see
:meth:`~app.tasks.reason_rft.split_dataset.SplitDataset.make_samples`)."""

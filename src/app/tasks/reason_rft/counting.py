"""Reason-RFT visual counting (Reason-RFT Appendix A.1, docs/algorithms.md#papers): CLEVR-Math-style arithmetic
questions about rendered scenes.

A sample is one front-view image of 3-10 objects and a question from a program of operations on the scene:

- ``subtraction``: "Subtract all large cubes. How many objects are left?"
- ``addition``: "Add 2 red cylinders. How many cylinders are there?"
- ``adversarial``: a trick question: subtract something absent, or ask about a set the operation does not touch
  ("Subtract all red spheres. How many cubes are left?", "Add 1 metal cube. How many cylinders are there?").
- ``multihop``: two subtractions (CLEVR-Math's subtraction-multihop), the second counted among what the first leaves.
- ``addition_subtraction``: adds and subtracts mixed (2-3 operations); only in the domain-shift split (the paper's
  DS-M subset; the other domain-shift types form DS-D).

The answer is the integer count, scored by :class:`~app.rewards.NumericToleranceReward` or exact match. Splits:
``train``, ``test_in_domain`` and ``cot_sft`` use CLEVR's shapes and the four in-domain types; ``test_domain_shift``
(Super-CLEVR-Math) adds the unseen shapes ``cone`` and ``pyramid`` (at least two such objects per scene, and one
operation is about such a shape) with types addition, subtraction, multihop (DS-D) and addition_subtraction (DS-M).
``cot_sft`` is the stage-1 set: its labeled samples carry a chain of thought written from the program
(:mod:`~app.tasks.reason_rft.cot`), and it draws from its own seeds, so it is disjoint from the RL ``train`` prompts.
Other splits have no reasoning (SFT on them is the paper's ANS-SFT baseline).

Decisions where the paper is silent: added objects may leave attributes unsaid ("Add 2 red cylinders" says neither
size nor material); a program whose later filter or query cannot be decided for such an object ("... How many metal
objects are there?") is redrawn, so every answer follows from the scene and the question alone. Scenes are redrawn
until every object shows at least 40% of itself. ``meta`` keeps the question program and object geometry (positions,
2D boxes) in the open and puts what reveals the answer under label keys that label-free shards drop: ``attributes``
(per object) and ``solution`` (the count after each operation and the answer).

>>> sample = next(make_samples(1, seed=0, split="train", image_size=64))
>>> sample.task, sample.answer == str(sample.meta["solution"]["answer"]), sample.images[0].size
('rrft_counting', True, (64, 64))
"""

from __future__ import annotations

import random

from app.tasks.reason_rft.cot import counting_reasoning
from app.tasks.reason_rft.programs import (
    AmbiguousProgram,
    CountingProgram,
    Filter,
    Operation,
    execute,
)
from app.tasks.reason_rft.render import render, visible_fractions
from app.tasks.reason_rft.scene import (
    ATTRIBUTES,
    COLORS,
    MATERIALS,
    NEW_SHAPES,
    SHAPES,
    SceneObject,
    random_object,
    sample_scene,
)
from app.tasks.reason_rft.split_dataset import SplitDataset
from app.types import VisualSample

TASK = "rrft_counting"
SPLITS = ("train", "test_in_domain", "test_domain_shift", "cot_sft")
IN_DOMAIN_TYPES = ("subtraction", "addition", "adversarial", "multihop")
DOMAIN_SHIFT_TYPES = ("addition", "subtraction", "multihop", "addition_subtraction")
SIZES = ("small", "large")
"""CLEVR's two sizes."""
MIN_VISIBLE = 0.4
_SEED_STREAMS = {"train": "train", "test_in_domain": "test", "test_domain_shift": "shift", "cot_sft": "cot"}


def _filter_of(rng: random.Random, obj: SceneObject, need_shape: bool = False) -> Filter:
    """A filter that ``obj`` passes, on 1-3 of its attributes (always its shape when ``need_shape``)."""
    k = rng.choices((1, 2, 3), weights=(0.4, 0.4, 0.2))[0]
    names = rng.sample([n for n in ATTRIBUTES if n != "shape"] if need_shape else list(ATTRIBUTES), k - int(need_shape))
    return Filter(**{n: getattr(obj, n) for n in names + (["shape"] if need_shape else [])})


def _absent_filter(rng: random.Random, objects: list[SceneObject], shapes: tuple[str, ...]) -> Filter | None:
    for _ in range(50):
        candidate = Filter(color=rng.choice(list(COLORS)), shape=rng.choice(shapes))
        if not any(candidate.matches(o.attributes()) for o in objects):
            return candidate
    return None


def _unrelated_query(rng: random.Random, target: Filter, shapes: tuple[str, ...]) -> Filter:
    """A query that contradicts ``target`` on one attribute, so the operation cannot change its count."""
    name = rng.choice(list(target.items()))
    vocabulary = {"size": SIZES, "color": tuple(COLORS), "material": MATERIALS, "shape": shapes}[name]
    return Filter(**{name: rng.choice([v for v in vocabulary if v != getattr(target, name)])})


def _add_spec(rng: random.Random, shapes: tuple[str, ...], shape: str | None = None) -> Filter:
    """What an ``add`` describes: 1-3 attributes of a random object, usually with its shape (always ``shape`` if
    set)."""
    obj = random_object(rng, (shape,) if shape else shapes, SIZES)
    return _filter_of(rng, obj, need_shape=shape is not None or rng.random() < 0.8)


def _draw_program(rng: random.Random, objects: list[SceneObject], kind: str, shift: bool) -> CountingProgram:
    shapes = SHAPES + NEW_SHAPES if shift else SHAPES
    # In the domain shift, `first` (an operation of every program) is about an object of an unseen shape.
    pivots = [o for o in objects if o.shape in NEW_SHAPES] if shift else objects
    first = _filter_of(rng, rng.choice(pivots), need_shape=shift)
    everything = Filter()
    if kind == "subtraction":
        return CountingProgram((Operation("subtract", first),), everything, kind)
    if kind == "multihop":
        second = _filter_of(rng, rng.choice(objects))
        while second == first:
            second = _filter_of(rng, rng.choice(objects))
        return CountingProgram((Operation("subtract", first), Operation("subtract", second)), everything, kind)
    if kind == "addition":
        spec = _add_spec(rng, shapes, rng.choice(NEW_SHAPES) if shift else None)
        names = list(spec.items())
        query = everything if rng.random() < 0.5 else Filter(**{n: getattr(spec, n) for n in rng.sample(names, 1)})
        return CountingProgram((Operation("add", spec, rng.randint(1, 3)),), query, kind)
    if kind == "adversarial":
        variant = rng.choice(("absent", "unrelated_subtract", "unrelated_add"))
        absent = _absent_filter(rng, objects, shapes) if variant == "absent" else None
        if absent is not None:
            return CountingProgram((Operation("subtract", absent),), everything, kind)
        if variant == "unrelated_add":
            spec = _add_spec(rng, shapes)
            return CountingProgram(
                (Operation("add", spec, rng.randint(1, 3)),), _unrelated_query(rng, spec, shapes), kind
            )
        return CountingProgram((Operation("subtract", first),), _unrelated_query(rng, first, shapes), kind)
    if kind == "addition_subtraction":
        ops = [Operation("add", _add_spec(rng, shapes), rng.randint(1, 3)), Operation("subtract", first)]
        if rng.random() < 0.5:
            extra = rng.choice(("add", "subtract"))
            spec = _add_spec(rng, shapes) if extra == "add" else _filter_of(rng, rng.choice(objects))
            ops.append(Operation(extra, spec, rng.randint(1, 3) if extra == "add" else 0))
        rng.shuffle(ops)
        return CountingProgram(tuple(ops), everything, kind)
    raise ValueError(f"unknown question type {kind!r}")


def _draw_objects(rng: random.Random, shift: bool) -> list[SceneObject]:
    n = rng.randint(3, 10)
    if not shift:
        return [random_object(rng, SHAPES, SIZES) for _ in range(n)]
    objects = [random_object(rng, NEW_SHAPES, SIZES) for _ in range(2)]
    return objects + [random_object(rng, SHAPES + NEW_SHAPES, SIZES) for _ in range(n - 2)]


def make_sample(seed: int, split: str, index: int, image_size: int = 128, labeled: bool = True) -> VisualSample:
    """Sample ``index`` of ``split``; it depends only on ``(seed, split, index)``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    rng = random.Random(f"rrft-counting:{_SEED_STREAMS[split]}:{seed}:{index}")
    shift = split == "test_domain_shift"
    objects = sample_scene(
        rng, lambda r: _draw_objects(r, shift), lambda s: min(visible_fractions(s, "front", 64)) >= MIN_VISIBLE
    )
    kind = rng.choice(DOMAIN_SHIFT_TYPES if shift else IN_DOMAIN_TYPES)
    attributes = [o.attributes() for o in objects]
    for _ in range(100):
        program = _draw_program(rng, objects, kind, shift)
        try:
            result = execute(attributes, program)
        except AmbiguousProgram:
            continue
        break
    else:  # pragma: no cover - the draws above are decidable far more often than not
        raise RuntimeError(f"no decidable {kind} program for sample {index} of {split}")
    rendering = render(objects, "front", image_size)
    meta = {
        "suite": "counting",
        "split": split,
        "index": index,
        "view": "front",
        "question_type": kind,
        "subset": ("DS-M" if kind == "addition_subtraction" else "DS-D") if shift else "ID",
        "program": {
            "operations": [
                {"kind": op.kind, "target": op.target.items(), "count": op.count} for op in program.operations
            ],
            "query": program.query.items(),
        },
        "objects": [
            {"x": o.x, "y": o.y, "yaw": o.yaw, "box": box} for o, box in zip(objects, rendering.boxes, strict=True)
        ],
        "attributes": attributes,
        "solution": {"answer": result.answer, "totals": [step.total for step in result.steps]},
    }
    answer = str(result.answer) if labeled else None
    reasoning = counting_reasoning(objects, program, result) if labeled and split == "cot_sft" else None
    return VisualSample([rendering.image], program.question(), TASK, answer, reasoning, meta)


class VisualCountingDataset(SplitDataset):
    """``num_samples`` visual counting prompts of one split, rendered lazily (see the module docstring).

    Args:
        num_samples: number of samples.
        seed: seed of the data set; sample ``i`` depends only on ``(seed, split, i)``.
        image_size: side of the square image in pixels.
        split: one of :data:`SPLITS`.
        labeled: when False, ``answer`` and ``reasoning`` are None.

    >>> VisualCountingDataset(2, seed=0, image_size=48, split="cot_sft")[1].reasoning.startswith("There are")
    True
    """

    splits = SPLITS

    def sample(self, index: int) -> VisualSample:
        return make_sample(self.seed, self.split, index, self.image_size, self.labeled)


make_samples = VisualCountingDataset.make_samples
"""Samples ``0 .. num - 1`` of a split, labeled, one at a time (see
:meth:`~app.tasks.reason_rft.split_dataset.SplitDataset.make_samples`)."""

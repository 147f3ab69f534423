"""CoRe metadata-driven triplets (CoRe section 3.2, docs/algorithms.md#papers): annotation source -> metric experts ->
quality control -> question generation, as a torch ``Dataset`` of three-image ``VisualSample`` prompts scored by
TriSR.

Sample ``i`` has task ``tasks[i % len(tasks)]`` (balanced coverage, like CoRe-20K's 5,000 triplets per dimension)
and depends only on ``(seed, i)``: one ``random.Random`` seeded from both draws the triplet-level choices (the object
named by the question), then three scenes, until quality control accepts their values; rejected triplets are
redrawn from the same generator, so the redraws are deterministic too.

``sample.meta`` (JSON):

- ``attributes``, ``pair_answers``, ``answer_type``: the TriSR ground truth (:mod:`app.rewards.trisr_scores`);
- ``task`` (``counting`` / ``depth`` / ``distance`` / ``spatial``), ``template``, ``direction``, ``options`` (pair ->
  option values in the order shown), ``unit``, ``subject`` / ``reference`` (objects named), ``regions`` (depth: the
  boxed region of each image, ``[x0, y0, x1, y1]``), ``image_size``, ``qc_rejections`` (triplets redrawn);
- ``ground_truth``: ``metric_values`` (raw ``v_k``: counts, metres, relation labels), ``answer_positions`` (pair ->
  index of the correct option) and ``annotations`` (per image: crowd points, 3D objects, 2D boxes). Under a label key
  of :data:`app.data.shards.LABEL_META_KEYS`, so label-free shards drop it.

``sample.answer`` / ``sample.reasoning`` hold the target response, which TriSR scores as perfect.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import numpy as np

from app.data.shards import without_labels
from app.tasks.base import SeededDataset
from app.tasks.core.annotations import ImageAnnotation
from app.tasks.core.metrics import RELATIONS, TASKS, measure
from app.tasks.core.quality import DEFAULT_RULES, QualityStats, Rule, quality_check
from app.tasks.core.questions import TASK_TEXTS, build_question
from app.tasks.core.scenes import CATEGORIES, SceneConfig, crowd_scene, object_scene, relation_scene
from app.types import VisualSample

TASK_PREFIX = "core_"
"""``sample.task`` is ``core_<dimension>`` (``core_counting``, ...), so logs split by dimension."""


def _names(task: str, rng: random.Random) -> tuple[str | None, str | None]:
    """The objects a triplet's question names: the distance target, the spatial subject and reference."""
    if task == "distance":
        return rng.choice(CATEGORIES), None
    if task == "spatial":
        subject = rng.choice(CATEGORIES)
        color, shape = subject.split()
        others = [c for c in CATEGORIES if c.split()[0] != color and c.split()[1] != shape]
        return subject, rng.choice(others)
    return None, None


def _scene(
    task: str, rng: random.Random, image_size: int, config: SceneConfig, subject: str | None, reference: str | None
) -> ImageAnnotation:
    if task == "counting":
        return crowd_scene(rng, image_size, rng.randint(*config.count_range), config)
    if task == "depth":
        return object_scene(rng, image_size, query=True, config=config)
    if task == "distance":
        return object_scene(rng, image_size, target=subject, config=config)
    return relation_scene(rng, image_size, subject, reference, rng.choice(RELATIONS), config)


def _mask_box(mask: np.ndarray) -> list[int]:
    ys, xs = np.nonzero(mask)
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


def make_core_triplet(
    task: str,
    rng: random.Random,
    image_size: int = 128,
    rule: Rule | None = None,
    scene: SceneConfig | None = None,
    max_attempts: int = 100,
    stats: QualityStats | None = None,
) -> VisualSample:
    """One accepted triplet of ``task``, drawn from ``rng`` (its only source of randomness).

    Raises:
        RuntimeError: when quality control rejects ``max_attempts`` triplets in a row (the rule and scene ranges
            admit too few triplets).
    """
    if task not in TASKS:
        raise ValueError(f"unknown CoRe task {task!r}; known tasks: {', '.join(TASKS)}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    rule = DEFAULT_RULES[task] if rule is None else rule
    scene = SceneConfig() if scene is None else scene
    subject, reference = _names(task, rng)
    local = QualityStats()
    for _ in range(max_attempts):
        annotations = [_scene(task, rng, image_size, scene, subject, reference) for _ in range(3)]
        values = [measure(task, a, subject, reference) for a in annotations]
        verdict = quality_check(values, rule)
        local.record(task, verdict)
        if stats is not None:
            stats.record(task, verdict)
        if verdict.accepted:
            break
    else:
        reasons = dict(local.rejected[task])
        raise RuntimeError(
            f"quality control rejected {max_attempts} {task} triplets in a row (reasons: {reasons}); "
            f"widen the admissible set {rule} or the scene ranges"
        )
    q = build_question(task, values, rng, subject, reference)
    text = TASK_TEXTS[task]
    meta = {
        "task": task,
        "answer_type": text.answer_type,
        "attributes": q.attributes,
        "pair_answers": q.pair_answers,
        "options": q.options,
        "template": q.template,
        "direction": q.direction,
        "unit": text.unit,
        "image_size": image_size,
        "qc_rejections": local.num_rejected(task),
        "ground_truth": {
            "metric_values": [v if isinstance(v, str | int) else float(v) for v in values],
            "answer_positions": q.answer_positions,
            "annotations": [a.summary() for a in annotations],
        },
    }
    if subject is not None:
        meta["subject"] = subject
    if reference is not None:
        meta["reference"] = reference
    if task == "depth":
        meta["regions"] = [_mask_box(a.region) for a in annotations]
    return VisualSample(
        images=[a.image for a in annotations],
        question=q.question,
        task=TASK_PREFIX + task,
        answer=q.answer,
        reasoning=q.reasoning,
        meta=meta,
    )


class CoreTripletDataset(SeededDataset):
    """``num_samples`` CoRe triplets over ``tasks``, rendered on access; sample ``i`` depends only on ``(seed, i)``.

    Args:
        num_samples: length of the data set.
        seed: data set seed.
        image_size: side of the square images in pixels (128-256 keeps people countable).
        tasks: task dimensions, cycled over the indices.
        labeled: when False, the answer, reasoning and every label-bearing meta key are dropped (see
            :func:`app.data.shards.without_labels`); the label-free ``TripletConsistencyReward`` still applies.
        rules: admissible sets per task, overriding :data:`~app.tasks.core.quality.DEFAULT_RULES`.
        scene: ranges of the procedural scenes.
        max_attempts: triplets drawn per sample before giving up.

    Attributes:
        stats: quality-control counts of the samples built in this process (each data loader worker has its own).
    """

    stream = "core-triplet"

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 128,
        tasks: Sequence[str] = TASKS,
        labeled: bool = True,
        rules: Mapping[str, Rule] | None = None,
        scene: SceneConfig | None = None,
        max_attempts: int = 100,
    ) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
        unknown = [t for t in tasks if t not in TASKS]
        if not tasks or unknown:
            raise ValueError(f"tasks must be a non-empty subset of {TASKS}, got {list(tasks)}")
        if image_size < 64:
            raise ValueError(f"image_size must be >= 64 for the scenes to stay legible, got {image_size}")
        super().__init__(num_samples, seed, image_size)
        self.tasks, self.labeled = tasks, labeled
        self.rules = {**DEFAULT_RULES, **(rules or {})}
        self.scene = scene or SceneConfig()
        self.max_attempts = max_attempts
        self.stats = QualityStats()

    def sample(self, index: int) -> VisualSample:
        task = self.tasks[index % len(self.tasks)]
        sample = make_core_triplet(
            task, self.rng(index), self.image_size, self.rules[task], self.scene, self.max_attempts, self.stats
        )
        return sample if self.labeled else without_labels(sample)

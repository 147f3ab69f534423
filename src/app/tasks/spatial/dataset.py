"""Spatial VQA samples (OT-GRPO, Appendix D, docs/algorithms.md#papers) from procedural scenes or Omni3D annotations.

Sample ``i`` of a data set depends only on ``(seed, i)``. Tasks take turns (``tasks[i % T]``); within a task, its
``k``-th sample has a target answer balanced exactly as in :mod:`app.tasks.dots.dots` (samples ``2j`` and ``2j + 1``
hold one "yes" and one "no"), counts cycle through 2..5 in shuffled blocks of four, and with ``domain="both"`` each
yes/no pair shares a domain, alternating indoor and outdoor. A procedural sample draws scenes until one yields a
question that passes the filters of :mod:`app.tasks.spatial.tasks`.

With real Omni3D annotations, sample ``i`` scans the images from a position drawn from ``(seed, i)`` for the first
that yields a question of its task; answers of boolean tasks are balanced the same way, counts are whatever the
images hold.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from PIL import Image

from app.tasks.base import SeededDataset
from app.tasks.spatial.augment import SpatialPairAugmenter
from app.tasks.spatial.markers import draw_markers
from app.tasks.spatial.omni3d import ImageRecord, load_image
from app.tasks.spatial.render import render_scene
from app.tasks.spatial.scenes import DOMAINS, sample_scene
from app.tasks.spatial.tasks import (
    BOOL_TASKS,
    DEFAULT_CONFIG,
    LABEL_KEY,
    TASK_NAMES,
    SelectionConfig,
    build_question,
    explain,
)
from app.tasks.spatial.templates import render_question
from app.types import VisualSample

COUNT_CATEGORIES = {"indoor": ("chair", "lamp", "table"), "outdoor": ("car", "pedestrian", "tree")}
"""Categories procedural counting scenes repeat (small enough for five to fit in view)."""
_MAX_SCENES = 50


def make_sample(image: Image.Image, meta: dict, labeled: bool = True) -> VisualSample:
    """The sample of a question: markers drawn on ``image``, question rendered, answer and reasoning when labeled."""
    meta = copy.deepcopy(meta)
    if not labeled:
        meta.pop(LABEL_KEY, None)
    return VisualSample(
        images=[draw_markers(image, meta["markers"])],
        question=render_question(meta),
        task=f"spatial_{meta['spatial_task']}",
        answer=meta.get(LABEL_KEY),
        reasoning=explain(meta) if labeled else None,
        meta=meta,
    )


def make_spatial_sample(
    rng: random.Random,
    task: str,
    domain: str = "indoor",
    image_size: int = 256,
    answer: str | None = None,
    config: SelectionConfig = DEFAULT_CONFIG,
    sample_id: str | None = None,
    labeled: bool = True,
) -> VisualSample:
    """One procedural sample of ``task`` in ``domain`` (the answer aimed for, or drawn when None)."""
    if task not in TASK_NAMES:
        raise ValueError(f"unknown spatial task {task!r}; expected one of {TASK_NAMES}")
    for _ in range(_MAX_SCENES):
        required = None
        if task == "counting":
            count = int(answer) if answer is not None else rng.randint(*config.count_range)
            required = (rng.choice(COUNT_CATEGORIES[domain]), count)
        scene = sample_scene(rng, domain, image_size, (1, 3) if required else (3, 6), required)
        image, record = render_scene(scene, sample_id)
        meta = build_question(record, task, rng, None if task == "counting" and answer is None else answer, config)
        if meta is not None:
            meta["sample_id"] = sample_id
            return make_sample(image, meta, labeled)
    raise RuntimeError(f"no {domain} scene out of {_MAX_SCENES} yielded a {task!r} question (answer {answer!r})")


def balanced_answer(seed: int, task: str, k: int, config: SelectionConfig = DEFAULT_CONFIG) -> str | None:
    """The target answer of a task's ``k``-th sample: yes/no balanced in pairs, counts cycling in blocks."""
    if task in BOOL_TASKS:
        first_is_yes = random.Random(f"spatial-answer:{seed}:{task}:{k // 2}").random() < 0.5
        return "yes" if (k % 2 == 0) == first_is_yes else "no"
    if task == "counting":
        counts = list(range(config.count_range[0], config.count_range[1] + 1))
        random.Random(f"spatial-count:{seed}:{k // len(counts)}").shuffle(counts)
        return str(counts[k % len(counts)])
    return None


def _check_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    tasks = tuple(tasks)
    unknown = [t for t in tasks if t not in TASK_NAMES]
    if not tasks or unknown:
        raise ValueError(f"tasks must be a non-empty subset of {TASK_NAMES}, got {list(tasks)}")
    return tasks


class SpatialVQADataset(SeededDataset):
    """``num_samples`` procedural spatial questions, rendered on access; sample ``i`` depends only on ``(seed, i)``.

    Args:
        num_samples: length of the data set.
        seed: data set seed.
        image_size: side of the square images in pixels.
        tasks: the tasks, taking turns (default: the four boolean tasks, which share the ``bool`` answer type).
        domain: ``"indoor"`` (the paper's training domain), ``"outdoor"`` or ``"both"``.
        labeled: when False, no answer, reasoning or ground truth in meta (label-free training).
        paired: return ``(x, x')`` pairs made by :class:`SpatialPairAugmenter` (for consistency rewards).
        transform_prob: probability of each transform when ``paired``.
        config: filter and selection thresholds.
    """

    stream = "spatial"

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 256,
        tasks: Sequence[str] = BOOL_TASKS,
        domain: str = "indoor",
        labeled: bool = True,
        paired: bool = False,
        transform_prob: float = 0.5,
        config: SelectionConfig | None = None,
    ) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if domain not in (*DOMAINS, "both"):
            raise ValueError(f"domain must be one of {(*DOMAINS, 'both')}, got {domain!r}")
        if image_size < 32:
            raise ValueError(f"image_size must be >= 32, got {image_size}")
        super().__init__(num_samples, seed, image_size)
        self.tasks = _check_tasks(tasks)
        self.domain, self.labeled, self.paired = domain, labeled, paired
        self.config = config or SelectionConfig()
        self.augmenter = SpatialPairAugmenter(transform_prob)

    def spec(self, index: int) -> tuple[str, str, str | None]:
        """``(task, domain, target answer)`` of sample ``index``."""
        task, k = self.tasks[index % len(self.tasks)], index // len(self.tasks)
        domain = DOMAINS[(k // 2) % 2] if self.domain == "both" else self.domain
        return task, domain, balanced_answer(self.seed, task, k, self.config)

    def sample(self, index: int) -> VisualSample | tuple[VisualSample, VisualSample]:
        task, domain, answer = self.spec(index)
        sample_id = f"{self.stream}:{self.seed}:{index}"  # also the key of the sample's generator
        sample = make_spatial_sample(
            self.rng(index), task, domain, self.image_size, answer, self.config, sample_id, self.labeled
        )
        if self.paired:
            return self.augmenter(sample, random.Random(f"spatial-pair:{self.seed}:{index}"))
        return sample


def omni3d_samples(
    records: Sequence[ImageRecord],
    num: int,
    seed: int,
    tasks: Sequence[str] = BOOL_TASKS,
    image_root: str | Path | None = None,
    labeled: bool = True,
    config: SelectionConfig = DEFAULT_CONFIG,
) -> Iterator[VisualSample]:
    """``num`` questions about real Omni3D images (see the module docstring); ``ValueError`` when no image yields a
    question of some task."""
    tasks = _check_tasks(tasks)
    if not records:
        raise ValueError("no Omni3D images to build questions from")
    order = list(range(len(records)))
    random.Random(f"spatial-omni3d-order:{seed}").shuffle(order)
    for i in range(num):
        task, k = tasks[i % len(tasks)], i // len(tasks)
        answer = balanced_answer(seed, task, k, config) if task in BOOL_TASKS else None
        sample_id = f"omni3d:{seed}:{i}"
        rng = random.Random(sample_id)
        start = rng.randrange(len(records))
        for step in range(len(records)):
            record = records[order[(start + step) % len(records)]]
            meta = build_question(record, task, rng, answer, config)
            if meta is not None:
                meta["sample_id"] = sample_id
                yield make_sample(load_image(record, image_root), meta, labeled)
                break
        else:
            raise ValueError(f"no image of the {len(records)} Omni3D images yields a {task!r} question")

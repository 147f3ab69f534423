"""Generation prompts from the VBVR-Pro task suite, for flow-GRPO with the task scorers as rewards.

Item i is a :class:`~app.types.VisualSample` whose ``question`` is the generator's prompt and whose ``meta["vbvr"]``
holds what :class:`~app.tasks.vbvr.reward.VBVRScorerReward` checks (task, parameters, configuration); the problem image
(first frame) is ``images[0]`` for image-to-image or image-to-video conditioning. Tasks rotate over the suite; instance
seeds derive from ``(seed, i)``.

>>> sample = VBVRPromptDataset(num_samples=2, seed=0, image_size=64, tasks=["object_counting"])[0]
>>> sample.task, sorted(sample.meta["vbvr"]), sample.meta["split"]
('object_counting', ['config', 'key_frame_indices', 'num_frames', 'params', 'task'], 'in_domain')
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image

from app.tasks.base import SeededDataset
from app.tasks.vbvr.registry import TASKS, get_task
from app.tasks.vbvr.shards import task_params
from app.types import VisualSample


class VBVRPromptDataset(SeededDataset):
    """``num_samples`` prompts cycling over ``tasks`` (all registered tasks by default) and over ``split``.

    Args:
        num_samples: number of prompts (>= 0).
        seed: data set seed; prompt ``i``'s task instance depends only on ``(seed, i)``.
        image_size: side of the square problem (and solution) images in pixels; the tasks' scenes are drawn at
            this size.
        tasks: task names; None: every registered task.
        split: ``in_domain``, ``out_of_domain`` or a list of both (item ``i`` takes task ``i mod n_tasks`` and split
            ``(i // n_tasks) mod n_splits``, so every split holds every task); ``meta["split"]`` names it.
        with_solution: ``images = [problem, solution]`` (the first and last frames), the pairs that flow-matching
            pretraining of an image-conditioned model learns from; False: ``images = [problem]``.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 128,
        tasks: Sequence[str] | None = None,
        split: str | Sequence[str] = "in_domain",
        with_solution: bool = False,
    ) -> None:
        self.tasks = sorted(tasks or TASKS)
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"unknown VBVR tasks {unknown}; known: {sorted(TASKS)}")
        super().__init__(num_samples, seed, image_size)
        self.splits = [split] if isinstance(split, str) else list(split)
        if not self.splits:
            raise ValueError("split must name at least one split")
        self.split = self.splits[0]
        self.with_solution = with_solution
        self.params = {(name, s): task_params(name, s, image_size) for name in self.tasks for s in self.splits}

    def sample(self, index: int) -> VisualSample:
        name = self.tasks[index % len(self.tasks)]
        split = self.splits[(index // len(self.tasks)) % len(self.splits)]
        params = self.params[name, split]
        instance = get_task(name, **params).generate(self.seed * 1_000_003 + index)
        spec = {
            "task": name,
            "params": params,
            "config": instance.config,
            "key_frame_indices": list(instance.key_frame_indices),
            "num_frames": len(instance.frames),
        }
        images = [Image.fromarray(instance.first_frame)]
        if self.with_solution:
            images.append(Image.fromarray(instance.last_frame))
        return VisualSample(images, instance.prompt, name, meta={"vbvr": spec, "split": split})

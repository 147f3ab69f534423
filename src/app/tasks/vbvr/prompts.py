"""Generation prompts from the VBVR-Pro task suite, for flow-GRPO with the task scorers as rewards.

Item i is a :class:`~app.types.VisualSample` whose ``question`` is the generator's prompt and whose
``meta["vbvr"]`` holds what :class:`~app.rewards.vbvr.VBVRScorerReward` checks (task, parameters, configuration); the
problem image (first frame) is ``images[0]`` for image-to-image or image-to-video conditioning. Tasks rotate over
the suite; instance seeds derive from ``(seed, i)``.

>>> sample = VBVRPromptDataset(num_samples=2, seed=0, image_size=64, tasks=["object_counting"])[0]
>>> sample.task, sorted(sample.meta["vbvr"])
('object_counting', ['config', 'params', 'task'])
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image

from app.tasks.base import SeededDataset
from app.tasks.vbvr.shards import task_params
from app.types import VisualSample
from app.vbvr.registry import TASKS, get_task


class VBVRPromptDataset(SeededDataset):
    """``num_samples`` prompts cycling over ``tasks`` (all registered tasks by default) for one split."""

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 128,
        tasks: Sequence[str] | None = None,
        split: str = "in_domain",
    ) -> None:
        self.tasks = sorted(tasks or TASKS)
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"unknown VBVR tasks {unknown}; known: {sorted(TASKS)}")
        super().__init__(num_samples, seed, image_size)
        self.split = split
        self.params = {name: task_params(name, split, image_size) for name in self.tasks}

    def sample(self, index: int) -> VisualSample:
        name = self.tasks[index % len(self.tasks)]
        params = self.params[name]
        instance = get_task(name, **params).generate(self.seed * 1_000_003 + index)
        spec = {"task": name, "params": params, "config": instance.config}
        return VisualSample([Image.fromarray(instance.first_frame)], instance.prompt, name, meta={"vbvr": spec})

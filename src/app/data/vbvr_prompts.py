"""Generation prompts from the VBVR-Pro task suite, for flow-GRPO with the task scorers as rewards.

Item i is a :class:`~app.types.VisualSample` whose ``question`` is the generator's prompt and whose
``meta["vbvr"]`` holds what :class:`~app.vbvr.reward.VBVRScorerReward` checks (task, parameters, configuration); the
problem image (first frame) is ``images[0]`` for image-to-image or image-to-video conditioning. Tasks rotate over
the suite; instance seeds derive from ``(seed, i)``.

>>> sample = VBVRPromptDataset(num_samples=2, seed=0, image_size=64, tasks=["object_counting"])[0]
>>> sample.task, sorted(sample.meta["vbvr"])
('object_counting', ['config', 'params', 'task'])
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image
from torch.utils.data import Dataset

from app.types import VisualSample
from app.vbvr import TASKS, get_task
from app.vbvr.shards import task_params


class VBVRPromptDataset(Dataset):
    """``num_samples`` prompts cycling over ``tasks`` (all registered tasks by default) for one split."""

    def __init__(
        self,
        num_samples: int,
        seed: int,
        image_size: int = 128,
        tasks: Sequence[str] | None = None,
        split: str = "in_domain",
    ) -> None:
        get_task("object_counting")  # registers the built-in tasks
        self.tasks = sorted(tasks or TASKS)
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"unknown VBVR tasks {unknown}; known: {sorted(TASKS)}")
        self.num_samples, self.seed, self.image_size, self.split = num_samples, seed, image_size, split
        self.params = {name: task_params(name, split, image_size) for name in self.tasks}

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> VisualSample:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        name = self.tasks[index % len(self.tasks)]
        params = self.params[name]
        instance = get_task(name, **params).generate(self.seed * 1_000_003 + index)
        spec = {"task": name, "params": params, "config": instance.config}
        return VisualSample([Image.fromarray(instance.first_frame)], instance.prompt, name, meta={"vbvr": spec})

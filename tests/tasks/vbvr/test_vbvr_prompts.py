"""VBVR prompts for flow-GRPO: deterministic, cycling over tasks, carrying what the scorer reward needs."""

import numpy as np
import pytest

from app.data import VisualTaskDataModule
from app.tasks.vbvr import get_task
from app.tasks.vbvr.prompts import VBVRPromptDataset


def test_prompts_cycle_over_tasks_and_carry_the_scorer_spec():
    data = VBVRPromptDataset(num_samples=4, seed=0, image_size=128, tasks=["maze_path", "object_counting"])
    samples = [data[i] for i in range(4)]
    assert [s.task for s in samples] == ["maze_path", "object_counting", "maze_path", "object_counting"]
    for sample in samples:
        spec = sample.meta["vbvr"]
        task = get_task(spec["task"], **spec["params"])
        assert sample.question and sample.images[0].size == (128, 128)
        assert task.score(np.asarray(sample.images[0]), spec["config"]).score < 1.0  # the problem is not yet solved


def test_same_seed_same_prompts():
    a, b = (
        VBVRPromptDataset(3, seed=1, image_size=64, tasks=["object_counting"]),
        VBVRPromptDataset(3, seed=1, image_size=64, tasks=["object_counting"]),
    )
    assert [a[i].meta for i in range(3)] == [b[i].meta for i in range(3)]


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown VBVR tasks"):
        VBVRPromptDataset(1, seed=0, tasks=["nope"])


def test_served_by_the_datamodule():
    data = VisualTaskDataModule(
        dataset=VBVRPromptDataset, train_size=4, val_size=2, test_size=2, batch_size=2, image_size=128
    )
    data.setup()
    assert len(next(iter(data.train_dataloader()))) == 2

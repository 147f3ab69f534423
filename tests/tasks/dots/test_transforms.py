"""The transformation task: determinism, two images, labels in the step syntax, pixels that change where objects do."""

import numpy as np
import pytest

from app.data import VisualTaskDataModule
from app.rewards.function_sequence import function_sequence_reward
from app.rewards.parsing import parse_steps
from app.tasks.dots import TransformDataset
from app.tasks.dots.transforms import CELLS, FUNCTIONS, GRID, QUESTION, TASK


def changed_cells(sample) -> set[int]:
    """Grid cells (indices into CELLS) in which the two images differ in any pixel."""
    before, after = (np.asarray(image) for image in sample.images)
    ys, xs = np.nonzero(np.any(before != after, axis=-1))
    size = sample.images[0].size[0]
    return {int(y * GRID // size) * GRID + int(x * GRID // size) for y, x in zip(ys, xs, strict=True)}


def test_deterministic_per_seed_and_index():
    a, b, other = TransformDataset(8, seed=3), TransformDataset(8, seed=3), TransformDataset(8, seed=4)
    for i in range(8):
        assert [im.tobytes() for im in a[i].images] == [im.tobytes() for im in b[i].images]
        assert (a[i].answer, a[i].meta) == (b[i].answer, b[i].meta)
    assert [a[i].answer for i in range(8)] != [other[i].answer for i in range(8)]


@pytest.mark.parametrize("image_size, num_objects, max_steps", [(64, 3, 2), (96, 5, 3), (48, 2, 1)])
def test_samples_are_well_formed(image_size, num_objects, max_steps):
    dataset = TransformDataset(40, seed=0, image_size=image_size, num_objects=num_objects, max_steps=max_steps)
    step_counts = set()
    for sample in dataset:
        assert sample.task == TASK and sample.question == QUESTION
        assert len(sample.images) == 2 and all(im.size == (image_size, image_size) for im in sample.images)
        steps = parse_steps(sample.answer)
        assert steps is not None and 1 <= len(steps) <= max_steps
        assert len({s.obj for s in steps}) == len(steps) and {s.function for s in steps} <= set(FUNCTIONS)
        step_counts.add(len(steps))
        # the ground truth, in the Reason-RFT response format, earns the full function-sequence reward
        target = f"<think>{sample.reasoning}</think><answer>{sample.answer}</answer>"
        assert function_sequence_reward([target], [sample.answer]).item() == 1.0
        # objects are named left to right (top to bottom within a column) in the initial scene
        before, after = sample.meta["before"], sample.meta["after"]
        assert len(before) == num_objects
        assert [(o["cell"] % GRID, o["cell"] // GRID) for o in before] == sorted(
            (o["cell"] % GRID, o["cell"] // GRID) for o in before
        )
        # each step matches the object specs, and nothing else changed
        changed = {int(s.obj.removeprefix("obj_")) - 1 for s in steps}
        assert changed == set(sample.meta["changed"])
        for s in steps:
            i = int(s.obj.removeprefix("obj_")) - 1
            field = s.function.removeprefix("change_")
            new = CELLS[after[i]["cell"]] if field == "position" else after[i][field]
            assert new == s.value and before[i] != after[i]
        assert all(before[i] == after[i] for i in range(num_objects) if i not in changed)
        # the images differ exactly in the cells of changed objects (before and after), and in each of them
        cells = {o["cell"] for i in changed for o in (before[i], after[i])}
        assert changed_cells(sample) == cells
    assert step_counts == set(range(1, max_steps + 1))


def test_unlabeled_keeps_scene_and_drops_labels():
    labeled, unlabeled = TransformDataset(4, seed=1)[2], TransformDataset(4, seed=1, labeled=False)[2]
    assert unlabeled.answer is None and unlabeled.reasoning is None
    assert [im.tobytes() for im in unlabeled.images] == [im.tobytes() for im in labeled.images]
    assert unlabeled.meta == labeled.meta and unlabeled.question == labeled.question


def test_served_and_validated():
    dm = VisualTaskDataModule(dataset=TransformDataset, train_size=4, val_size=2, test_size=2, image_size=64)
    dm.setup()
    assert len(dm.train_dataset[0].images) == 2
    with pytest.raises(ValueError):
        TransformDataset(4, seed=0, num_objects=2, max_steps=3)
    with pytest.raises(ValueError):
        TransformDataset(4, seed=0, num_objects=6, max_steps=4)
    with pytest.raises(IndexError):
        TransformDataset(4, seed=0)[4]

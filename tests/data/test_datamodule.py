import pytest
import torch

from app.data.datamodule import TASKS, VisualTaskDataModule, collate_visual_samples
from app.types import VisualSample


def image_bytes(sample: VisualSample) -> bytes:
    return sample.images[0].tobytes()


def small_datamodule(**kwargs) -> VisualTaskDataModule:
    args = dict(train_size=20, val_size=10, test_size=10, batch_size=4, val_batch_size=6, image_size=48)
    dm = VisualTaskDataModule(**{**args, **kwargs})
    dm.setup("fit")
    return dm


def test_loaders_yield_lists_of_samples_of_the_right_sizes():
    dm = small_datamodule()
    train = list(dm.train_dataloader())
    assert [len(b) for b in train] == [4] * 5
    assert all(isinstance(s, VisualSample) and s.images[0].size == (48, 48) for b in train for s in b)
    assert [len(b) for b in dm.val_dataloader()] == [6, 4]
    assert [len(b) for b in dm.test_dataloader()] == [6, 4]


def test_train_drops_last_partial_batch():
    dm = small_datamodule(train_size=10, batch_size=4)
    assert [len(b) for b in dm.train_dataloader()] == [4, 4]


def test_train_shuffles_with_the_seed_and_val_does_not():
    def order(dm, loader):
        return [image_bytes(s) for b in getattr(dm, loader)() for s in b]

    dm, again = small_datamodule(seed=1), small_datamodule(seed=1)
    assert order(dm, "train_dataloader") == order(again, "train_dataloader")
    in_index_order = [image_bytes(dm.train_dataset[i]) for i in range(20)]
    assert order(dm, "train_dataloader") != in_index_order
    assert order(dm, "val_dataloader") == [image_bytes(dm.val_dataset[i]) for i in range(10)]


def test_splits_are_disjoint():
    dm = small_datamodule(train_size=200, val_size=50, test_size=50)
    datasets = (dm.train_dataset, dm.val_dataset, dm.test_dataset)
    splits = [{image_bytes(ds[i]) for i in range(len(ds))} for ds in datasets]
    assert [len(s) for s in splits] == [200, 50, 50]
    assert not (splits[0] & splits[1]) and not (splits[0] & splits[2]) and not (splits[1] & splits[2])


def test_task_kwargs_reach_the_dataset():
    dm = small_datamodule(task_kwargs={"labeled": False})
    assert all(s.answer is None for s in next(iter(dm.val_dataloader())))


def test_unknown_task_lists_known_tasks():
    with pytest.raises(ValueError, match="unknown task 'nope'.*dots_left_of"):
        VisualTaskDataModule(task="nope")
    assert "dots_left_of" in TASKS


def test_collate_keeps_samples():
    samples = [VisualSample(images=[], question="q", task="t"), VisualSample(images=[], question="r", task="t")]
    assert collate_visual_samples(samples) == samples
    assert not any(isinstance(x, torch.Tensor) for x in collate_visual_samples(samples))

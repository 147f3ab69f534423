import functools
import io
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from app.data.datamodule import VisualTaskDataModule, collate_visual_samples, split_seed
from app.tasks.dots import DotsDataset
from app.types import VisualSample


def image_bytes(sample: VisualSample) -> bytes:
    return sample.images[0].tobytes()


def small_datamodule(**kwargs) -> VisualTaskDataModule:
    args = dict(
        dataset=DotsDataset, train_size=20, val_size=10, test_size=10, batch_size=4, val_batch_size=6, image_size=48
    )
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


def test_dataset_arguments_reach_the_dataset():
    dm = small_datamodule(dataset=functools.partial(DotsDataset, labeled=False))
    assert all(s.answer is None for s in next(iter(dm.val_dataloader())))


def test_each_split_calls_the_factory_with_its_size_seed_and_image_size():
    calls = []

    def factory(num_samples, seed, image_size):
        calls.append((num_samples, seed, image_size))
        return DotsDataset(num_samples, seed, image_size)

    dm = small_datamodule(dataset=factory, seed=5, train_size=20, val_size=10, test_size=6)
    assert calls == [(20, split_seed(5, "train"), 48), (10, split_seed(5, "val"), 48), (6, split_seed(5, "test"), 48)]
    assert len({seed for _, seed, _ in calls}) == 3
    dm.setup("fit")
    assert len(calls) == 3  # built once


def test_dataset_must_be_a_factory():
    with pytest.raises(TypeError, match="dataset must be a data set class or factory"):
        VisualTaskDataModule(dataset="dots_left_of")


def test_collate_keeps_samples():
    samples = [VisualSample(images=[], question="q", task="t"), VisualSample(images=[], question="r", task="t")]
    assert collate_visual_samples(samples) == samples
    assert not any(isinstance(x, torch.Tensor) for x in collate_visual_samples(samples))


def test_hyperparameters_hold_the_dataset_as_plain_data_that_checkpoints_load():
    dm = small_datamodule(dataset=functools.partial(DotsDataset, dot_radius=3))
    assert dm.hparams["dataset"] == {"class_path": "app.tasks.dots.dots.DotsDataset", "init_args": {"dot_radius": 3}}
    assert small_datamodule().hparams["dataset"] == {"class_path": "app.tasks.dots.dots.DotsDataset"}
    buffer = io.BytesIO()
    torch.save(dict(dm.hparams), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["dataset"] == dm.hparams["dataset"]


def test_resume_state_continues_the_epoch_where_it_stopped():
    full = [image_bytes(s) for b in small_datamodule(seed=2).train_dataloader() for s in b]
    dm = small_datamodule(seed=2)
    dm.load_state_dict({"epoch": 0, "batches_done": 2, "samples_done": 8})
    resumed = [image_bytes(s) for b in dm.train_dataloader() for s in b]
    assert resumed == full[2 * 4 :]
    assert [image_bytes(s) for b in dm.train_dataloader() for s in b] == full  # the next pass starts the epoch over


def test_every_rank_resumes_its_own_share_from_the_one_state_rank_0_saves():
    """The state holds nothing per rank (Lightning saves rank 0's): each of two ranks, given that same state, continues
    its own share of the epoch where it stood."""

    def on_rank(rank: int) -> VisualTaskDataModule:
        dm = small_datamodule(seed=2)
        dm.trainer = SimpleNamespace(
            distributed_sampler_kwargs={"num_replicas": 2, "rank": rank},
            _accelerator_connector=SimpleNamespace(use_distributed_sampler=True),
            state=SimpleNamespace(fn="fit"),
            current_epoch=0,
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_idx=0)),
        )
        return dm

    shares = [[image_bytes(s) for b in on_rank(rank).train_dataloader() for s in b] for rank in (0, 1)]
    states = [on_rank(rank).state_dict() for rank in (0, 1)]
    assert states[0] == states[1] == {"epoch": 0, "batches_done": 1, "samples_done": 8}
    for rank in (0, 1):
        dm = on_rank(rank)
        dm.load_state_dict(states[0])
        assert [image_bytes(s) for b in dm.train_dataloader() for s in b] == shares[rank][4:], f"rank {rank}"
    assert not set(shares[0]) & set(shares[1])


def on_ranks(rank: int, world: int, batch_idx: int = 0, **kwargs) -> VisualTaskDataModule:
    """A data module as rank ``rank`` of ``world`` sees it, its trainer's loop at ``batch_idx`` of epoch 0."""
    dm = small_datamodule(**{"seed": 2, "train_size": 23, "batch_size": 2, **kwargs})
    dm.trainer = SimpleNamespace(
        distributed_sampler_kwargs={"num_replicas": world, "rank": rank},
        _accelerator_connector=SimpleNamespace(use_distributed_sampler=True),
        state=SimpleNamespace(fn="fit"),
        current_epoch=0,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_idx=batch_idx)),
    )
    return dm


def keys(batches) -> list[bytes]:
    return [image_bytes(s) for b in batches for s in b]


def epoch_order(dm: VisualTaskDataModule) -> list[bytes]:
    """The training samples in epoch 0's permutation, all of them."""
    from app.data.sampler import ResumableShuffleSampler

    return [image_bytes(dm.train_dataset[i]) for i in ResumableShuffleSampler(len(dm.train_dataset), dm.seed)]


@pytest.mark.parametrize("world", [1, 4])
def test_a_state_saved_on_two_ranks_resumes_on_another_number_at_the_global_sample_index(world):
    """Two ranks trained 2 batches of 2 each: the first 8 samples of the epoch's order. Resumed on ``world`` ranks,
    the ranks share the rest: no sample trained before is drawn again (but for padding), none after is left out."""
    order = epoch_order(on_ranks(0, 1))
    state = on_ranks(0, 2, batch_idx=1).state_dict()
    assert state == {"epoch": 0, "batches_done": 2, "samples_done": 8}
    resumed, lengths = [], []
    for rank in range(world):
        dm = on_ranks(rank, world)
        dm.load_state_dict(state)
        loader = dm.train_dataloader()
        lengths.append(len(loader))
        resumed.append(keys(loader))
    if world == 1:  # the 15 left, in order, in 7 whole batches (the last sample dropped, as every epoch drops it)
        assert resumed == [order[8:22]] and lengths == [11]
    else:  # 15 left + 1 padding from the epoch's head: 4 per rank, 2 batches after the 2 the trainer counted
        assert sorted(sum(resumed, [])) == sorted(order[8:] + order[:1])
        assert [len(r) for r in resumed] == [4] * 4 and lengths == [4] * 4


def test_a_state_saved_after_a_resume_on_another_number_of_ranks_counts_from_the_resume_point():
    """Resumed on one rank after 8 samples (2 batches on 2 ranks), 2 more batches of 2 bring it to 12 samples, though
    the trainer's loop counts 4 batches of the epoch."""
    dm = on_ranks(0, 1)
    dm.load_state_dict({"epoch": 0, "batches_done": 2, "samples_done": 8})
    dm.train_dataloader()
    dm.trainer.fit_loop.epoch_loop.batch_idx = 3
    assert dm.state_dict() == {"epoch": 0, "batches_done": 4, "samples_done": 12}
    dm.trainer.current_epoch = 1  # a new epoch counts from its start
    dm.trainer.fit_loop.epoch_loop.batch_idx = 0
    assert dm.state_dict() == {"epoch": 1, "batches_done": 1, "samples_done": 2}


class _Seen(L.LightningModule):
    """Records the prompts of every training batch, by epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[bytes]] = {}

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.trainer.current_epoch, []).extend(image_bytes(s) for s in batch)
        return (self.weight - 1.0).pow(2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_fit_resumed_on_one_process_from_two_ranks_state_trains_the_rest_of_the_epoch_then_whole_epochs(tmp_path):
    """A checkpoint of step 3 whose data state is a 2-rank run's (3 batches of 2 on each: 12 samples drawn): resumed
    in one process, the epoch ends with the 12 samples left (Lightning's batch count, 3 + 6, stays under its limit of
    12), and the next epoch is whole."""
    make = functools.partial(small_datamodule, train_size=24, batch_size=2, val_size=0, test_size=0)
    order = epoch_order(make())
    every_3 = ModelCheckpoint(tmp_path, "{step}", every_n_train_steps=3, save_top_k=-1)  # mid-epoch, as training goes
    trainer = L.Trainer(
        max_steps=4,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[every_3],
        default_root_dir=tmp_path,
    )
    trainer.fit(_Seen(), make())
    checkpoint = torch.load(tmp_path / "step=3.ckpt", weights_only=True)
    (key,) = [k for k in checkpoint if k.endswith("VisualTaskDataModule")]
    assert checkpoint[key] == {"epoch": 0, "batches_done": 3, "samples_done": 6}
    checkpoint[key] = {"epoch": 0, "batches_done": 3, "samples_done": 12}
    torch.save(checkpoint, tmp_path / "two_ranks.ckpt")
    module = _Seen()
    trainer = L.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, make(), ckpt_path=tmp_path / "two_ranks.ckpt")
    assert module.seen[0] == order[12:]
    assert sorted(module.seen[1]) == sorted(order) and trainer.global_step == 3 + 6 + 12

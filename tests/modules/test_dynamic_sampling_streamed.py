"""Dynamic sampling on streamed shards (``ShardDataModule``): extra prompts come from a second, seeded pass over the
training stream that leaves the main loader alone, cycles past the end of an epoch, splits between ranks like the
main stream and resumes from a checkpoint where it stood."""

import io
import logging
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import IterableDataset

from app.data import ShardDataModule
from app.data.shards import write_samples
from app.modules import VLMGRPOModule
from app.modules.prompt_drawers import IndexDrawer, StreamDrawer
from app.modules.rollout_queue import RolloutQueue
from app.rewards import RewardComponent
from app.settings import OptimizerSettings, PipelineSettings, SamplingSettings
from app.tasks.dots import DotsDataset

NUM_SHARDS, PER_SHARD, B, CAP = 4, 4, 2, 2
NUM_SAMPLES = NUM_SHARDS * PER_SHARD


def numbered(n: int):
    """``n`` dots samples whose question and ``meta["index"]`` carry their index: an identity through the stream."""
    dataset = DotsDataset(num_samples=n, seed=0, image_size=64, dot_radius=12)
    out = []
    for i in range(n):
        sample = dataset[i]
        sample.question = f"[{i}] {sample.question}"
        sample.meta["index"] = i
        out.append(sample)
    return out


def indices(samples) -> list[int]:
    return [s.meta["index"] for s in samples]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("shards")
    write_samples(numbered(NUM_SAMPLES), out, "train", max_per_shard=PER_SHARD)
    return f"{out}/train-{{000000..{NUM_SHARDS - 1:06d}}}.tar"


def shard_data(urls: str, **kwargs) -> ShardDataModule:
    return ShardDataModule(train_urls=urls, **{"batch_size": B, "shuffle_buffer": 4, "seed": 3, **kwargs})


class Flat(RewardComponent):
    """The same reward for every completion: every group is flat, so every step refills up to its cap."""

    def score(self, completions, samples):
        return torch.ones(len(completions))


class Recording(VLMGRPOModule):
    """Keeps the prompts of each main batch and of each extra rollout (with the step that drew it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[list[int]] = []
        self.extra: list[tuple[int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.batches.append(indices(batch))
        return super().training_step(batch, batch_idx)

    def rollout(self, samples):
        self.extra.append((self.global_step, indices(samples)))
        return super().rollout(samples)


def grpo(new_policy, dynamic_sampling: bool = True) -> Recording:
    L.seed_everything(0)
    return Recording(
        new_policy("tiny-qwen2-vl", lora_r=4),
        rewards=[Flat()],
        sampling=SamplingSettings(group_size=2, max_new_tokens=4),
        optimizer=OptimizerSettings(learning_rate=1e-2),
        pipeline=PipelineSettings(dynamic_sampling=dynamic_sampling, max_extra_rollouts=CAP, seed=5),
        eval_max_new_tokens=4,
    )


@pytest.fixture(scope="module")
def straight(shards, new_policy, fit, tmp_path_factory):
    """An uninterrupted 3-step fit with dynamic sampling, saving a checkpoint after every step."""
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    module = grpo(new_policy)
    saving = ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=1, save_top_k=-1)
    _, recorder = fit(module, shard_data(shards), max_steps=3, callbacks=[saving], enable_checkpointing=True)
    return module, recorder, checkpoints


# ---------------------------------------------------------------------------------------------------- in a fit
def test_a_fit_on_shards_refills_from_the_shards_and_leaves_the_main_stream_alone(straight, shards, new_policy, fit):
    module, recorder, _ = straight
    assert recorder.metric("train/dynamic/extra_rollouts") == [float(CAP)] * 3
    assert [step for step, _ in module.extra] == [0, 0, 1, 1, 2, 2]
    drawn = [i for _, prompts in module.extra for i in prompts]
    assert len(drawn) == 3 * CAP * B and set(drawn) <= set(range(NUM_SAMPLES))  # shard samples, by their identity
    plain = grpo(new_policy, dynamic_sampling=False)
    fit(plain, shard_data(shards), max_steps=3)
    assert module.batches == plain.batches and len(plain.batches) == 3  # the main stream did not move
    main = [i for batch in module.batches for i in batch] + indices(
        s for batch in list(shard_data(shards).train_dataloader())[3:] for s in batch
    )
    assert drawn != main[: len(drawn)], "the extra prompts replay the main stream: not an independent pass"


def test_a_resumed_fit_draws_the_extra_prompts_of_the_uninterrupted_one(straight, shards, new_policy, fit):
    module, _, checkpoints = straight
    resumed = grpo(new_policy)
    torch.manual_seed(12345)  # only the checkpoint can bring back where the run stood
    trainer, recorder = fit(
        resumed, shard_data(shards), max_steps=3, ckpt_path=str(checkpoints / "epoch=0-step=2.ckpt")
    )
    assert trainer.global_step == 3 and recorder.metric("train/dynamic/extra_rollouts") == [float(CAP)]
    assert resumed.batches == module.batches[2:]
    saved = torch.load(checkpoints / "epoch=0-step=2.ckpt", weights_only=True)["rollout_pipeline"][0]["drawer"]
    assert saved["position"]["batches"] == 2 * CAP * B  # the refill stream's items drawn in the first two steps
    assert resumed.extra == [(step, prompts) for step, prompts in module.extra if step == 2]


# ------------------------------------------------------------------------------------------------- the drawer
def train_loader(urls: str, rank: int = 0, world_size: int = 1, **kwargs):
    """The data module's training loader on rank ``rank`` of ``world_size`` (a stand-in trainer says which)."""
    dm = shard_data(urls, **kwargs)
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world_size, current_epoch=0, loggers=[])
    return dm.train_dataloader()


def train_stream(urls: str, rank: int = 0, world_size: int = 1, **kwargs):
    return train_loader(urls, rank, world_size, **kwargs).stream


def test_the_refill_stream_cycles_through_epochs_and_leaves_the_main_stream_as_it_was(shards):
    stream = train_stream(shards)
    drawer = StreamDrawer(seed=5)
    drawn = [indices(drawer.draw(stream, B, None)) for _ in range(10)]  # 20 prompts from 16 samples
    flat = [i for prompts in drawn for i in prompts]
    assert sorted(flat[:NUM_SAMPLES]) == list(range(NUM_SAMPLES))  # one epoch: every sample once
    assert len(set(flat[NUM_SAMPLES:])) == 4  # then the next epoch
    assert flat[NUM_SAMPLES:] != flat[:4]  # reshuffled
    assert stream.epoch == 0 and stream.resume_from == {}  # the main stream's object was not touched
    assert drawer.loader.stream is not stream and drawer.loader.stream.seed != stream.seed


def test_two_ranks_draw_disjoint_prompts_from_their_own_shards(shards):
    drawn, main = [], []
    for rank in range(2):
        loader = train_loader(shards, rank, world_size=2)
        drawer = RolloutQueue(PipelineSettings(dynamic_sampling=True, seed=5), rewards=None).drawer(rank, loader.stream)
        drawn.append(indices(drawer.draw(loader.stream, NUM_SAMPLES // 2, None)))  # one epoch of this rank's share
        main.append(sorted(indices(s for batch in loader for s in batch)))
    assert not set(drawn[0]) & set(drawn[1])
    assert sorted(drawn[0] + drawn[1]) == list(range(NUM_SAMPLES))
    assert [sorted(d) for d in drawn] == main  # each rank refills from the shards its main stream reads


def through_a_file(state):
    """``state`` as a checkpoint writes and reads it back (``weights_only=True``)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_saved_refill_position_resumes_mid_epoch_and_a_changed_stream_starts_afresh(shards, caplog):
    queue = RolloutQueue(PipelineSettings(dynamic_sampling=True, seed=5), rewards=None)
    stream = train_stream(shards)
    drawer = queue.drawer(0, stream)
    assert isinstance(drawer, StreamDrawer) and queue.drawer(0) is drawer  # kept when no data set is named
    for _ in range(9):  # 18 items: into the second epoch
        drawer.draw(stream, B, None)
    state = through_a_file(queue.state(rank=0))
    assert state["drawer"]["position"]["epoch"] == 1 and state["drawer"]["position"]["batches"] == 2
    fresh = RolloutQueue(PipelineSettings(dynamic_sampling=True, seed=5), rewards=None)
    fresh.load_state(state, rank=0)
    again = train_stream(shards)
    expected = [indices(drawer.draw(stream, B, None)) for _ in range(10)]  # on into the third epoch
    assert [indices(fresh.drawer(0, again).draw(again, B, None)) for _ in range(10)] == expected
    changed = RolloutQueue(PipelineSettings(dynamic_sampling=True, seed=5), rewards=None)
    changed.load_state(state, rank=0)
    other = train_stream(shards, shuffle_buffer=2)
    with caplog.at_level(logging.WARNING):
        first = indices(changed.drawer(0, other).draw(other, B, None))
    assert "shuffle_buffer changed since the checkpoint" in caplog.text
    assert first == indices(StreamDrawer(seed=5).draw(other, B, None))  # from the start


def test_a_sampler_made_before_the_stream_was_known_gives_way_to_a_fresh_stream_drawer(shards):
    """Saved before any refill (no data set known yet), the sampler is map-style; the stream replaces it afresh."""
    queue = RolloutQueue(PipelineSettings(dynamic_sampling=True, seed=5), rewards=None)
    assert isinstance(queue.drawer(0), IndexDrawer)
    stream = train_stream(shards)
    assert indices(queue.drawer(0, stream).draw(stream, B, None)) == indices(StreamDrawer(5).draw(stream, B, None))


class Counting(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_a_data_set_neither_map_style_nor_a_shard_stream_is_a_clear_error():
    queue = RolloutQueue(PipelineSettings(dynamic_sampling=True), rewards=None)
    with pytest.raises(TypeError, match=r"training data set is a Counting, neither.*pipeline.dynamic_sampling off"):
        queue.drawer(0, Counting())

"""DAPO dynamic sampling (``pipeline.dynamic_sampling``, the rollout queue's refill): groups whose rewards are all equal
are left out of the loss, and more prompts are rolled out until the step holds B informative groups or the cap is
reached; the first B informative groups train, in order, on a tiny VLM and on the toy. Streamed shards are in
test_dynamic_sampling_streamed.py."""

import functools
import zlib
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from doubles import ToyPipelined, driver
from torch.utils.data import DataLoader

from app.algorithms import zero_std_groups
from app.modules import VLMGRPOModule
from app.rewards import RewardComponent
from app.settings import PipelineSettings, SamplingSettings
from app.types import VisualSample

K = 4


def crc(text: str) -> float:
    return zlib.crc32(text.encode()) % 1000 / 1000


def trained(recorder) -> list[dict]:
    """The recorded steps that made an update (a delayed pipeline's first step only primes it)."""
    return [step for step in recorder.steps if step["outputs"]]  # Lightning hands callbacks {} for a None output


class HalfFlatReward(RewardComponent):
    """Flat (0.5) for prompts whose question hashes even, a hash of the completion otherwise."""

    def score(self, completions, samples):
        return torch.tensor(
            [
                0.5 if zlib.crc32(s.question.encode()) % 2 == 0 else crc(c)
                for c, s in zip(completions, samples, strict=True)
            ]
        )


class TrainedGroups(VLMGRPOModule):
    """Keeps, per update, the rollouts that made it."""

    def _train_on(self, rollouts):
        self.seen = getattr(self, "seen", []) + [rollouts]
        return super()._train_on(rollouts)


def dots_with_distinct_questions(train_size: int, batch_size: int):
    from app.data import VisualTaskDataModule
    from app.tasks.dots import DotsDataset

    class Numbered(DotsDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            sample.question = f"[{index}] {sample.question}"
            return sample

    return VisualTaskDataModule(
        functools.partial(Numbered, dot_radius=12),
        train_size=train_size,
        val_size=2,
        test_size=2,
        batch_size=batch_size,
        seed=0,
        image_size=64,
    )


@pytest.mark.parametrize("delay", [0, 1])
def test_dynamic_sampling_fills_the_batch_with_informative_groups(new_policy, fit, delay):
    L.seed_everything(0)
    module = TrainedGroups(
        new_policy("tiny-qwen2-vl", lora_r=4),
        rewards=[HalfFlatReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8),
        eval_max_new_tokens=4,
        pipeline=PipelineSettings(delay=delay, dynamic_sampling=True, max_extra_rollouts=6),
    )
    batch_size = 4
    _, recorder = fit(module, dots_with_distinct_questions(64, batch_size), max_steps=3)
    extra = [s["metrics"]["train/dynamic/extra_rollouts"] for s in trained(recorder)]
    assert [s["metrics"]["train/dynamic/informative_groups"] for s in trained(recorder)] == [batch_size] * 3
    assert any(extra), "no step met a flat group: the test does not exercise the refill"
    for rollouts, n_extra in zip(module.seen, extra, strict=True):
        assert len(rollouts) == 1 + n_extra
        kept = 0
        for rollout in rollouts:
            flat = zero_std_groups(rollout.rewards.total, K)
            in_loss = rollout.loss_mask.view(-1, K, rollout.loss_mask.shape[1]).sum(dim=(1, 2)) > 0  # [B]
            assert not (in_loss & flat).any(), "a flat group entered the loss"
            kept += int(in_loss.sum())
        assert kept == batch_size


def test_dynamic_sampling_stops_at_its_cap(new_policy, fit):
    L.seed_everything(0)
    module = TrainedGroups(
        new_policy("tiny-qwen2-vl", lora_r=4),
        rewards=[HalfFlatReward()],
        sampling=SamplingSettings(group_size=K, max_new_tokens=8),
        eval_max_new_tokens=4,
        pipeline=PipelineSettings(dynamic_sampling=True, max_extra_rollouts=0),
    )
    _, recorder = fit(module, dots_with_distinct_questions(64, 4), max_steps=3)
    informative = [s["metrics"]["train/dynamic/informative_groups"] for s in recorder.steps]
    assert all(len(r) == 1 for r in module.seen) and min(informative) < 4
    assert all(s["metrics"]["train/dynamic/extra_rollouts"] == 0 for s in recorder.steps)


FLAT, SPREAD = [1.0, 1.0], [0.0, 2.0]  # the rewards of a toy prompt's two outputs: no signal, or some


def toy_prompts(rewards: list[list[float]], name: str) -> list[VisualSample]:
    features = torch.randn(len(rewards), 2, 2, generator=torch.Generator().manual_seed(len(name)))  # [B, K, 2]
    return [
        VisualSample([], f"{name}{b}", "toy", meta={"features": features[b], "values": values})
        for b, values in enumerate(rewards)
    ]


class InOrder:
    """Stands in for the seeded prompt sampler: draws the data set's prompts in order, and fails past its end."""

    def __init__(self):
        self.next = 0

    def draw(self, dataset, num_items, collate):
        items = [dataset[i] for i in range(self.next, self.next + num_items)]  # IndexError past the end
        self.next += num_items
        return collate(items) if collate is not None else items


class ToyDynamic(ToyPipelined):
    """The toy with dynamic sampling, outside a trainer: extra prompts come in order from ``dataset`` in loader
    batches of ``batch_size`` (the queue's prompt sampler replaced by :class:`InOrder`); keeps the loss masks of the
    rollouts each update trained on and the logged metrics."""

    def __init__(self, dataset: list[VisualSample], batch_size: int, max_extra_rollouts: int):
        super().__init__(delay=0, dynamic_sampling=True, max_extra_rollouts=max_extra_rollouts)
        self.loader = DataLoader(dataset, batch_size=batch_size, collate_fn=list)
        self.in_order = InOrder()
        self.rollout_queue.drawer = lambda rank, dataset=None: self.in_order
        self.masks: list[list[list[int]]] = []
        self.logged: dict[str, float] = {}

    @property
    def trainer(self):
        return SimpleNamespace(train_dataloader=self.loader)

    def _train_on(self, rollouts):
        self.masks.append([r.loss_mask.int().tolist() for r in rollouts])
        return super()._train_on(rollouts)

    def log_dict(self, values, **kwargs):
        self.logged.update({name: float(value) for name, value in values.items()})


def dynamic_step(batch: list[VisualSample], module: ToyDynamic) -> tuple[list[list[int]], float, float]:
    """One training step: the loss masks of the rollouts it trained on, the extra rollouts and informative groups."""
    driver(module)  # the optimizer and backward of a trainer
    module.training_step(batch, 0)
    (masks,) = module.masks
    return masks, module.logged["train/dynamic/extra_rollouts"], module.logged["train/dynamic/informative_groups"]


def test_dynamic_sampling_trains_on_the_first_b_informative_groups_in_order():
    """B = 3 with one informative group: the first extra rollout brings none, the second three, of which the first
    two fill the batch and the third is left out of the loss, as the flat groups are."""
    data = toy_prompts([FLAT] * 3 + [SPREAD] * 3, "data")
    module = ToyDynamic(data, batch_size=3, max_extra_rollouts=4)
    masks, extra, informative = dynamic_step(toy_prompts([FLAT, FLAT, SPREAD], "batch"), module)
    assert masks == [[0, 0, 0, 0, 1, 1], [0] * 6, [1, 1, 1, 1, 0, 0]]
    assert (extra, informative) == (2.0, 3.0)


def test_dynamic_sampling_draws_nothing_for_a_batch_of_informative_groups():
    module = ToyDynamic(toy_prompts([SPREAD] * 3, "data"), batch_size=3, max_extra_rollouts=4)
    masks, extra, informative = dynamic_step(toy_prompts([SPREAD] * 3, "batch"), module)
    assert masks == [[1] * 6] and module.in_order.next == 0
    assert (extra, informative) == (0.0, 3.0)
    assert module.reward_executor is None  # delay 0: rewards scored in the training thread, no workers built


def test_dynamic_sampling_trains_on_both_rollouts_when_one_refill_completes_the_batch():
    module = ToyDynamic(toy_prompts([SPREAD, FLAT], "data"), batch_size=2, max_extra_rollouts=4)
    masks, extra, informative = dynamic_step(toy_prompts([FLAT, SPREAD], "batch"), module)
    assert masks == [[0, 0, 1, 1], [1, 1, 0, 0]]
    assert (extra, informative) == (1.0, 2.0)


def test_dynamic_sampling_refills_a_short_last_batch_with_whole_loader_batches_up_to_its_cap():
    """The epoch's last batch holds 2 prompts, the loader's batches 3: each extra rollout draws 3; with only flat
    prompts to draw, the refill stops after ``max_extra_rollouts`` (the data set holds no more than that)."""
    module = ToyDynamic(toy_prompts([FLAT] * 6, "data"), batch_size=3, max_extra_rollouts=2)
    masks, extra, informative = dynamic_step(toy_prompts([FLAT, SPREAD], "batch"), module)
    assert masks == [[0, 0, 1, 1], [0] * 6, [0] * 6]
    assert (extra, informative) == (2.0, 1.0)


def test_a_loader_without_a_batch_size_refills_with_as_many_prompts_as_the_batch_holds():
    """A training "loader" that is a plain data set (no batch size, no collate function): each extra rollout draws
    the step's B = 2 prompts; the first brings one informative group, the second two, of which the first fills the
    batch."""
    data = toy_prompts([FLAT, SPREAD, SPREAD, SPREAD, SPREAD], "data")
    module = ToyDynamic(data, batch_size=3, max_extra_rollouts=4)
    module.loader = data
    masks, extra, informative = dynamic_step(toy_prompts([FLAT, FLAT], "batch"), module)
    assert masks == [[0, 0, 0, 0], [0, 0, 1, 1], [1, 1, 0, 0]] and module.in_order.next == 4
    assert (extra, informative) == (2.0, 2.0)

"""The checkpoint hooks, called directly on tiny modules with plain dict checkpoints (no Trainer): a lean state dict
keeps exactly what an optimizer updates (app.modules.checkpoints), the global generators' states come back, and a
pipelined GRPO run's pending rollout, policy version and prompt sampler travel to a fresh module (app.modules.grpo),
and each rank takes its own random states back (or, where the checkpoint holds none for it, fresh ones of its own)."""

import io
import random
import re
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_grpo_skeleton import LinearPolicy, ValueReward  # the skeleton tests' toy policy and reward
from torch import nn

from app.algorithms import grpo_loss
from app.modules import GRPOModule
from app.modules.checkpoints import (
    OMITTED,
    RANK_STATES,
    omit_frozen_parameters,
    restore_rng_states,
    rng_states,
    saved_rank_state,
    seed_rng_states,
)
from app.modules.plain_data import from_plain, to_plain
from app.modules.policy_module import PolicyModule
from app.settings import OptimizerSettings, PipelineSettings
from app.types import Generation, RewardOutput, VisualSample


def through_a_file(checkpoint: dict) -> dict:
    """``checkpoint`` as Lightning writes and reads it back (``weights_only=True``)."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# ------------------------------------------------------------------------------------------- lean state dicts
class Adapted(nn.Module):
    """A LoRA-like policy: ``block.adapter.weight`` is trained, its bias, ``block.base`` and ``frozen`` are not. A
    buffer at every depth: ``scale`` and ``block.stat`` sit above the trained weight, ``block.base.stat`` and
    ``frozen.stat`` do not. The frozen values come from a fixed seed, as a config builds its base model again."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("scale", torch.rand(2, generator=generator))
        self.block = nn.Module()
        self.block.register_buffer("stat", torch.rand(2, generator=generator))
        self.block.adapter = nn.Linear(2, 2)
        self.block.base = nn.Linear(2, 2, bias=False)
        self.block.base.register_buffer("stat", torch.rand(2, generator=generator))
        self.frozen = nn.Linear(2, 2, bias=False)
        self.frozen.register_buffer("stat", torch.rand(2, generator=generator))
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.rand(parameter.shape, generator=generator))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [self.block.adapter.weight]


FROZEN = ["policy.block.adapter.bias", "policy.block.base.weight", "policy.block.base.stat", "policy.frozen.weight",
          "policy.frozen.stat"]  # fmt: skip
KEPT = ["policy.scale", "policy.block.stat", "policy.block.adapter.weight"]


def trained_module() -> PolicyModule:
    """A module whose adapter moved away from its initial values, attached to a stand-in trainer with its optimizer."""
    module = PolicyModule(Adapted(), optimizer=OptimizerSettings(learning_rate=0.1))
    optimizer = torch.optim.SGD(module.policy.trainable_parameters(), lr=0.1)
    with torch.no_grad():
        module.policy.block.adapter.weight.add_(1.0)
    module._trainer = SimpleNamespace(optimizers=[optimizer])
    return module


def test_a_saved_checkpoint_keeps_the_trained_weight_and_the_buffers_above_it_and_names_the_rest():
    module = trained_module()
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    # a frozen parameter goes even beside a trained one (the adapter's bias); a buffer stays only where a trained
    # parameter lies below its module (the policy's root, block), at any depth
    assert checkpoint[OMITTED] == FROZEN
    assert list(checkpoint["state_dict"]) == KEPT
    for key in KEPT:
        assert torch.equal(checkpoint["state_dict"][key], module.state_dict()[key]), key


def test_a_lean_checkpoint_loads_strictly_into_a_fresh_module_with_the_trained_weight():
    module = trained_module()
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    checkpoint = through_a_file(checkpoint)
    fresh = PolicyModule(Adapted(), optimizer=OptimizerSettings(learning_rate=0.1))
    assert not torch.equal(fresh.policy.block.adapter.weight, module.policy.block.adapter.weight)
    fresh.on_load_checkpoint(checkpoint)
    assert list(checkpoint["state_dict"]) == KEPT + FROZEN  # the left-out values put back, from fresh's own
    fresh.load_state_dict(checkpoint["state_dict"], strict=True)
    for key, value in module.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_root_buffers_stay_even_when_the_optimizer_trains_none_of_the_module():
    net = nn.Linear(2, 2)
    net.register_buffer("stat", torch.ones(2))
    checkpoint = {"state_dict": net.state_dict()}
    omit_frozen_parameters(net, checkpoint, [torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)])
    assert checkpoint[OMITTED] == ["weight", "bias"]
    assert list(checkpoint["state_dict"]) == ["stat"]


def test_the_global_generators_resume_where_the_checkpoint_was_saved():
    module = trained_module()
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    expected = (torch.rand(3), random.random(), np.random.rand(3))
    checkpoint = through_a_file(checkpoint)
    torch.manual_seed(1)  # elsewhere, as a new process would be
    random.seed(1)
    np.random.seed(1)
    PolicyModule(Adapted(), optimizer=OptimizerSettings(learning_rate=0.1)).on_load_checkpoint(checkpoint)
    drawn = (torch.rand(3), random.random(), np.random.rand(3))
    assert torch.equal(drawn[0], expected[0]) and drawn[1] == expected[1]
    np.testing.assert_array_equal(drawn[2], expected[2])


# ------------------------------------------------------------------------------------------- the rollout pipeline
@dataclass
class Settings:
    group_size: int = 2


@dataclass
class ToyRollout:
    features: torch.Tensor  # [N, 2]
    old_logprobs: torch.Tensor  # [N]
    rewards: RewardOutput
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    group_size: int


class Toy(GRPOModule):
    """Each prompt carries its outputs' features and values (the values are the rewards); rewards scored inline."""

    def __init__(self, delay: int = 1):
        super().__init__(
            LinearPolicy(), [ValueReward()], Settings(), eps_low=0.2, eps_high=0.2, beta=0.0, num_iterations=1,
            advantage_scale="none", drop_zero_std_groups=False, micro_batch_size=None, gradient_clip_val=0.0,
            records_per_step=0, learning_rate=0.1, weight_decay=0.0, warmup_steps=0,
            pipeline=PipelineSettings(delay=delay, workers="inline"),
        )  # fmt: skip
        optimizer = torch.optim.SGD(self.policy.trainable_parameters(), lr=0.01)
        self.optimizers = lambda: optimizer
        self.lr_schedulers = lambda: None
        self.manual_backward = lambda loss: loss.backward()

    @torch.no_grad()
    def generate_rollout(self, samples):
        features = torch.cat([s.meta["features"] for s in samples])  # [N, 2]
        outputs = [str(v) for s in samples for v in s.meta["values"]]
        return Generation(samples, outputs, {"features": features, "old_logprobs": features @ self.policy.weight}, 0)

    def finish_rollout(self, generation, scored):
        return ToyRollout(**generation.parts, rewards=scored.rewards, advantages=scored.advantages,
                          loss_mask=scored.keep, group_size=self.group_size)  # fmt: skip

    def weighted_losses(self, rollout):
        logprobs = (rollout.features @ self.policy.weight)[:, None]  # [N, 1]
        yield grpo_loss(logprobs, rollout.old_logprobs[:, None], rollout.advantages, rollout.loss_mask[:, None]), 1.0

    def completion_text(self, rollout, row):
        return ""


def prompts(step: int) -> list[VisualSample]:
    features = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.5, -1.5], [2.0, 1.0]]) * (1 + step)
    values = [[1.0, 3.0], [2.0, -2.0]]
    return [
        VisualSample([], f"p{step}{b}", "toy", meta={"features": features[2 * b : 2 * b + 2], "values": values[b]})
        for b in range(2)
    ]


def saved(module: GRPOModule) -> dict:
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    return checkpoint


def pipeline_state(version: int, seed: int, *steps: int) -> dict:
    """A rank's saved pipeline state: the rollouts of ``steps`` pending, scored."""
    pending = [
        Generation(prompts(i), ["1.0", "3.0", "2.0", "-2.0"],
                   {"features": torch.full((4, 2), float(i)), "old_logprobs": torch.zeros(4)}, version,
                   RewardOutput(torch.tensor([1.0, 3.0, 2.0, -2.0]), {"value": torch.tensor([1.0, 3.0, 2.0, -2.0])}))
        for i in steps
    ]  # fmt: skip
    return {"pending": to_plain(pending), "version": version, "drawer": torch.Generator().manual_seed(seed).get_state()}


def describe(state: dict) -> tuple:
    """What a saved pipeline state holds, comparable with ``==``."""
    pending = [
        (g.version, [s.question for s in g.samples], g.outputs, g.rewards.total.tolist(), g.parts["features"].tolist())
        for g in from_plain(state["pending"])
    ]
    return pending, state["version"], state["drawer"].tolist()


def test_a_pipelined_checkpoint_carries_the_pending_rollout_the_version_and_the_prompt_sampler_to_a_fresh_module():
    module = Toy(delay=1)
    module.training_step(prompts(0), 0)  # primes
    module.training_step(prompts(1), 1)  # trains rollout 0; rollout 1 pending
    torch.randint(10, (3,), generator=module.drawer.generator)  # the prompt sampler has drawn
    checkpoint = through_a_file(saved(module))
    (state,) = checkpoint["rollout_pipeline"]  # one process
    (pending,) = from_plain(state["pending"])
    assert state["version"] == 1 and pending.version == 0
    assert [s.question for s in pending.samples] == ["p10", "p11"]
    assert pending.rewards.total.tolist() == [1.0, 3.0, 2.0, -2.0]  # collected before saving
    assert torch.equal(state["drawer"], module.drawer.generator.get_state())
    fresh = Toy(delay=1)
    fresh.on_load_checkpoint(checkpoint)
    (again,) = saved(fresh)["rollout_pipeline"]
    assert describe(again) == describe(state)
    draws = [torch.randint(10, (3,), generator=m.drawer.generator).tolist() for m in (module, fresh)]
    assert draws[0] == draws[1]


def test_a_resumed_pipeline_takes_its_saved_rollouts_once_and_then_keeps_its_own():
    module = Toy(delay=1)
    module.on_load_checkpoint({"rollout_pipeline": [pipeline_state(4, 7, 3)]})
    module.training_step(prompts(5), 5)  # trains the restored rollout; rollout 5 pending
    module.training_step(prompts(6), 6)  # trains rollout 5; rollout 6 pending
    (state,) = saved(module)["rollout_pipeline"]
    assert [[s.question for s in g.samples] for g in from_plain(state["pending"])] == [["p60", "p61"]]
    assert state["version"] == 6  # two updates after the saved version 4


def test_without_the_pipeline_no_pipeline_state_is_saved_or_taken():
    plain = Toy(delay=0)
    assert "rollout_pipeline" not in saved(plain)
    plain.on_load_checkpoint({"rollout_pipeline": [pipeline_state(4, 7, 3)]})
    plain.on_train_end()
    assert plain.dropped_rollouts == 0  # no pending rollout came in
    delayed = Toy(delay=1)
    delayed.on_load_checkpoint({})  # a checkpoint of a run without the pipeline: the pipeline starts empty
    fresh_sampler = torch.Generator().manual_seed(0).get_state().tolist()  # pipeline.seed 0 + rank 0
    assert describe(saved(delayed)["rollout_pipeline"][0]) == ([], 0, fresh_sampler)


def test_each_rank_takes_its_own_pipeline_state():
    states = [pipeline_state(4, 7, 3), pipeline_state(5, 8, 3, 4)]
    module = Toy(delay=1)
    module._trainer = SimpleNamespace(world_size=2, global_rank=1, optimizers=[])
    module.on_load_checkpoint({"rollout_pipeline": states})
    assert describe(saved(module)["rollout_pipeline"][0]) == describe(states[1])


@pytest.mark.parametrize(("saved_ranks", "world_size"), [(2, None), (1, 2)], ids=["2 on 1", "1 on 2"])
def test_resuming_a_pipelined_run_on_another_number_of_processes_is_refused(saved_ranks, world_size):
    module = Toy(delay=1)
    if world_size is not None:
        module._trainer = SimpleNamespace(world_size=world_size, global_rank=0, optimizers=[])
    message = (
        f"the checkpoint holds the rollout pipeline of {saved_ranks} processes, this run has {world_size or 1}: "
        "resume a pipelined run on as many processes as it was saved from"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        module.on_load_checkpoint({"rollout_pipeline": [pipeline_state(4, 7, 3)] * saved_ranks})


def test_under_torch_distributed_the_checkpoint_holds_the_gathered_state_of_every_rank():
    """A one-process gloo group, in this process: the checkpoint holds what ``all_gather_object`` brought back."""
    module = Toy(delay=1)
    module.on_load_checkpoint({"rollout_pipeline": [pipeline_state(5, 8, 3, 4)]})
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        checkpoint = saved(module)
    finally:
        torch.distributed.destroy_process_group()
    (state,) = checkpoint["rollout_pipeline"]
    assert describe(state) == describe(pipeline_state(5, 8, 3, 4))


# ------------------------------------------------------------------------------------------- per-rank states
def seeded_states(seed: int) -> dict:
    """A rank's saved state (:meth:`PolicyModule.rank_state`) after seeding the global generators with ``seed``."""
    seed_rng_states(seed)
    return {"rng": rng_states()}


def draws() -> tuple:
    """A draw from each global generator (torch, python, numpy), comparable with ``==``."""
    return tuple(torch.rand(3).tolist()), random.random(), tuple(np.random.rand(3).tolist())


def draws_after(seed: int) -> tuple:
    seed_rng_states(seed)
    return draws()


def module_on_rank(rank: int, world_size: int) -> PolicyModule:
    module = PolicyModule(Adapted(), optimizer=OptimizerSettings(learning_rate=0.1))
    module._trainer = SimpleNamespace(world_size=world_size, global_rank=rank, optimizers=[])
    return module


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "app.modules.checkpoints" and r.levelname == "WARNING"]


def test_each_rank_takes_its_own_global_generators_back():
    checkpoint = through_a_file({RANK_STATES: [seeded_states(10), seeded_states(11)]})
    for rank in (0, 1):
        module = module_on_rank(rank, 2)
        seed_rng_states(99)  # elsewhere, as a new process would be
        module.on_load_checkpoint(checkpoint)
        assert draws() == draws_after(10 + rank), f"rank {rank}"


def test_a_checkpoint_from_before_per_rank_states_gives_rank_0_its_states_and_every_other_rank_a_seed_of_its_own(
    caplog,
):
    legacy = {"rng_states": seeded_states(10)["rng"], "rollout_generator": torch.Generator().manual_seed(3).get_state()}
    state, seed = saved_rank_state(legacy, 0, 3)
    assert seed is None and set(state) == {"rng", "rollout_generator"} and not warnings_of(caplog)
    assert state["rng"] is legacy["rng_states"] and state["rollout_generator"] is legacy["rollout_generator"]
    seeds = []
    for rank in (1, 2):
        caplog.clear()
        state, seed = saved_rank_state(legacy, rank, 3)
        assert state == {} and isinstance(seed, int) and 0 <= seed < 2**63
        (warning,) = warnings_of(caplog)
        assert "only rank 0's random states" in warning and f"rank {rank} has none of its own" in warning
        assert saved_rank_state(legacy, rank, 3)[1] == seed, "the same seed on every resume"
        seeds.append(seed)
    other = {**legacy, "rng_states": seeded_states(12)["rng"]}
    assert len({*seeds, saved_rank_state(other, 1, 3)[1]}) == 3, "a seed per rank and per checkpoint"


def test_ranks_missing_from_the_checkpoint_draw_from_distinct_derived_seeds_not_rank_0s_states(caplog):
    checkpoint = through_a_file({RANK_STATES: [seeded_states(10)]})  # saved from one process, resumed on three
    assert saved_rank_state(checkpoint, 0, 3) == (checkpoint[RANK_STATES][0], None) and not warnings_of(caplog)
    resumed = {}
    for rank in (1, 2):
        caplog.clear()
        module = module_on_rank(rank, 3)
        seed_rng_states(99)
        module.on_load_checkpoint(checkpoint)
        resumed[rank] = draws()
        (warning,) = warnings_of(caplog)
        assert "the random states of 1 process, this run has 3" in warning and f"rank {rank}" in warning
        module = module_on_rank(rank, 3)
        seed_rng_states(98)
        module.on_load_checkpoint(checkpoint)
        assert draws() == resumed[rank], "the same fresh states on every resume"
    assert len({resumed[1], resumed[2], draws_after(10), draws_after(99)}) == 4


def test_states_of_more_ranks_than_running_give_each_rank_its_own_and_warn_once(caplog):
    checkpoint = {RANK_STATES: [seeded_states(10), seeded_states(11), seeded_states(12)]}
    state, seed = saved_rank_state(checkpoint, 0, 2)
    assert state is checkpoint[RANK_STATES][0] and seed is None
    (warning,) = warnings_of(caplog)
    assert "the random states of 3 processes, this run has 2: those of ranks 2..2 are not used" in warning
    caplog.clear()
    state, seed = saved_rank_state(checkpoint, 1, 2)
    assert state is checkpoint[RANK_STATES][1] and seed is None and not warnings_of(caplog)


def test_a_checkpoint_without_random_states_leaves_the_generators_alone(caplog):
    assert saved_rank_state({}, 1, 2) == ({}, None)
    assert saved_rank_state({RANK_STATES: []}, 0, 1) == ({}, None)
    module = module_on_rank(1, 2)  # its linear layers draw their initial weights from the global generator
    seed_rng_states(5)
    module.on_load_checkpoint({})
    assert draws() == draws_after(5) and not warnings_of(caplog)


def test_one_process_saves_its_states_as_the_only_ranks():
    module = module_on_rank(0, 1)
    seed_rng_states(4)
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    (state,) = through_a_file(checkpoint)[RANK_STATES]
    assert "rng_states" not in checkpoint
    restore_rng_states(state["rng"])
    assert draws() == draws_after(4)

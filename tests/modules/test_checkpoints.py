"""Checkpoints (app.modules.checkpoints): lean ones keep only what the optimizer updates, and resuming, exporting and
strict loading still work from the config's base weights (in fits, and with the hooks called directly on tiny modules
with plain dict checkpoints); the global generators' states come back, each rank its own (or, where the checkpoint holds
none for it, fresh ones of its own). The rollout pipeline's checkpoint state is in test_rollout_queue.py."""

import io
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from doubles import RednessReward, as_rank_0_of
from lightning.pytorch.callbacks import ModelCheckpoint
from prompt_samples import prompt_loader
from torch import nn
from torch.utils.data import DataLoader

from app.export import export_from_checkpoint
from app.models.flow import FlowPolicy
from app.modules import FlowGRPOModule, FlowMatchingModule
from app.modules.checkpoints import (
    OMITTED,
    RANK_STATES,
    derived_seed,
    gather_rank_states,
    omit_frozen_parameters,
    restore_rng_states,
    rng_states,
    saved_rank_state,
    seed_rng_states,
)
from app.modules.policy_module import PolicyModule
from app.settings import FlowGRPOSamplingSettings, GRPOSettings, LoRASettings, OptimizerSettings


def shape_prompts(n: int = 2) -> DataLoader:
    """``n`` copies of one shape_prompts prompt (the redness reward reads its colour from ``meta``), one per batch."""
    shape = {"color": "red", "shape": "circle", "position": "left"}
    return prompt_loader(n, 1, question="a red circle on the left", tasks=("shape_prompts",), meta=shape)


def grpo(lora: LoRASettings | None, beta: float = 0.0) -> FlowGRPOModule:
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=lora)
    sampling = FlowGRPOSamplingSettings(group_size=2, num_steps=3)
    return FlowGRPOModule(
        policy,
        [RednessReward()],  # dense: a random tiny model's groups carry a signal, so every step moves the weights
        sampling,
        grpo=GRPOSettings(beta=beta),
        optimizer=OptimizerSettings(learning_rate=1e-3),
    )


def fit_and_save(fit, module, data, tmp_path, max_steps=1) -> dict:
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    fit(module, data, max_steps=max_steps, callbacks=[checkpoints], enable_checkpointing=True)
    return torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)


def test_a_lora_checkpoint_holds_the_adapter_and_leaves_the_frozen_model_out(fit, tmp_path):
    module = grpo(LoRASettings(r=4, alpha=8))
    checkpoint = fit_and_save(fit, module, shape_prompts(), tmp_path)
    saved_parameters = [k for k in checkpoint["state_dict"] if k in dict(module.named_parameters())]
    lora = {n for n, p in module.named_parameters() if p.requires_grad}
    assert set(saved_parameters) == lora and lora
    omitted = set(checkpoint[OMITTED])
    assert any(".vae." in k for k in omitted) and any("text_encoder" in k for k in omitted)
    assert any("base_layer" in k for k in omitted), "the frozen transformer weights should be left out"
    full = sum(v.numel() for v in module.state_dict().values())
    assert sum(v.numel() for v in checkpoint["state_dict"].values()) < full / 10


def test_resuming_and_exporting_a_lean_checkpoint_restore_the_trained_adapter(fit, tmp_path):
    seed_global_generators(0)
    module = grpo(LoRASettings(r=4, alpha=8))
    checkpoint = fit_and_save(fit, module, shape_prompts(), tmp_path)
    trained = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}

    exported = grpo(LoRASettings(r=4, alpha=8))  # fresh adapter: lora_B = 0
    export_from_checkpoint(exported, tmp_path / "last.ckpt", tmp_path / "export")
    for name, value in exported.named_parameters():
        if name in trained:
            torch.testing.assert_close(value, trained[name], msg=name)
    assert (tmp_path / "export" / "model_index.json").exists()

    resumed = grpo(LoRASettings(r=4, alpha=8))
    seed_global_generators(12345)  # only the checkpoint can bring back the states the run had at step 1
    trainer, _ = fit(resumed, shape_prompts(4), max_steps=2, ckpt_path=str(tmp_path / "last.ckpt"))
    resumed_states = generator_states(resumed)
    assert trainer.global_step == 2 and checkpoint["global_step"] == 1

    # the same two steps without the interruption: the same weights, optimizer state and generator states
    seed_global_generators(0)
    straight = grpo(LoRASettings(r=4, alpha=8))
    straight_trainer, _ = fit(straight, shape_prompts(4), max_steps=2)
    straight_states = generator_states(straight)
    straight_params = dict(straight.named_parameters())
    for name, value in resumed.named_parameters():
        if value.requires_grad:
            torch.testing.assert_close(value, straight_params[name], atol=1e-6, rtol=0, msg=name)
    assert any(not torch.equal(trained[n], straight_params[n]) for n in trained), "the second step moved nothing"
    optimizer, expected = trainer.optimizers[0].state_dict(), straight_trainer.optimizers[0].state_dict()
    assert [g["lr"] for g in optimizer["param_groups"]] == [g["lr"] for g in expected["param_groups"]]
    assert optimizer["state"].keys() == expected["state"].keys() and optimizer["state"]
    for index, moments in optimizer["state"].items():
        assert float(moments["step"]) == float(expected["state"][index]["step"]) == 2
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(moments[key], expected["state"][index][key], atol=1e-7, rtol=1e-5, msg=key)
    assert torch.equal(resumed_states.pop("rollout"), straight_states.pop("rollout")), "rollout generator differs"
    assert torch.equal(resumed_states.pop("torch"), straight_states.pop("torch")), "torch generator differs"
    assert resumed_states.pop("python") == straight_states.pop("python"), "python random state differs"
    assert all(np.array_equal(a, b) for a, b in zip(resumed_states["numpy"], straight_states["numpy"], strict=True))


def seed_global_generators(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def generator_states(module: FlowGRPOModule) -> dict:
    """The global generators' states and the module's rollout generator's, now."""
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "rollout": module.generator.get_state(),
    }


def test_full_fine_tuning_saves_the_transformer_but_not_its_frozen_reference_copy(fit, tmp_path):
    module = grpo(lora=None, beta=0.01)
    checkpoint = fit_and_save(fit, module, shape_prompts(), tmp_path)
    keys = set(checkpoint["state_dict"])
    assert any(k.startswith("policy.model.") for k in keys)
    assert not any(k.startswith("policy.frozen_reference.") for k in keys)
    assert any(k.startswith("policy.frozen_reference.") for k in checkpoint[OMITTED])
    assert not keys & set(checkpoint[OMITTED])


def test_a_vae_frozen_after_its_training_steps_stays_in_the_checkpoint(fit, tmp_path):
    from app.data import VisualTaskDataModule
    from app.tasks.dots import ShapePromptDataset

    torch.manual_seed(0)
    module = FlowMatchingModule(
        FlowPolicy("tiny-sd3", lora=None), train_vae=True, vae_warmup_steps=1, vae_train_steps=1, num_steps=2
    )
    data = VisualTaskDataModule(ShapePromptDataset, train_size=8, val_size=2, batch_size=2, image_size=64)
    checkpoint = fit_and_save(fit, module, data, tmp_path, max_steps=3)
    assert not any(p.requires_grad for p in module.policy.vae.parameters()), "the VAE should be frozen by now"
    vae_keys = [k for k in checkpoint["state_dict"] if k.startswith("policy.vae.")]
    assert vae_keys and not any(k.startswith("policy.vae.") for k in checkpoint[OMITTED])
    for key in vae_keys:
        torch.testing.assert_close(checkpoint["state_dict"][key], module.state_dict()[key], msg=key)


def test_a_lean_checkpoint_of_another_model_is_a_clear_error(fit, tmp_path):
    fit_and_save(fit, grpo(LoRASettings(r=4, alpha=8)), shape_prompts(), tmp_path)
    other = grpo(lora=None)  # no base_layer / lora names
    with pytest.raises(ValueError, match="does not match this model: it left out frozen parameters"):
        export_from_checkpoint(other, tmp_path / "last.ckpt", tmp_path / "export")


# ------------------------------------------------------------------ the functions on a hand-built module (no fit)


class _Net(torch.nn.Module):
    """Parameters and buffers at every depth: ``deep.0.0`` and ``partly.weight`` are trained, ``tied.weight`` is
    ``deep.0.0.weight`` under a second name, ``frozen`` is left alone."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("root_stat", torch.zeros(2))
        self.deep = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2)))
        for owner in (self.deep, self.deep[0], self.deep[0][0]):
            owner.register_buffer("stat", torch.ones(2))
        self.frozen = torch.nn.Linear(2, 2)
        self.frozen.register_buffer("stat", torch.ones(2))
        self.partly = torch.nn.Linear(2, 2)
        self.partly.register_buffer("stat", torch.ones(2))
        self.tied = torch.nn.Module()
        self.tied.weight = self.deep[0][0].weight
        self.tied.register_buffer("stat", torch.ones(2))

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([*self.deep.parameters(), self.partly.weight], lr=0.1)


def test_omit_drops_frozen_parameters_and_the_buffers_of_modules_without_a_trained_parameter():
    from app.modules.checkpoints import omit_frozen_parameters

    net = _Net()
    state = net.state_dict(keep_vars=True)
    del state["frozen.bias"]  # a key the checkpoint does not hold is neither dropped nor listed
    checkpoint = {"state_dict": dict(state)}
    omit_frozen_parameters(net, checkpoint, [net.optimizer()])
    # a frozen parameter goes even where its module is trained; buffers stay wherever a trained parameter lies below
    # their module (the root, deep, deep.0, deep.0.0, partly, and tied through its tied weight)
    assert checkpoint[OMITTED] == ["frozen.weight", "frozen.stat", "partly.bias"]
    assert list(checkpoint["state_dict"]) == [
        "root_stat",
        "deep.stat",
        "deep.0.stat",
        "deep.0.0.weight",
        "deep.0.0.bias",
        "deep.0.0.stat",
        "partly.weight",
        "partly.stat",
        "tied.weight",
        "tied.stat",
    ]
    assert all(checkpoint["state_dict"][k] is state[k] for k in checkpoint["state_dict"])


def test_omit_keeps_root_buffers_when_no_trained_parameter_is_in_the_module():
    from app.modules.checkpoints import omit_frozen_parameters

    net = _Net()
    checkpoint = {"state_dict": net.state_dict()}
    omit_frozen_parameters(net, checkpoint, [torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)])
    assert list(checkpoint["state_dict"]) == ["root_stat"]
    assert len(checkpoint[OMITTED]) == len(net.state_dict()) - 1


def test_omit_without_optimizers_keeps_everything():
    from app.modules.checkpoints import omit_frozen_parameters

    net = _Net()
    checkpoint = {"state_dict": net.state_dict()}
    omit_frozen_parameters(net, checkpoint, [])
    assert checkpoint.keys() == {"state_dict"} and checkpoint["state_dict"].keys() == net.state_dict().keys()


def test_fit_optimizers_lists_the_trainers_optimizers_and_none_outside_a_trainer():
    from types import SimpleNamespace

    import lightning as L

    from app.modules.checkpoints import fit_optimizers

    optimizer = _Net().optimizer()
    assert fit_optimizers(SimpleNamespace(trainer=SimpleNamespace(optimizers=(optimizer,)))) == [optimizer]
    assert fit_optimizers(L.LightningModule()) == []


def test_restore_puts_back_the_omitted_values_for_a_strict_load():
    from app.modules.checkpoints import omit_frozen_parameters, restore_frozen_parameters

    trained, fresh = _Net(), _Net()
    with torch.no_grad():
        trained.partly.weight.add_(1.0)
    checkpoint = {"state_dict": trained.state_dict()}
    omit_frozen_parameters(trained, checkpoint, [trained.optimizer()])
    restore_frozen_parameters(fresh, checkpoint)
    assert checkpoint["state_dict"].keys() == fresh.state_dict().keys()
    fresh.load_state_dict(checkpoint["state_dict"], strict=True)
    torch.testing.assert_close(fresh.partly.weight, trained.partly.weight)  # the trained value, not fresh's own


def test_restore_without_a_list_changes_nothing_and_names_unknown_keys():
    from app.modules.checkpoints import restore_frozen_parameters

    net = _Net()
    for checkpoint in ({}, {OMITTED: []}, {OMITTED: None}):
        before = dict(checkpoint)
        restore_frozen_parameters(net, checkpoint)  # not even a state_dict is needed
        assert checkpoint == before
    checkpoint = {"state_dict": {}, OMITTED: ["frozen.weight", "a", "b", "c", "d"]}
    with pytest.raises(ValueError, match=r"does not have \(\['a', 'b', 'c'\], 4 in all\); resume or export it"):
        restore_frozen_parameters(net, checkpoint)
    assert checkpoint["state_dict"] == {}


# ---------------------------------------------------------------------------- the hooks on a tiny module (no trainer)


def through_a_file(checkpoint: dict) -> dict:
    """``checkpoint`` as Lightning writes and reads it back (``weights_only=True``)."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


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


FROZEN = [
    "policy.block.adapter.bias",
    "policy.block.base.weight",
    "policy.block.base.stat",
    "policy.frozen.weight",
    "policy.frozen.stat",
]


KEPT = ["policy.scale", "policy.block.stat", "policy.block.adapter.weight"]


def trained_module() -> PolicyModule:
    """A module whose adapter moved away from its initial values, attached to a stand-in trainer with its optimizer."""
    module = PolicyModule(Adapted(), OptimizerSettings(learning_rate=0.1), default_learning_rate=1e-3)
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
    fresh = PolicyModule(Adapted(), OptimizerSettings(learning_rate=0.1), default_learning_rate=1e-3)
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
    PolicyModule(Adapted(), OptimizerSettings(learning_rate=0.1), default_learning_rate=1e-3).on_load_checkpoint(
        checkpoint
    )
    drawn = (torch.rand(3), random.random(), np.random.rand(3))
    assert torch.equal(drawn[0], expected[0]) and drawn[1] == expected[1]
    np.testing.assert_array_equal(drawn[2], expected[2])


# ---------------------------------------------------------------------------------------------------- per-rank states


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
    module = PolicyModule(Adapted(), OptimizerSettings(learning_rate=0.1), default_learning_rate=1e-3)
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


def test_top_level_random_states_are_not_read_as_rank_0_s(caplog):
    """Only :data:`RANK_STATES` holds random states: top-level ``rng_states`` / ``rollout_generator`` (a format no
    release wrote) restore nothing."""
    old_format = {"rng_states": seeded_states(10)["rng"], "rollout_generator": torch.Generator().get_state()}
    for rank in (0, 1):
        assert saved_rank_state(old_format, rank, 2) == ({}, None)
    assert not warnings_of(caplog)


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


def fresh_states_warning(saved: str, rank: int) -> str:
    return (
        f"the checkpoint holds the random states of {saved}: rank {rank} has none of its own and does not take rank "
        "0's; it draws from fresh states seeded from the checkpoint and its rank instead (distinct from every other "
        "rank's), so the resumed run samples differently from an uninterrupted one"
    )


def test_the_warnings_of_ranks_without_saved_states_say_what_the_checkpoint_holds(caplog):
    saved_rank_state({RANK_STATES: [seeded_states(10), seeded_states(11)]}, 2, 4)
    saved_rank_state({RANK_STATES: [seeded_states(10)]}, 1, 2)
    assert warnings_of(caplog) == [
        fresh_states_warning("2 processes, this run has 4", 2),
        fresh_states_warning("1 process, this run has 2", 1),
    ]


def test_as_many_saved_states_as_ranks_is_no_warning(caplog):
    checkpoint = {RANK_STATES: [seeded_states(10), seeded_states(11)]}
    for rank in (0, 1):
        assert saved_rank_state(checkpoint, rank, 2) == (checkpoint[RANK_STATES][rank], None)
    assert not warnings_of(caplog)


def test_a_module_outside_a_trainer_is_one_process_and_takes_rank_0_s_states(caplog):
    checkpoint = through_a_file({RANK_STATES: [seeded_states(10), seeded_states(11)]})
    module = PolicyModule(Adapted(), OptimizerSettings(learning_rate=0.1), default_learning_rate=1e-3)
    seed_rng_states(99)
    module.on_load_checkpoint(checkpoint)
    assert draws() == draws_after(10)
    (warning,) = warnings_of(caplog)
    assert "the random states of 2 processes, this run has 1: those of ranks 1..1 are not used" in warning


def seed_for_rank_1(state) -> int:
    """The fresh seed of rank 1 resuming a one-process checkpoint that saved ``state``."""
    return saved_rank_state({RANK_STATES: [state]}, 1, 2)[1]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"a": 1}, {"b": 1}),  # a key
        ({"a": 1}, {"a": 2}),  # a value
        ({"a": [1, 2]}, {"a": [1, 3]}),  # an item of a list
        ({"a": (1, 2)}, {"a": (2, 1)}),  # the order of a tuple (python's random state is one)
        ({"a": torch.tensor([1.0])}, {"a": torch.tensor([2.0])}),  # a tensor's values
    ],
)
def test_the_fresh_seed_depends_on_every_part_of_the_saved_state(first, second):
    assert seed_for_rank_1(first) != seed_for_rank_1(second)
    assert seed_for_rank_1(first) == seed_for_rank_1(through_a_file(first)), "the same seed from a loaded copy"


def test_the_fresh_seed_of_a_state_with_keys_of_several_types_does_not_depend_on_their_order():
    assert seed_for_rank_1({"rng": 1, 0: [2.0]}) == seed_for_rank_1({0: [2.0], "rng": 1})


def test_derived_seeds_are_63_bit_and_pinned_so_every_version_resumes_a_checkpoint_alike():
    assert derived_seed("checkpoint", 1) == 5036093640163347356  # sha256 of the repr, 8 bytes little-endian, >> 1
    assert max(derived_seed("checkpoint", rank) for rank in range(8)).bit_length() == 63


def test_seeding_gives_numpy_the_seed_modulo_2_to_the_32():
    for seed in (7, 2**32 + 7, 2**40 + 3):
        seed_rng_states(seed)
        assert np.random.rand() == np.random.RandomState(seed % 2**32).rand(), seed


def test_several_processes_gather_every_rank_s_state_in_rank_order(monkeypatch):
    given = as_rank_0_of(monkeypatch, others=[{"rank": 1}])
    assert gather_rank_states({"rank": 0}) == [{"rank": 0}, {"rank": 1}]
    assert given == [{"rank": 0}]


def test_one_process_gathers_only_its_own_state(monkeypatch):
    assert gather_rank_states({"rank": 0}) == [{"rank": 0}]  # torch.distributed not initialised
    given = as_rank_0_of(monkeypatch, others=[])
    assert gather_rank_states({"rank": 0}) == [{"rank": 0}] and given == [], "no collective for one process"

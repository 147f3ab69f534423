"""Lean checkpoints (app.modules.checkpoints): only what the optimizer updates is saved, and resuming, exporting and
strict loading still work from the config's base weights."""

import random

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from app.export import export_from_checkpoint
from app.models.flow import FlowPolicy
from app.modules import FlowGRPOModule, FlowMatchingModule
from app.modules.checkpoints import OMITTED
from app.rewards.color_region import ColorRegionReward
from app.settings import FlowSamplingSettings, GRPOSettings, LoRASettings, OptimizerSettings
from app.types import VisualSample


def prompts(n: int = 2) -> DataLoader:
    samples = [
        VisualSample(images=[], question="a red circle on the left", task="shape_prompts",
                     meta={"color": "red", "shape": "circle", "position": "left"})
        for _ in range(n)
    ]  # fmt: skip
    # its own generator, as the app's data modules have: an iterator's worker seed must not come from the global one
    return DataLoader(samples, batch_size=1, collate_fn=list, generator=torch.Generator().manual_seed(0))


def grpo(lora: LoRASettings | None, beta: float = 0.0) -> FlowGRPOModule:
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=lora)
    sampling = FlowSamplingSettings(group_size=2, num_steps=3)
    return FlowGRPOModule(policy, [ColorRegionReward()], sampling, grpo=GRPOSettings(beta=beta), optimizer=OptimizerSettings(learning_rate=1e-3))


def fit_and_save(fit, module, data, tmp_path, max_steps=1) -> dict:
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    fit(module, data, max_steps=max_steps, callbacks=[checkpoints], enable_checkpointing=True)
    return torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)


def test_a_lora_checkpoint_holds_the_adapter_and_leaves_the_frozen_model_out(fit, tmp_path):
    module = grpo(LoRASettings(r=4, alpha=8))
    checkpoint = fit_and_save(fit, module, prompts(), tmp_path)
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
    checkpoint = fit_and_save(fit, module, prompts(), tmp_path)
    trained = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}

    exported = grpo(LoRASettings(r=4, alpha=8))  # fresh adapter: lora_B = 0
    export_from_checkpoint(exported, tmp_path / "last.ckpt", tmp_path / "export")
    for name, value in exported.named_parameters():
        if name in trained:
            torch.testing.assert_close(value, trained[name], msg=name)
    assert (tmp_path / "export" / "model_index.json").exists()

    resumed = grpo(LoRASettings(r=4, alpha=8))
    seed_global_generators(12345)  # only the checkpoint can bring back the states the run had at step 1
    trainer, _ = fit(resumed, prompts(4), max_steps=2, ckpt_path=str(tmp_path / "last.ckpt"))
    resumed_states = generator_states(resumed)
    assert trainer.global_step == 2 and checkpoint["global_step"] == 1

    # the same two steps without the interruption: the same weights, optimizer state and generator states
    seed_global_generators(0)
    straight = grpo(LoRASettings(r=4, alpha=8))
    straight_trainer, _ = fit(straight, prompts(4), max_steps=2)
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
    checkpoint = fit_and_save(fit, module, prompts(), tmp_path)
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
    fit_and_save(fit, grpo(LoRASettings(r=4, alpha=8)), prompts(), tmp_path)
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
        "root_stat", "deep.stat", "deep.0.stat", "deep.0.0.weight", "deep.0.0.bias", "deep.0.0.stat",
        "partly.weight", "partly.stat", "tied.weight", "tied.stat",
    ]  # fmt: skip
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

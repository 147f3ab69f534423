"""Lean checkpoints (app.modules.checkpoints): only what the optimizer updates is saved, and resuming, exporting and
strict loading still work from the config's base weights."""

import random

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from app.export import export_from_checkpoint
from app.models.flow import FlowLoRASettings, FlowPolicy
from app.modules import FlowGRPOModule, FlowMatchingModule
from app.modules.checkpoints import OMITTED
from app.rewards.color_region import ColorRegionReward
from app.types import VisualSample


def prompts(n: int = 2) -> DataLoader:
    samples = [
        VisualSample(images=[], question="a red circle on the left", task="shape_prompts",
                     meta={"color": "red", "shape": "circle", "position": "left"})
        for _ in range(n)
    ]  # fmt: skip
    # its own generator, as the app's data modules have: an iterator's worker seed must not come from the global one
    return DataLoader(samples, batch_size=1, collate_fn=list, generator=torch.Generator().manual_seed(0))


def grpo(lora: FlowLoRASettings | None) -> FlowGRPOModule:
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=lora)
    return FlowGRPOModule(policy, [ColorRegionReward()], num_generations=2, num_steps=3, learning_rate=1e-3)


def fit_and_save(fit, module, data, tmp_path, max_steps=1) -> dict:
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    fit(module, data, max_steps=max_steps, callbacks=[checkpoints], enable_checkpointing=True)
    return torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)


def test_a_lora_checkpoint_holds_the_adapter_and_leaves_the_frozen_model_out(fit, tmp_path):
    module = grpo(FlowLoRASettings(r=4, alpha=8))
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
    module = grpo(FlowLoRASettings(r=4, alpha=8))
    checkpoint = fit_and_save(fit, module, prompts(), tmp_path)
    trained = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}

    exported = grpo(FlowLoRASettings(r=4, alpha=8))  # fresh adapter: lora_B = 0
    export_from_checkpoint(exported, tmp_path / "last.ckpt", tmp_path / "export")
    for name, value in exported.named_parameters():
        if name in trained:
            torch.testing.assert_close(value, trained[name], msg=name)
    assert (tmp_path / "export" / "model_index.json").exists()

    resumed = grpo(FlowLoRASettings(r=4, alpha=8))
    seed_global_generators(12345)  # only the checkpoint can bring back the states the run had at step 1
    trainer, _ = fit(resumed, prompts(4), max_steps=2, ckpt_path=str(tmp_path / "last.ckpt"))
    resumed_states = generator_states(resumed)
    assert trainer.global_step == 2 and checkpoint["global_step"] == 1

    # the same two steps without the interruption: the same weights, optimizer state and generator states
    seed_global_generators(0)
    straight = grpo(FlowLoRASettings(r=4, alpha=8))
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
    module = grpo(lora=None)
    checkpoint = fit_and_save(fit, module, prompts(), tmp_path)
    keys = set(checkpoint["state_dict"])
    assert any(k.startswith("policy.model.") for k in keys)
    assert not any(k.startswith("policy.frozen_reference.") for k in keys)
    assert any(k.startswith("policy.frozen_reference.") for k in checkpoint[OMITTED])
    assert not keys & set(checkpoint[OMITTED])


def test_a_vae_frozen_after_its_training_steps_stays_in_the_checkpoint(fit, tmp_path):
    from app.data import VisualTaskDataModule

    torch.manual_seed(0)
    module = FlowMatchingModule(
        FlowPolicy("tiny-sd3", lora=None), train_vae=True, vae_warmup_steps=1, vae_train_steps=1, num_steps=2
    )
    data = VisualTaskDataModule(task="shape_prompts", train_size=8, val_size=2, batch_size=2, image_size=64)
    checkpoint = fit_and_save(fit, module, data, tmp_path, max_steps=3)
    assert not any(p.requires_grad for p in module.policy.vae.parameters()), "the VAE should be frozen by now"
    vae_keys = [k for k in checkpoint["state_dict"] if k.startswith("policy.vae.")]
    assert vae_keys and not any(k.startswith("policy.vae.") for k in checkpoint[OMITTED])
    for key in vae_keys:
        torch.testing.assert_close(checkpoint["state_dict"][key], module.state_dict()[key], msg=key)


def test_a_lean_checkpoint_of_another_model_is_a_clear_error(fit, tmp_path):
    fit_and_save(fit, grpo(FlowLoRASettings(r=4, alpha=8)), prompts(), tmp_path)
    other = grpo(lora=None)  # no base_layer / lora names
    with pytest.raises(ValueError, match="does not match this model: it left out frozen parameters"):
        export_from_checkpoint(other, tmp_path / "last.ckpt", tmp_path / "export")

"""The moving average of the policy's weights (app.modules.ema, PolicyModule's ``ema``): its recursion, validation and
export on the average with the trained weights back after, and lean checkpoints that carry it."""

import lightning as L
import pytest
import torch
from prompt_samples import prompt_loader
from torch import nn

from app.export import export_from_checkpoint
from app.models import FlowPolicy
from app.modules import FlowGRPOModule
from app.modules.ema import PolicyEMA
from app.rewards import RewardComponent
from app.settings import EMASettings, FlowGRPOSamplingSettings, LoRASettings, OptimizerSettings

EPS32 = torch.finfo(torch.float32).eps


def test_the_average_follows_its_recursion_from_the_start_step_every_n_steps():
    generator = torch.Generator().manual_seed(0)
    weights = [nn.Parameter(torch.randn(5, generator=generator)), nn.Parameter(torch.randn(2, 3, generator=generator))]
    settings = EMASettings(decay=0.8, start_step=2, every_n_steps=2)
    ema = PolicyEMA(weights, settings)
    reference = [w.detach().double().clone() for w in weights]
    moved = []
    for step in range(1, 10):
        with torch.no_grad():
            for w in weights:
                w.add_(torch.randn(w.shape, generator=generator))
        moved.append(ema.step())
        for r, w in zip(reference, weights, strict=True):
            if step < settings.start_step:
                r.copy_(w.detach())
            elif (step - settings.start_step) % settings.every_n_steps == 0:
                r.mul_(settings.decay).add_(w.detach().double(), alpha=1 - settings.decay)
    assert moved == [False, True, False, True, False, True, False, True, False] and int(ema.steps) == 9
    # each float32 lerp rounds once (half an ulp of values below 2 ** k) on a convex mix of earlier rounded values:
    # the errors add, at most one ulp of the largest magnitude per update, over the 4 updates here
    for average, r in zip(ema.averages, reference, strict=True):
        bound = 4 * EPS32 * float(r.abs().max().clamp(min=1)) * 2
        torch.testing.assert_close(average.double(), r, atol=bound, rtol=0)


def test_swapping_the_average_in_gives_the_trained_weights_back_bit_for_bit():
    weight = nn.Parameter(torch.randn(7))
    ema = PolicyEMA([weight], EMASettings(decay=0.5))
    trained = weight.detach().clone()
    with torch.no_grad():
        ema.averages[0].mul_(3.0).add_(1.0)
    with ema.swapped_in():
        assert torch.equal(weight, ema.averages[0])
    assert torch.equal(weight, trained)


@pytest.mark.parametrize(
    "options, message",
    [({"decay": 1.0}, "decay must be in \\(0, 1\\)"), ({"every_n_steps": 0}, "every_n_steps >= 1")],
)
def test_bad_settings_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        EMASettings(**options)


# ----------------------------------------------------------------------------------------------- in a fit
class Brightness(RewardComponent):
    """The mean of a sample: dense, so every group carries a signal."""

    value_range = (0.0, 1.0)

    def score(self, completions, samples):
        return torch.stack([c.float().mean() for c in completions])


class WeightsSeen(L.Callback):
    """The trainable weights after every training batch and those the first validation batch ran with."""

    def __init__(self):
        self.after_steps: list[list[torch.Tensor]] = []
        self.validated: list[torch.Tensor] | None = None
        self.evaluated: dict[str, list[torch.Tensor]] = {}  # the weights `test` and `predict` ran with

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after_steps.append([p.detach().clone() for p in pl_module.policy.trainable_parameters()])

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.validated is None:
            self.validated = [p.detach().clone() for p in pl_module.policy.trainable_parameters()]

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.evaluated.setdefault("test", [p.detach().clone() for p in pl_module.policy.trainable_parameters()])

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.evaluated.setdefault("predict", [p.detach().clone() for p in pl_module.policy.trainable_parameters()])


def flow_module(ema: EMASettings | None):
    torch.manual_seed(0)
    policy = FlowPolicy("tiny-sd3", lora=LoRASettings(r=4, alpha=8), resolution={"height": 32, "width": 32})
    return FlowGRPOModule(
        policy,
        [Brightness()],
        FlowGRPOSamplingSettings(group_size=2, num_steps=3),
        optimizer=OptimizerSettings(learning_rate=1e-2),
        ema=ema,
    )


def trainer(tmp_path, steps, callbacks=()):
    return L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        callbacks=list(callbacks),
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three steps of flow-GRPO with an EMA of decay 0.5, then a validation and a checkpoint."""
    tmp_path = tmp_path_factory.mktemp("ema")
    module, seen = flow_module(EMASettings(decay=0.5)), WeightsSeen()
    initial = [p.detach().clone() for p in module.policy.trainable_parameters()]
    fit = trainer(tmp_path, 3, [seen])
    fit.fit(module, train_dataloaders=prompt_loader(6))
    fit.validate(module, dataloaders=prompt_loader(2), verbose=False)
    checkpoint = tmp_path / "last.ckpt"
    fit.save_checkpoint(checkpoint)
    return module, seen, initial, checkpoint


def test_a_fit_averages_the_weights_of_each_step(trained):
    module, seen, initial, _ = trained
    expected = [w.double() for w in initial]
    for weights in seen.after_steps:
        expected = [0.5 * e + 0.5 * w.double() for e, w in zip(expected, weights, strict=True)]
    assert len(seen.after_steps) == 3
    for average, e in zip(module.policy_ema.averages, expected, strict=True):
        torch.testing.assert_close(average.double(), e, atol=3 * 2 * EPS32 * float(e.abs().max().clamp(min=1)), rtol=0)
    trained_weights = module.policy.trainable_parameters()
    assert any(not torch.equal(a, w) for a, w in zip(module.policy_ema.averages, trained_weights, strict=True))


def test_validation_runs_on_the_average_and_training_keeps_its_own_weights(trained):
    module, seen, _, _ = trained
    assert all(torch.equal(v, a) for v, a in zip(seen.validated, module.policy_ema.averages, strict=True))
    after = module.policy.trainable_parameters()
    assert all(torch.equal(p, w) for p, w in zip(after, seen.after_steps[-1], strict=True))  # back after validation


@pytest.mark.parametrize("stage", ["test", "predict"])
def test_test_and_predict_run_on_the_average_as_validation_does(trained, stage):
    module, seen, _, _ = trained
    fit = trainer(module.trainer.default_root_dir, 3, [seen])
    if stage == "test":
        fit.test(module, dataloaders=prompt_loader(2), verbose=False)
    else:
        fit.predict(module, dataloaders=prompt_loader(2))
    assert all(torch.equal(w, a) for w, a in zip(seen.evaluated[stage], module.policy_ema.averages, strict=True))
    after = module.policy.trainable_parameters()
    assert all(torch.equal(p, w) for p, w in zip(after, seen.after_steps[-1], strict=True))  # back after the stage


def test_a_lean_checkpoint_carries_the_average_and_export_uses_it(trained, tmp_path, monkeypatch):
    module, _, _, checkpoint = trained
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    keys = [k for k in state if k.startswith("policy_ema.average_")]
    assert len(keys) == len(module.policy_ema.averages) and int(state["policy_ema.steps"]) == 3
    fresh = flow_module(EMASettings(decay=0.5))
    exported = {}
    monkeypatch.setattr(
        fresh.policy,
        "export",
        lambda folder: exported.setdefault(
            "weights", [p.detach().clone() for p in fresh.policy.trainable_parameters()]
        ),
    )
    export_from_checkpoint(fresh, checkpoint, tmp_path / "policy")
    assert all(torch.equal(a, b) for a, b in zip(fresh.policy_ema.averages, module.policy_ema.averages, strict=True))
    assert all(torch.equal(w, a) for w, a in zip(exported["weights"], module.policy_ema.averages, strict=True))
    trained_weights = module.policy.trainable_parameters()
    assert all(torch.equal(p, w) for p, w in zip(fresh.policy.trainable_parameters(), trained_weights, strict=True))


def test_without_ema_nothing_is_averaged_and_validation_uses_the_trained_weights(tmp_path):
    module, seen = flow_module(None), WeightsSeen()
    fit = trainer(tmp_path, 1, [seen])
    fit.fit(module, train_dataloaders=prompt_loader(2))
    fit.validate(module, dataloaders=prompt_loader(2), verbose=False)
    assert module.policy_ema is None
    assert all(torch.equal(v, w) for v, w in zip(seen.validated, seen.after_steps[-1], strict=True))


def test_the_sft_module_takes_an_ema_too(new_policy):
    from app.modules import VLMSFTModule

    module = VLMSFTModule(new_policy(), ema=EMASettings(decay=0.5))
    module.configure_model()
    assert len(module.policy_ema.averages) == len(module.policy.trainable_parameters())
    assert module.hparams["ema"] == {"decay": 0.5, "start_step": 0, "every_n_steps": 1}

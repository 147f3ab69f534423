"""Fault drills: a signal saves a resumable checkpoint and exits non-zero, checkpoints are written atomically,
non-finite updates are skipped and counted, and training stops on persistent NaN (never saving NaN weights)."""

import math
import os
import signal

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from app.command_line.faults import PREEMPTED_FILENAME, AtomicCheckpointIO, PreemptionCheckpoint, atomic_torch_save
from app.modules import NonFiniteTrainingError, VLMGRPOModule
from app.modules.policy_module import NONFINITE_GRADIENT, UNDONE
from app.rewards import RewardComponent
from app.settings import OptimizerSettings, SamplingSettings


class LengthReward(RewardComponent):
    value_range = (0.0, 1.0)

    def score(self, completions, samples):
        return torch.tensor([min(len(c) / 20, 1.0) for c in completions])


class NaNReward(RewardComponent):
    def score(self, completions, samples):
        return torch.full((len(completions),), float("nan"))


def grpo(new_policy, rewards=None, **optimizer):
    """A tiny GRPO module; ``optimizer`` are :class:`OptimizerSettings` fields (learning rate 1e-2 unless given)."""
    return VLMGRPOModule(
        new_policy("tiny-qwen2-vl", lora_r=4),
        rewards or [LengthReward()],
        SamplingSettings(group_size=2, max_new_tokens=6),
        optimizer=OptimizerSettings(**{"learning_rate": 1e-2, **optimizer}),
        eval_max_new_tokens=4,
    )


class SendSignal(Callback):
    """Send ``signum`` to this process after training batch ``at_step`` (as a scheduler would, mid-run)."""

    def __init__(self, signum: int, at_step: int):
        self.signum, self.at_step = signum, at_step

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.at_step - 1:
            os.kill(os.getpid(), self.signum)


# ------------------------------------------------------------------------------------------------- checkpoints
class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("killed mid-save")


def test_an_interrupted_save_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1}, path)
    with pytest.raises(RuntimeError, match="killed mid-save"):
        atomic_torch_save({"step": 2, "bad": Unpicklable()}, path)
    assert torch.load(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"], "a temporary file was left behind"


def test_the_trainer_writes_through_the_atomic_io(new_policy, new_datamodule, fit, tmp_path):
    trainer, _ = fit(grpo(new_policy), new_datamodule(), max_steps=1, plugins=[AtomicCheckpointIO()])
    trainer.save_checkpoint(tmp_path / "sub" / "step1.ckpt")
    assert torch.load(tmp_path / "sub" / "step1.ckpt", weights_only=True)["global_step"] == 1


# ------------------------------------------------------------------------------------------------- signals
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_saves_a_checkpoint_that_resumes_like_an_uninterrupted_run(
    signum, new_policy, new_datamodule, fit, params_snapshot, tmp_path
):
    def fresh():
        L.seed_everything(0)
        return grpo(new_policy), new_datamodule(train_size=16)

    module, data = fresh()
    preemption = PreemptionCheckpoint(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        fit(module, data, max_steps=4, callbacks=[preemption, SendSignal(signum, at_step=2)])
    assert stopped.value.code == 128 + signum, "a preempted run must not exit 0"
    checkpoint = tmp_path / PREEMPTED_FILENAME
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 2

    resumed, data = fresh()
    trainer, recorder = fit(resumed, data, max_steps=3, ckpt_path=str(checkpoint))
    straight, data = fresh()
    _, straight_recorder = fit(straight, data, max_steps=3)
    assert trainer.global_step == 3 and [s["global_step"] for s in recorder.steps] == [3]
    texts = [r.completion for r in recorder.steps[-1]["outputs"]["records"]]
    assert texts == [r.completion for r in straight_recorder.steps[-1]["outputs"]["records"]]
    after, expected = params_snapshot(resumed.policy.model), params_snapshot(straight.policy.model)
    for name in expected:
        torch.testing.assert_close(after[name], expected[name], atol=1e-6, rtol=0, msg=name)


# ------------------------------------------------------------------------------------------------- non-finite
class PoisonGradient(Callback):
    """Make the gradients of the training batches numbered in ``batches`` (0, 1, ... over the run) NaN, through a
    hook on the first trainable parameter."""

    def __init__(self, batches: set[int]):
        self.batches, self.seen, self.handle = batches, 0, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        parameter = module.policy.trainable_parameters()[0]
        poison = self.seen in self.batches
        self.handle = parameter.register_hook(lambda grad: grad * math.nan if poison else grad)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.handle.remove()
        self.seen += 1


def test_a_nan_gradient_is_skipped_counted_and_never_reaches_the_weights(new_policy, new_datamodule, fit):
    module = grpo(new_policy)
    before = [p.detach().clone() for p in module.policy.trainable_parameters()]
    poison = PoisonGradient({0})
    trainer, recorder = fit(module, new_datamodule(), max_steps=3, callbacks=[poison])
    assert trainer.global_step == 3 and poison.seen == 3, "a skipped update is a step of the trainer, in every module"
    assert module.skipped_updates == 1
    assert recorder.metric("train/skipped_updates")[-1] == 1.0
    parameters = module.policy.trainable_parameters()
    assert all(torch.isfinite(p).all() for p in parameters)
    assert any(not torch.equal(b, p) for b, p in zip(before, parameters, strict=True)), "later steps still train"
    optimizer_steps = trainer.optimizers[0].state_dict()["state"][0]["step"]
    assert float(optimizer_steps) == 2, "the skipped update must not step the optimizer"


def test_consecutive_nan_gradients_stop_the_run_with_the_weights_untouched(new_policy, new_datamodule, fit):
    module = grpo(new_policy, max_nonfinite_steps=2)
    before = [p.detach().clone() for p in module.policy.trainable_parameters()]
    with pytest.raises(NonFiniteTrainingError, match="2 consecutive updates were not finite"):
        fit(module, new_datamodule(), max_steps=4, callbacks=[PoisonGradient({0, 1, 2, 3})])
    for b, p in zip(before, module.policy.trainable_parameters(), strict=True):
        assert torch.equal(b, p)


def test_all_nan_rewards_stop_the_run_naming_the_reward(new_policy, new_datamodule, fit):
    module = grpo(new_policy, rewards=[NaNReward(name="broken")], max_nonfinite_steps=2)
    with pytest.warns(RuntimeWarning, match="non-finite"), pytest.raises(NonFiniteTrainingError, match="{.broken.: 8}"):
        fit(module, new_datamodule(), max_steps=4)
    assert module.global_step == 1, "the first all-NaN rollout is allowed, the second stops the run"


def test_max_nonfinite_steps_must_be_positive(new_policy):
    with pytest.raises(ValueError, match="max_nonfinite_steps must be >= 1"):
        grpo(new_policy, max_nonfinite_steps=0)


def test_the_cli_trainer_checkpoints_on_preemption_and_writes_atomically(tmp_path, monkeypatch):
    from pathlib import Path

    from app.command_line.commands import AppCLI

    monkeypatch.chdir(tmp_path)
    config = Path(__file__).parents[1] / "fixtures" / "tiny_grpo.yaml"
    cli = AppCLI(args=["--config", str(config)], run=False)
    assert sum(isinstance(c, PreemptionCheckpoint) for c in cli.trainer.callbacks) == 1
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_an_unwritable_export_folder_fails_before_training(new_policy, new_datamodule, fit, tmp_path):
    from app.errors import ConfigError
    from app.export import ExportPolicy

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    module = grpo(new_policy)
    before = [p.detach().clone() for p in module.policy.trainable_parameters()]
    with pytest.raises(ConfigError, match="export folder .* is not writable"):
        fit(module, new_datamodule(), max_steps=1, callbacks=[ExportPolicy(str(blocker / "policy"))])
    assert all(torch.equal(b, p) for b, p in zip(before, module.policy.trainable_parameters(), strict=True))


def test_object_store_paths_go_to_lightnings_own_writer(monkeypatch, tmp_path):
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    written = []
    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", lambda self, c, path, options=None: written.append(path))
    AtomicCheckpointIO().save_checkpoint({"step": 1}, "s3://bucket/run/last.ckpt")
    AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "last.ckpt")
    assert written == ["s3://bucket/run/last.ckpt"] and torch.load(tmp_path / "last.ckpt") == {"step": 1}
    assert PreemptionCheckpoint("s3://bucket/run").checkpoint_path(None) == f"s3://bucket/run/{PREEMPTED_FILENAME}"


# ------------------------------------------------------------------------------------- automatic optimisation
def sft(new_policy, **optimizer):
    from app.modules import VLMSFTModule

    return VLMSFTModule(
        new_policy("tiny-qwen2-vl", lora_r=4),
        optimizer=OptimizerSettings(**{"learning_rate": 1e-2, **optimizer}),
        eval_max_new_tokens=4,
    )


def test_sft_skips_a_nan_gradient_step_without_touching_weights_or_optimizer_state(new_policy, new_datamodule, fit):
    module = sft(new_policy)
    poison = PoisonGradient({0})
    trainer, recorder = fit(module, new_datamodule(), max_steps=3, callbacks=[poison])
    assert module.skipped_updates == 1 and recorder.metric("train/skipped_updates")[-1] == 1.0
    assert all(torch.isfinite(p).all() for p in module.policy.trainable_parameters())
    state = trainer.optimizers[0].state_dict()["state"]
    assert float(state[0]["step"]) == 2, "the poisoned step must leave AdamW's state of every parameter unchanged"


def test_sft_stops_after_consecutive_nan_gradients(new_policy, new_datamodule, fit):
    module = sft(new_policy, max_nonfinite_steps=2)
    before = [p.detach().clone() for p in module.policy.trainable_parameters()]
    with pytest.raises(NonFiniteTrainingError, match="2 consecutive updates"):
        fit(module, new_datamodule(), max_steps=4, callbacks=[PoisonGradient({0, 1, 2, 3})])
    for b, p in zip(before, module.policy.trainable_parameters(), strict=True):
        assert torch.equal(b, p)


def test_only_consecutive_skips_count_towards_the_stop_and_each_is_logged(new_policy, caplog):
    module = sft(new_policy, max_nonfinite_steps=2)
    with caplog.at_level("WARNING", logger="app.modules.policy_module"):
        module._count_skip(NONFINITE_GRADIENT)
        module._count_applied()  # a finite update resets the run of skips
        module._count_skip(UNDONE)
    assert module.skipped_updates == 2 and module._consecutive_skips == 1
    counters = "trainer.global_step counts it, AdamW's step count and the learning-rate schedule do not"
    assert caplog.messages == [
        f"skipped an update with a non-finite loss or gradient (1 in a row, 1 in all); {counters}",
        "skipped an update with an optimizer step that left NaN or inf behind, undone "
        f"(1 in a row, 2 in all); {counters}",
    ]
    stop = (
        r"^2 consecutive updates were not finite and were skipped \(the last: a non-finite loss or gradient\); "
        r"stopping \(the weights are unchanged since the last finite update\)\. Lower the learning rate, check the "
        "rewards"
    )
    with pytest.raises(NonFiniteTrainingError, match=stop):
        module._count_skip(NONFINITE_GRADIENT)

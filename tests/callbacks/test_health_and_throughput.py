import math

import pytest

from app.modules import VLMGRPOModule
from app.rewards import FormatReward
from app.settings import PipelineSettings, SamplingSettings
from callbacks.health import TrainingHealthMonitor, TrainingHealthWarning
from callbacks.throughput import ThroughputLogger


def test_each_alarm_names_the_step_and_value_and_fires_once_per_episode():
    monitor = TrainingHealthMonitor(max_kl=0.5, max_clip_fraction=0.3, patience=2, min_length_ratio=0.5)
    with pytest.warns(TrainingHealthWarning) as caught:
        assert monitor.check(1, {"train/kl": 0.1, "train/completion_length": 40.0}) == []
        (kl,) = monitor.check(2, {"train/kl": 0.9, "train/clip_fraction": 0.1})
        assert monitor.check(3, {"train/kl": 1.2}) == []  # still the same episode
        assert monitor.check(4, {"train/kl": 0.1}) == []
        (again,) = monitor.check(5, {"train/kl": 0.7})
        (clip,) = monitor.check(6, {"train/clip_fraction": 0.4})
        (length,) = monitor.check(7, {"train/completion_length": 12.0})
        assert monitor.check(8, {"train/frac_zero_std": 1.0}) == []  # patience 2
        (collapse,) = monitor.check(9, {"train/frac_zero_std": 0.97})
        (nan,) = monitor.check(10, {"train/loss": math.nan, "train/reward/total": 0.5})
    assert (kl.kind, kl.step, kl.value) == ("kl_blowup", 2, 0.9) and "step 2" in kl.message and "0.9" in kl.message
    assert (again.step, clip.kind, length.kind, length.value) == (5, "clip_blowup", "length_collapse", 12.0)
    assert (collapse.kind, collapse.step) == ("reward_collapse", 9) and "97%" in collapse.message
    assert (nan.kind, nan.metric) == ("nonfinite", "train/loss") and "nan" in nan.message
    assert len(caught) == len(monitor.alarms) == 6
    with pytest.raises(FloatingPointError, match="step 3: train/kl is inf"):
        TrainingHealthMonitor(raise_on_nonfinite=True).check(3, {"train/kl": math.inf})


def test_monitor_reads_the_logged_metrics_of_a_fit(tmp_path, stand_in, make_trainer):
    monitor = TrainingHealthMonitor(max_kl=1.0)
    module = stand_in(metrics={2: {"train/kl": 5.0}, 3: {"train/reward/total": math.nan}})
    with pytest.warns(TrainingHealthWarning):
        make_trainer(tmp_path, [monitor], max_steps=4, logger=False).fit(module)
    # the module's step 2 ends at global step 3
    assert [(a.kind, a.step, a.metric) for a in monitor.alarms] == [
        ("kl_blowup", 3, "train/kl"),
        ("nonfinite", 4, "train/reward/total"),
    ]


def test_throughput_logs_rates_and_phase_times(tmp_path, stand_in, make_trainer, tensorboard):
    callback = ThroughputLogger(window_size=2)
    trainer = make_trainer(tmp_path, [callback], max_steps=3)
    trainer.fit(stand_in())
    scalars, _ = tensorboard(trainer.logger.log_dir)
    assert sorted(scalars["train/throughput/samples_per_sec"]) == [2, 3]  # from the second step on
    step_time = scalars["train/time/step"][3]
    assert scalars["train/throughput/samples_per_sec"][3] == pytest.approx(4 / step_time, rel=1e-3)  # B*K = 4
    assert scalars["train/throughput/tokens_per_sec"][3] == pytest.approx(4 * 20 / step_time, rel=1e-3)
    assert scalars["train/time/rollout"][3] == pytest.approx(0.01)
    assert "train/throughput/mfu" not in scalars  # CPU: no peak FLOP/s known
    with pytest.raises(ValueError, match="window_size"):
        ThroughputLogger(window_size=1)


def test_mfu_is_the_estimated_flops_over_the_peak(tmp_path, stand_in, make_trainer, tensorboard):
    callback = ThroughputLogger(window_size=2, peak_flops=1e9)
    trainer = make_trainer(tmp_path, [callback], max_steps=2)
    module = stand_in()
    trainer.fit(module)
    scalars, _ = tensorboard(trainer.logger.log_dir)
    parameters = sum(p.numel() for p in module.parameters())  # 3 (Linear(2, 1))
    flops = (2 + 6) * parameters * 4 * 20  # num_iterations 1; B*K = 4 samples of 20 tokens
    assert scalars["train/throughput/mfu"][2] == pytest.approx(flops / scalars["train/time/step"][2] / 1e9, rel=1e-3)
    with pytest.raises(ValueError, match="peak_flops"):
        ThroughputLogger(peak_flops=0)


def test_the_delayed_pipelines_priming_step_logs_its_time_and_the_rates_count_trained_completions(
    new_policy, new_datamodule, fit
):
    """With ``delay: 1`` the first step trains nothing (empty outputs, no ``train/completion_length``); the rates then
    count each trained step's completions and their real tokens (``outputs["generated_tokens"]``)."""
    module = VLMGRPOModule(
        new_policy("tiny-qwen2-vl", lora_r=4),
        rewards=[FormatReward()],
        sampling=SamplingSettings(group_size=2, max_new_tokens=8),
        pipeline=PipelineSettings(delay=1, workers="inline"),
    )
    callback = ThroughputLogger(window_size=2)
    trainer, recorder = fit(module, new_datamodule(train_size=16, batch_size=2), max_steps=3, callbacks=[callback])
    first, *trained = [step["outputs"] for step in recorder.steps]
    assert not first and len(trained) == 3
    last = trained[-1]
    n = len(last["rewards"].total)  # B * K = 4
    assert n == 4 and n <= last["generated_tokens"] <= n * 8  # at least one token (EOS), at most max_new_tokens each
    seconds = callback.last["train/time/step"]  # window 2: the rates over the last step alone
    assert callback.last["train/throughput/samples_per_sec"] == pytest.approx(n / seconds, rel=1e-6)
    assert callback.last["train/throughput/tokens_per_sec"] == pytest.approx(
        last["generated_tokens"] / seconds, rel=1e-6
    )

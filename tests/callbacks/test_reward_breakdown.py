import math
from types import SimpleNamespace

import pytest
import torch

from app.tasks.vbvr import VBVRScorerReward, get_task
from app.types import VisualSample
from callbacks.reward_breakdown import RewardBreakdownLogger, breakdown, failed_check_counts


def test_breakdown_values():
    values = breakdown(
        {"acc": torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])}, torch.tensor([0.0, 0.0, -1.0, 1.0, 2.0, 0.0]), 2
    )
    assert values["acc/mean"] == pytest.approx(0.5)
    assert values["acc/std"] == pytest.approx(0.5)
    assert (values["acc/min"], values["acc/max"]) == (0.0, 1.0)
    assert values["acc/frac_zero_std"] == pytest.approx(2 / 3)  # groups (1,1) and (0,0)
    assert values["advantage/frac_positive"] == pytest.approx(2 / 6)
    assert values["advantage/frac_negative"] == pytest.approx(1 / 6)
    assert values["advantage/frac_zero"] == pytest.approx(3 / 6)
    assert values["advantage/abs_mean"] == pytest.approx(4 / 6)


def test_fit_logs_components_advantages_and_histograms(tmp_path, stand_in, make_trainer, tensorboard):
    callback = RewardBreakdownLogger(every_n_steps=1, histogram_every_n_steps=2)
    trainer = make_trainer(tmp_path, [callback], max_steps=3)
    trainer.fit(stand_in())
    assert sorted(callback.history) == [1, 2, 3]
    scalars, events = tensorboard(trainer.logger.log_dir)
    # the stand-in's accuracy alternates within a group: every group has spread, half the advantages are positive
    assert scalars["train/breakdown/accuracy/mean"] == {1: 0.5, 2: 0.5, 3: 0.5}
    assert scalars["train/breakdown/format/frac_zero_std"][2] == 1.0
    assert scalars["train/breakdown/accuracy/frac_zero_std"][2] == 0.0
    assert scalars["train/breakdown/advantage/frac_positive"][3] == 0.5
    assert "train/reward_hist/accuracy" in events.Tags()["histograms"]
    assert [e.step for e in events.Histograms("train/reward_hist/total")] == [2]


def test_records_stand_in_when_the_module_returns_no_rewards(tmp_path):
    callback = RewardBreakdownLogger()
    records = [SimpleNamespace(reward=r, advantage=a, components={"acc": r}) for r, a in ((1.0, 0.5), (0.0, -0.5))]
    trainer = SimpleNamespace(global_step=4, is_global_zero=True, loggers=[])
    callback.on_train_batch_end(trainer, SimpleNamespace(group_size=2), {"records": records}, None, 0)
    assert callback.history[4]["train/breakdown/acc/mean"] == 0.5
    assert callback.history[4]["train/breakdown/advantage/frac_zero"] == 0.0


def test_vbvr_failed_checks_are_counted_per_task_and_logged():
    task = get_task("object_counting")
    instance = task.generate(0)
    spec = {"task": instance.task, "params": {"image_size": task.image_size, **task.params}, "config": instance.config}
    sample = VisualSample(images=[], question=instance.prompt, task=instance.task, meta={"vbvr": spec})
    wrong = task.perturbations(instance.config, instance.solution)["wrong_count"]
    reward = VBVRScorerReward()
    scores = reward.score([instance.last_frame, wrong, wrong], [sample] * 3)
    assert scores.tolist() == [1.0, 0.0, 0.0]
    counts = dict(reward.failed_checks)
    assert counts and all(task_name == "object_counting" for task_name, _ in counts)
    assert max(counts.values()) == 2  # each wrong rendering fails its checks once; the right one fails none
    module = SimpleNamespace(rewards=SimpleNamespace(components=[reward]), group_size=3)
    callback = RewardBreakdownLogger()
    outputs = {"records": [SimpleNamespace(reward=float(s), advantage=0.0, components={}) for s in scores]}
    callback.on_train_batch_end(
        SimpleNamespace(global_step=1, is_global_zero=True, loggers=[]), module, outputs, None, 0
    )
    logged = {k: v for k, v in callback.history[1].items() if k.startswith("train/vbvr_failed/object_counting/")}
    assert logged and all(v == 2.0 for v in logged.values() if not math.isnan(v)) and failed_check_counts(module)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="every_n_steps"):
        RewardBreakdownLogger(every_n_steps=0)


def test_docstring_examples_of_the_callbacks():
    import doctest

    import callbacks.reward_breakdown

    assert doctest.testmod(callbacks.reward_breakdown).failed == 0

"""configs/quickstart/motion_direction.yaml trains: two GRPO steps of the tiny Qwen3-VL on motion clips, in process."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "quickstart" / "motion_direction.yaml"


@pytest.mark.slow
def test_the_motion_direction_recipe_trains_the_tiny_qwen3_vl_two_grpo_steps(tmp_path, monkeypatch, fit):
    from app.command_line.commands import AppCLI
    from app.tasks.motion import DirectionDataset

    monkeypatch.chdir(tmp_path)  # the recipe's run folders land here
    args = ["--config", str(CONFIG), "--model.init_args.sampling.group_size", "2"]
    args += ["--model.init_args.sampling.max_new_tokens", "8"]
    for key, value in {"train_size": 4, "val_size": 2, "test_size": 2, "batch_size": 2}.items():
        args += [f"--data.init_args.{key}", str(value)]
    cli = AppCLI(args=args, run=False)
    assert cli.model.policy.model_name == "tiny-qwen3-vl"
    assert cli.model.rewards.names == ["accuracy", "format"]
    encoded = []  # the videos of every row the policy encodes
    encode = cli.model.policy.encode_prompts

    def recording(samples, *args, **kwargs):
        prompts = encode(samples, *args, **kwargs)
        encoded.append((prompts.videos_per_row, int(prompts.tensors["video_grid_thw"].shape[0])))
        return prompts

    monkeypatch.setattr(cli.model.policy, "encode_prompts", recording)

    trainer, recorder = fit(cli.model, cli.datamodule)

    assert isinstance(cli.datamodule.train_dataset, DirectionDataset)
    assert trainer.global_step == 2
    for name in ("accuracy", "format"):
        rewards = recorder.metric(f"train/reward/{name}")
        assert len(rewards) == 2 and all(math.isfinite(value) and 0.0 <= value <= 1.0 for value in rewards)
    assert encoded and all(per_row == [1] * videos for per_row, videos in encoded)  # one video a row, every row
    for key in ("train/loss/policy", "train/entropy/motion_direction"):  # the loss ran on the task's rows
        assert all(math.isfinite(value) for value in recorder.metric(key))


def test_the_recipe_validates_on_the_shifted_split_with_one_override(print_config):
    config = print_config(["--config", str(CONFIG), "--data.init_args.eval_dataset.init_args.split", "shifted"])
    data = config["data"]["init_args"]
    assert data["dataset"]["init_args"]["split"] == "in_domain"
    assert data["eval_dataset"]["class_path"] == "app.tasks.motion.DirectionDataset"
    assert data["eval_dataset"]["init_args"]["split"] == "shifted"

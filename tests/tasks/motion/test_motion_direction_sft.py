"""configs/quickstart/motion_direction_sft.yaml trains: two SFT steps of the tiny Qwen3-VL on motion clips, each shown
as its first and last frame in one temporal patch (``max_video_frames: 2``), the vision tower among the trained."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "quickstart" / "motion_direction_sft.yaml"


@pytest.mark.slow
def test_the_motion_direction_sft_recipe_trains_two_steps_on_one_temporal_patch_a_clip(tmp_path, monkeypatch, fit):
    from app.command_line.commands import AppCLI
    from app.tasks.motion import DirectionDataset

    monkeypatch.chdir(tmp_path)  # the recipe's run folders land here
    args = ["--config", str(CONFIG), "--validate_before_and_after", "false"]
    for key, value in {"train_size": 4, "val_size": 2, "test_size": 2, "batch_size": 2}.items():
        args += [f"--data.init_args.{key}", str(value)]
    cli = AppCLI(args=args, run=False)
    policy = cli.model.policy
    assert policy.model_name == "tiny-qwen3-vl" and policy.max_video_frames == 2
    assert policy.vision_parameters() and all(p.requires_grad for p in policy.vision_parameters())
    grids = []  # the temporal patches of every video the policy encodes
    encode = policy.encode_prompts

    def recording(samples, *args, **kwargs):
        prompts = encode(samples, *args, **kwargs)
        grids.append(prompts.tensors["video_grid_thw"][:, 0].tolist())
        return prompts

    monkeypatch.setattr(policy, "encode_prompts", recording)

    trainer, recorder = fit(cli.model, cli.datamodule)

    assert isinstance(cli.datamodule.train_dataset, DirectionDataset)
    assert trainer.global_step == 2
    assert grids and all(patches == [1] * len(patches) for patches in grids)  # 6-8 frames -> first and last
    assert all(math.isfinite(value) for value in recorder.metric("train/loss/sft"))

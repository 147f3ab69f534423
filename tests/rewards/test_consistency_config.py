"""configs/quickstart/consistency_dots.yaml trains end to end: two GRPO steps on paired prompts with the consistency
reward."""

import math
from pathlib import Path

from app.command_line.commands import AppCLI

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart/consistency_dots.yaml"


def test_two_consistency_grpo_steps_from_the_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe's relative paths (logger, export) land in tmp_path
    cli = AppCLI(
        args=[
            "--config",
            str(CONFIG),
            "--model.init_args.policy.init_args.model",
            "tiny-qwen3-vl",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.max_steps",
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--data.init_args.train_size",
            "16",
            "--data.init_args.val_size",
            "2",
        ],
        run=False,
    )
    assert cli.model.rewards.names == ["consistency", "format"]
    assert cli.model.rewards.components[0].pairing == "minimal"
    cli.datamodule.setup("fit")
    assert all(x.task == "dots_left_of_pairs" for x in cli.datamodule.train_dataset[0])

    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    assert cli.trainer.global_step == 2
    metrics = cli.trainer.callback_metrics
    assert "train/reward/consistency" in metrics and "train/reward/format" in metrics
    consistency = float(metrics["train/reward/consistency"])
    assert math.isfinite(consistency) and 0.0 <= consistency <= 1.0
    assert (tmp_path / "runs" / "consistency_dots" / "policy" / "config.json").exists()  # ExportPolicy ran

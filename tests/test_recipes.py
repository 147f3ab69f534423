"""CPU recipes train end to end: two GRPO steps from each config on the embedded model, logging their rewards."""

import math
from pathlib import Path

import pytest

from app.command_line.commands import AppCLI

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize(
    "config, rewards",
    [
        ("quickstart/quickstart.yaml", ["accuracy", "format"]),
        ("quickstart/reason_rft_counting.yaml", ["numeric_tolerance", "format"]),
        ("quickstart/reason_rft_transform.yaml", ["function_sequence", "format"]),
    ],
)
def test_recipe_trains_two_steps(config, rewards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe's relative paths (logger, export) land in tmp_path
    args = ["--config", str(CONFIGS / config), "--model.init_args.policy.init_args.model", "tiny-qwen3-vl"]
    args += ["--trainer.max_steps", "2", "--trainer.enable_progress_bar", "false"]
    args += ["--data.init_args.train_size", "16", "--data.init_args.val_size", "2"]
    cli = AppCLI(args=args, run=False)
    assert cli.model.rewards.names == rewards

    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    assert cli.trainer.global_step == 2
    for name in rewards:
        value = float(cli.trainer.callback_metrics[f"train/reward/{name}"])
        assert math.isfinite(value)

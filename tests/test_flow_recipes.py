"""The flow quickstart's two configs parse and train: stage 1 pretrains and exports, stage 2 runs GRPO from it."""

import math
from pathlib import Path

from app.command_line.commands import AppCLI

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMALL = [
    "--trainer.max_steps",
    "2",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.val_check_interval",
    "2",
    "--data.init_args.train_size",
    "16",
    "--data.init_args.val_size",
    "2",
    "--data.init_args.batch_size",
    "2",
]


def test_flow_quickstart_two_stages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipes' relative paths (logger, export) land in tmp_path
    cli = AppCLI(
        args=[
            "--config",
            str(CONFIGS / "quickstart/quickstart_flow_pretrain.yaml"),
            *SMALL,
            "--model.init_args.num_steps",
            "2",
            "--model.init_args.vae_warmup_steps",
            "1",
        ],
        run=False,
    )
    assert cli.model.policy.uses_lora is False
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert math.isfinite(float(cli.trainer.callback_metrics["train/loss/flow"]))
    assert (tmp_path / "runs/quickstart_flow_pretrain/policy/model_index.json").exists()

    cli = AppCLI(
        args=[
            "--config",
            str(CONFIGS / "quickstart/quickstart_flow.yaml"),
            *SMALL,
            "--model.init_args.sampling.group_size",
            "2",
            "--model.init_args.sampling.num_steps",
            "2",
        ],
        run=False,
    )
    assert cli.model.sampling.sampler == "cps" and cli.model.sampling.eta == 0.7
    assert cli.model.group_size == 2 and cli.model.hparams.sampling["num_steps"] == 2
    assert cli.model.policy.uses_lora and cli.model.rewards.names == ["color_region"]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert math.isfinite(float(cli.trainer.callback_metrics["train/reward/color_region"]))

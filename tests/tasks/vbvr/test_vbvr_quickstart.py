"""The conditioned VBVR quickstart's two stages run with reduced steps: stage 1 pretrains the image-edit model on
problem -> solution pairs and exports it, stage 2 runs flow-GRPO from it and writes the problem | before | after
grids; validation reports every split, task and regime."""

import math
from pathlib import Path

from app.command_line.commands import AppCLI

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SMALL = [
    "--trainer.max_steps",
    "2",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.val_check_interval",
    "2",
    "--data.init_args.train_size",
    "8",
    "--data.init_args.val_size",
    "4",
    "--data.init_args.batch_size",
    "2",
    "--data.init_args.val_batch_size",
    "4",
]


def test_vbvr_quickstart_two_stages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipes' relative paths (logger, export, grids) land in tmp_path
    cli = AppCLI(
        args=[
            "--config",
            str(CONFIGS / "quickstart/quickstart_vbvr_pretrain.yaml"),
            *SMALL,
            "--model.init_args.num_steps",
            "2",
            "--model.init_args.vae_warmup_steps",
            "1",
        ],
        run=False,
    )
    assert cli.model.policy.conditioning_mode == "kontext" and not cli.model.policy.uses_lora
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert math.isfinite(float(cli.trainer.callback_metrics["train/loss/flow"]))
    assert (tmp_path / "runs/quickstart_vbvr_pretrain/policy/model_index.json").exists()

    cli = AppCLI(
        args=[
            "--config",
            str(CONFIGS / "quickstart/quickstart_vbvr.yaml"),
            *SMALL,
            "--model.init_args.sampling.group_size",
            "2",
            "--model.init_args.sampling.num_steps",
            "2",
        ],
        run=False,
    )
    assert cli.model.sampling.sampler == "cps" and cli.model.sampling.eta == 0.7
    assert cli.model.policy.conditioning_mode == "kontext" and cli.model.policy.uses_lora
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    metrics = cli.trainer.callback_metrics
    assert math.isfinite(float(metrics["train/reward/vbvr_scorer"]))
    for split in ("in_domain", "out_of_domain"):
        for task in ("color_mixing", "object_counting"):
            assert 0.0 <= float(metrics[f"val/{split}/{task}/last_frame"]) <= 1.0
    grids = sorted(p.name for p in (tmp_path / "runs/quickstart_vbvr/grids").glob("*.png"))
    assert grids == [
        f"{t}-{s}.png" for t in ("color_mixing", "object_counting") for s in ("in_domain", "out_of_domain")
    ]

"""Two GRPO steps of configs/trisr_dots.yaml (dot triplets, TriSR + format rewards) through AppCLI."""

from pathlib import Path

from app.cli import AppCLI

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "trisr_dots.yaml"


def test_two_grpo_steps_log_the_trisr_reward(tmp_path):
    cli = AppCLI(
        args=[
            "--config",
            str(CONFIG),
            "--trainer.max_steps=2",
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.log_every_n_steps=1",
            "--data.init_args.val_size=4",
            "--data.init_args.train_size=8",
            "--data.init_args.batch_size=2",
            "--model.init_args.sampling.max_new_tokens=16",
            "--model.init_args.eval_max_new_tokens=16",
        ],
        run=False,
    )
    assert cli.model.policy.model_name == "tiny-qwen3-vl"
    assert cli.model.rewards.names == ["tri_sr", "format"]
    assert [r.name for r in cli.model.eval_rewards] == [
        "triplet_overall_accuracy",
        "triplet_partial_accuracy",
        "format",
    ]
    assert cli.datamodule.task == "dots_count_triplets"
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    metrics = cli.trainer.callback_metrics
    assert "train/reward/tri_sr" in metrics and "train/reward/format" in metrics
    low, high = cli.model.rewards.components[0].value_range
    assert low <= float(metrics["train/reward/tri_sr"]) <= high
    # the evaluation metrics score greedy completions of the validation split
    results = cli.trainer.validate(cli.model, datamodule=cli.datamodule)
    for key in ("val/triplet_overall_accuracy/dots_count_triplets", "val/triplet_partial_accuracy", "val/format"):
        assert 0.0 <= results[0][key] <= 1.0

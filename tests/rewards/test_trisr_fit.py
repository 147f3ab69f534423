"""Two GRPO steps of configs/quickstart/trisr_dots.yaml (dot triplets, TriSR + format rewards) through AppCLI."""

from pathlib import Path

import pytest
import yaml

from app.command_line.commands import AppCLI

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart/trisr_dots.yaml"


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
    assert cli.model.rewards.names == [
        "tri_sr",
        "format",
        "cosine_length",
        "repetition_penalty",
        "soft_overlong_penalty",
    ]
    assert [r.name for r in cli.model.eval_rewards] == [
        "triplet_overall_accuracy",
        "triplet_partial_accuracy",
        "format",
    ]
    cli.datamodule.setup("fit")
    assert cli.datamodule.train_dataset[0].task == "dots_count_triplets"
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


def test_the_stabilisers_and_components_parse_from_yaml(tmp_path, capsys):
    """The paper's stabilisers (cosine length around a triplet correctness, repetition, overlong) and the TriSR
    components as weight-0 log entries, all from YAML (``print_config`` parses and validates without instantiating)."""
    config = yaml.safe_load(CONFIG.read_text())
    config["model"]["init_args"]["rewards"] += [
        {"class_path": "app.rewards.trisr.TripletConsistencyReward", "init_args": {"weight": 0.0}},
    ]
    path = tmp_path / "trisr_dots_stabilised.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--config", str(path), "--print_config"])
    printed = capsys.readouterr()
    assert exit_info.value.code in (0, None), printed.err[-2000:]
    rewards = yaml.safe_load(printed.out)["model"]["init_args"]["rewards"]
    assert rewards[2]["init_args"]["correctness"]["class_path"].endswith("TripletOverallAccuracy")
    cli = AppCLI(
        args=[
            "--config",
            str(path),
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
        ],
        run=False,
    )
    assert cli.model.rewards.names == [
        "tri_sr",
        "format",
        "cosine_length",
        "repetition_penalty",
        "soft_overlong_penalty",
        "triplet_consistency",
    ]

"""Drills on what ``python -m app`` prints: short errors that name the field and suggest a fix (the full traceback only
with ``APP_DEBUG=1``), help that lists the commands and the recipes, filtered third-party noise, a progress bar that
counts steps, and the closing list of a run's artefacts."""

import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from app.command_line.commands import main
from app.command_line.console import quiet_known_noise, step_progress_bar
from app.command_line.error_messages import describe_parse_error, moved_class_path
from app.errors import ConfigError
from app.export import find_checkpoint

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TINY_GRPO = FIXTURES / "tiny_grpo.yaml"
MAX_LINES = 10


def python_m_app(args: list[str], env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_main(args: list[str], capsys) -> tuple[int, str]:
    """``main(args)`` in process, for runs that stop before anything is built: exit code, stdout + stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    code = exit_info.value.code
    return (0 if code is None else code), captured.out + captured.err


# ------------------------------------------------------------------------------ errors found when parsing the config
@pytest.mark.parametrize(
    "override, expected",
    [
        (
            ["--model.init_args.loss.eps_lowww", "0.1"],
            ["model.init_args.loss.eps_lowww", "did you mean 'eps_low'?", "accepted: eps_low, eps_high, aggregation"],
        ),
        (
            ["--model.init_args.eps_lowww", "0.1"],
            ["model.init_args.eps_lowww", "accepted: policy, rewards, sampling, grpo, loss, optimizer"],
        ),
        (
            ["--model.init_args.policy.init_args.lora.rr", "3"],
            ["model.init_args.policy.init_args.lora.rr", "did you mean 'r'?", "accepted: r, alpha, dropout"],
        ),
        (["--trainer.max_stepz", "3"], ["--trainer.max_stepz", "did you mean '--trainer.max_steps'?"]),
        (
            ["--model.class_path", "app.modules.VLMGRPOModul"],
            ["unknown class_path 'app.modules.VLMGRPOModul'", "did you mean 'app.modules.VLMGRPOModule'?"],
        ),
        (
            ["--model.init_args.sampling.max_new_tokens", "abc"],
            ["model.init_args.sampling.max_new_tokens: expected int, got 'abc'"],
        ),
        (
            ["--model.init_args.optimizer.learning_rate", "abc"],  # float | None: null is the family's default
            ["model.init_args.optimizer.learning_rate: expected float, got 'abc'"],
        ),
        (
            ["--model.init_args.grpo.advantage_scale", "grop"],
            [
                "model.init_args.grpo.advantage_scale: got 'grop', "
                "expected one of group, batch, global, per_prompt, none",
                "did you mean 'group'?",
            ],
        ),
    ],
    ids=[
        "misspelt_key",
        "unknown_module_key",
        "misspelt_nested_key",
        "misspelt_trainer_option",
        "unknown_class_path",
        "bad_type",
        "bad_optional_type",
        "choice",
    ],
)
def test_a_config_error_is_a_few_lines_naming_the_field_and_a_fix(override, expected, capsys):
    code, output = run_main(["fit", "--config", str(TINY_GRPO), *override], capsys)
    assert code == 2
    lines = output.splitlines()
    assert 2 <= len(lines) <= MAX_LINES, output
    assert lines[0].startswith("error: ")
    for text in expected:
        assert text in output, output
    assert "APP_DEBUG=1" in lines[-1] and "python -m app fit --help" in lines[-1]
    assert "Traceback" not in output and "Given value" not in output and "NoneType" not in output


@pytest.mark.parametrize(
    ("reward", "suggestion"),
    [
        ("NoSuchReward", None),
        ("AccuracyRewrd", "app.rewards.AccuracyReward"),
        ("FormatRewad", "app.rewards.FormatReward"),
    ],
)
def test_an_unknown_reward_class_is_one_error_with_a_suggestion_only_when_one_is_close(reward, suggestion, capsys):
    override = f'[{{"class_path": "app.rewards.{reward}"}}]'
    code, output = run_main(["fit", "--config", str(TINY_GRPO), "--model.init_args.rewards", override], capsys)
    assert code == 2
    heads = [line for line in output.splitlines() if line.startswith("error: ")]
    assert heads == [
        f"error: model.init_args.rewards: unknown class_path 'app.rewards.{reward}': module 'app.rewards' has no "
        f"attribute '{reward}'" + (f"; did you mean '{suggestion}'?" if suggestion else "")
    ], output  # the reward list taken out to look for more errors is not "required": that error is caused, not made


def test_a_misspelt_key_in_a_yaml_file_is_named_with_its_path(tmp_path, capsys):
    text = TINY_GRPO.read_text().replace("        dot_radius: 12\n", "        dot_radus: 12\n")
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    code, output = run_main(["fit", "--config", str(path)], capsys)
    assert code == 2 and len(output.splitlines()) <= MAX_LINES, output
    assert "data.init_args.dataset.init_args.dot_radus" in output
    assert "Option 'dot_radus' is not accepted by app.tasks.dots.DotsDataset; did you mean 'dot_radius'?" in output


def test_app_debug_keeps_the_full_error(monkeypatch):
    import argparse

    monkeypatch.setenv("APP_DEBUG", "1")
    with pytest.raises(argparse.ArgumentError, match="Does not validate against any of the Union subtypes"):
        main(["fit", "--config", str(TINY_GRPO), "--model.init_args.eps_lowww", "0.1"])


def test_unrecognised_shapes_of_jsonargparse_errors_still_come_out_whole():
    text = describe_parse_error('Parser key "trainer.precision":\n  Something unforeseen: 17')
    assert text.splitlines()[0] == "error: trainer.precision: Something unforeseen: 17"


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], 'error: expected "subcommand" to be one of {fit,validate,test,predict,export}'),
        (
            ["fitt"],
            "error: unknown command 'fitt'; did you mean 'fit'? (commands: fit, validate, test, predict, export)",
        ),
        (
            ["fit", "--config", "configs/quickstrat.yaml"],
            "quickstrat.yaml; did you mean 'configs/quickstart/quickstart.yaml'?",
        ),
        (
            ["fit", "--config", "configs/trisr_dots.yaml"],
            "trisr_dots.yaml; did you mean 'configs/quickstart/trisr_dots.yaml'?",
        ),
        (["fit"], "error: fit needs --model (a recipe gives it: --config configs/X.yaml)"),
    ],
    ids=["no_command", "misspelt_command", "misspelt_config_file", "recipe_in_a_subfolder", "no_config"],
)
def test_command_and_config_file_mistakes_are_one_line(args, expected, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, output = run_main(args, capsys)
    assert code == 2 and len(output.splitlines()) == 2, output
    assert expected in output.splitlines()[0]


# ---------------------------------------------------------------------- errors raised when the config is instantiated
@pytest.mark.slow
@pytest.mark.parametrize(
    "override, expected",
    [
        (
            ["--model.init_args.sampling.group_size", "-2"],
            [
                "error: model.init_args.sampling.group_size = -2: group_size must be >= 1, got -2",
                "raised by app.settings.SamplingSettings (ValueError)",
            ],
        ),
        (
            ["--model.init_args.policy.init_args.model", "tiny-qwen9"],
            [
                "error: model.init_args.policy.init_args.model = 'tiny-qwen9': unknown embedded model 'tiny-qwen9'",
                "did you mean 'tiny-qwen",
                "known: ['tiny-qwen2-vl', 'tiny-qwen2.5-vl', 'tiny-qwen3-vl']",
            ],
        ),
        (
            ["--data.init_args.train_size", "0"],
            ["error: data.init_args.train_size = 0: train_size must be >= 1", "VisualTaskDataModule (ValueError)"],
        ),
        (
            ["--model.init_args.grpo.beta", "-1", "--model.init_args.optimizer.learning_rate", "-1"],
            [
                "error: model.init_args.grpo.beta = -1.0: grpo.beta must be >= 0, got -1.0",
                "error: model.init_args.optimizer.learning_rate = -1.0: optimizer.learning_rate must be > 0 or null",
            ],
        ),
    ],
    ids=["rejected_value", "unknown_embedded_model", "no_training_samples", "two_rejected_blocks"],
)
def test_a_value_a_constructor_rejects_is_a_few_lines_naming_the_field(override, expected, app_env, tmp_path):
    result = python_m_app(
        ["fit", "--config", str(TINY_GRPO), "--trainer.default_root_dir", str(tmp_path), *override], app_env()
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert len(output.splitlines()) <= MAX_LINES, output
    for text in expected:
        assert text in output, output
    assert "Traceback" not in output and "Namespace(" not in output


@pytest.mark.slow
def test_empty_training_data_is_an_error_naming_the_data_not_a_success(app_env, tmp_path):
    env = app_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{FIXTURES}"  # empty_data.py
    result = python_m_app(
        [
            "fit",
            "--config",
            str(TINY_GRPO),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--data.init_args.dataset",
            "empty_data.EmptyDots",
        ],
        env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert len(output.splitlines()) <= MAX_LINES, output
    last = output.splitlines()[-2]
    assert last.startswith("error: the training data is empty: app.data.VisualTaskDataModule gave no training batch")
    assert "data.init_args.train_size = 8" in last
    assert not (tmp_path / "summary.json").exists()


# ----------------------------------------------------------------------------------------------------------- help
def test_help_lists_the_commands_and_the_recipes(capsys):
    code, output = run_main(["--help"], capsys)
    assert code == 0
    assert "{fit,validate,test,predict,export}" in output
    assert "export --config configs/quickstart/quickstart.yaml --output_dir" in output
    assert "recipes (configs/: quickstart/ on CPU, vlm/ and flow/ for GPUs" in output
    for recipe in sorted((ROOT / "configs").rglob("*.yaml")):
        first = recipe.read_text().splitlines()[0].lstrip("# ")
        shown = recipe.relative_to(ROOT / "configs").as_posix()  # quickstart/quickstart.yaml
        assert any(line.split()[:2] == [shown, first.split()[0]] for line in output.splitlines()), shown


def test_export_has_its_own_help(capsys):
    code, output = run_main(["export", "--help"], capsys)
    assert code == 0
    assert "Write the policy of a checkpoint as a Hugging Face folder" in output
    assert "--output_dir OUTPUT_DIR" in output and "--ckpt_path CKPT_PATH" in output


def test_fit_help_lists_the_package_modules_and_data_modules(capsys):
    code, output = run_main(["fit", "--help"], capsys)
    assert code == 0
    text = " ".join(output.split())
    for name in ("VLMSFTModule", "VLMGRPOModule", "FlowGRPOModule", "FlowNFTModule", "FlowMatchingModule"):
        assert f"app.modules.{name}" in text
    assert "app.data.VisualTaskDataModule" in text and "app.data.ShardDataModule" in text


def test_export_without_an_output_folder_says_which_option_is_missing(capsys):
    code, output = run_main(["export", "--config", str(TINY_GRPO)], capsys)
    assert code == 2 and len(output.splitlines()) <= MAX_LINES
    assert output.splitlines()[0] == "error: export needs --output_dir"


# --------------------------------------------------------------------------------------------------- checkpoints
def test_find_checkpoint_takes_a_file_or_the_newest_checkpoint_under_a_folder(tmp_path):
    import os

    old, new = tmp_path / "checkpoints" / "epoch=0-step=1.ckpt", tmp_path / "checkpoints" / "epoch=1-step=2.ckpt"
    old.parent.mkdir()
    old.write_bytes(b"")
    new.write_bytes(b"")
    os.utime(old, (1, 1))
    assert find_checkpoint(old, "ignored") == old
    assert find_checkpoint(None, tmp_path) == new
    assert find_checkpoint(tmp_path / "checkpoints", "ignored") == new
    with pytest.raises(ConfigError, match="no such file or folder"):
        find_checkpoint(tmp_path / "last.ckpt", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no \*.ckpt file under it"):
        find_checkpoint(None, tmp_path / "empty")


# ------------------------------------------------------------------------------------------------ quiet, progress
def test_known_noise_is_filtered_and_other_warnings_are_not(caplog):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_noise()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn(
            "`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1
        )
        warnings.warn(
            "Found 319 module(s) in eval mode at the start of training. This may ...", UserWarning, stacklevel=1
        )
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [
        "something else is deprecated",
        "`isinstance(treespec, LeafSpec)` is deprecated",
    ]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        logger.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger")
        logger.info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]


def test_the_progress_bar_counts_steps_of_max_steps_across_epochs():
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    bar = step_progress_bar()
    seen = []

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            task = bar.progress.tasks[bar.train_progress_bar_id]
            seen.append((trainer.current_epoch, task.completed, task.total, task.description.strip()))

    trainer = L.Trainer(
        max_steps=5,
        limit_train_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[bar, Probe()],
        accelerator="cpu",
    )
    trainer.fit(BoringModel())
    assert [s[0] for s in seen] == [0, 0, 1, 1, 2]  # three passes over the data
    assert [s[1] for s in seen] == [1, 2, 3, 4, 5] and {s[2] for s in seen} == {5}
    assert {s[3] for s in seen} == {"Training"}


# --------------------------------------------------------------------------------------------- artefact summary
@pytest.mark.slow
def test_fit_ends_with_the_artefacts_and_each_path_exists(app_env, tmp_path):
    result = python_m_app(
        [
            "fit",
            "--config",
            str(TINY_GRPO),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.enable_checkpointing",
            "true",
            "--trainer.logger",
            "true",
        ],
        app_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line == "Artefacts:")
    rows = [re.match(r"^  (\S.*?)  +(\S.*)$", line) for line in lines[start + 1 : -1]]  # "  what   path"
    assert all(rows), lines[start:]
    found = {row.group(1): Path(row.group(2)) for row in rows}
    assert {"completions", "newest checkpoint", "summary", "TensorBoard logs", "config"} <= set(found), found
    for path in found.values():
        assert path.exists(), path
    assert found["newest checkpoint"].suffix == ".ckpt" and found["summary"].name == "summary.json"
    assert lines[-1].startswith("  (view: tensorboard --logdir ")
    assert "Tip:" not in result.stdout + result.stderr and "LeafSpec" not in result.stderr


def test_validate_ends_with_the_artefacts_and_adds_its_metrics_to_the_summary(tmp_path, capsys):
    main(["validate", "--config", str(TINY_GRPO), "--trainer.default_root_dir", str(tmp_path)])
    out = capsys.readouterr().out
    summary = yaml.safe_load((tmp_path / "summary.json").read_text())
    assert set(summary) == {"validate"} and "val/acc" in summary["validate"]
    tail = out.rstrip().splitlines()[-3:]
    assert tail[0] == "Artefacts:" and tail[1].split() == ["summary", str(tmp_path / "summary.json")]
    assert tail[2].split() == ["config", str(tmp_path / "config.yaml")]


@pytest.mark.parametrize(
    "args, asked",
    [
        (["fit", "--model.sampling.help"], "--model.sampling.help"),
        (["fit", "--model.policy.help", "app.models.VLMPolicy"], "--model.policy.help app.models.VLMPolicy"),
        (["fit", "--data.dataset.help=app.tasks.dots.DotsDataset"], "--data.dataset.help=app.tasks.dots.DotsDataset"),
    ],
    ids=["settings_block", "subclass", "data_module"],
)
def test_nested_help_before_the_class_says_how_to_ask(args, asked, capsys):
    code, output = run_main(args, capsys)
    key = asked[2:].split(".")[0]
    assert code == 2 and len(output.splitlines()) == 3, output
    assert (
        output.splitlines()[0]
        == f"error: {asked.split()[0].split('=')[0]} needs the {key} class before it: --{key}.help CLASS {asked}"
    )


def test_nested_help_after_the_class_prints_the_block(capsys):
    code, output = run_main(["fit", "--model.help", "app.modules.VLMGRPOModule", "--model.sampling.help"], capsys)
    assert code == 0
    assert "--model.sampling.temperature TEMPERATURE" in output


def test_a_class_path_of_a_moved_module_is_told_its_new_path(tmp_path, capsys):
    """app.faults moved into app.command_line: a YAML written before names the class by its old path."""
    config = yaml.safe_load(TINY_GRPO.read_text())
    config["trainer"]["callbacks"] = [{"class_path": "app.faults.PreemptionCheckpoint"}]
    path = tmp_path / "old_paths.yaml"
    path.write_text(yaml.safe_dump(config))
    code, output = run_main(["fit", "--config", str(path)], capsys)
    assert code == 2
    heads = [line for line in output.splitlines() if line.startswith("error: ")]
    assert heads == [
        "error: trainer.callbacks: unknown class_path 'app.faults.PreemptionCheckpoint': module 'app' has no attribute "
        "'faults'; it moved to 'app.command_line.faults.PreemptionCheckpoint'"
    ], output


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("app.faults.AtomicCheckpointIO", "app.command_line.faults.AtomicCheckpointIO"),
        ("app.cli.AppTrainer", "app.command_line.commands.AppTrainer"),
        ("app.embedded.models.TinyVLMSpec", "app.tiny.models.TinyVLMSpec"),
        ("app.report.RunHistory", "app.run_report.RunHistory"),
        ("app.faultsy.X", None),
        ("app.modules.VLMGRPOModule", None),
    ],
)
def test_moved_class_paths_map_to_the_new_module(old, new):
    assert moved_class_path(old) == new


# ------------------------------------------------------------------------------------ keys of older configs that moved
@pytest.mark.slow
def test_an_old_key_in_a_config_is_told_its_new_path(app_env, tmp_path):
    """Through the real command line: a VLM GRPO config written before the settings were split by family (issue 55)
    gets one short line per moved key, naming its new path, and no traceback."""
    config = yaml.safe_load(TINY_GRPO.read_text())
    init_args = config["model"]["init_args"]
    init_args["grpo"] = {"objective": "cispo", "eps_low": 1.0}
    init_args["loss_aggregation"] = "sequence_mean"
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(config))
    result = python_m_app(["fit", "--config", str(path), "--trainer.default_root_dir", str(tmp_path)], app_env())
    output = result.stdout + result.stderr
    assert result.returncode == 2 and len(output.splitlines()) <= MAX_LINES, output
    for old, new in [("grpo.objective", "loss.objective"), ("grpo.eps_low", "loss.eps_low")]:
        assert f"error: model.init_args.{old}: moved to model.init_args.{new}" in output, output
    assert "error: model.init_args.loss_aggregation: moved to model.init_args.loss.aggregation" in output, output
    assert "Traceback" not in output and "accepted:" not in output


@pytest.mark.parametrize(
    "config, override, expected",
    [
        ("quickstart.yaml", "mask_truncated", "moved to model.init_args.loss.mask_truncated"),
        ("quickstart.yaml", "fused_linear_loss", "moved to model.init_args.loss.fused_linear"),
        ("quickstart_flow.yaml", "grpo.eps_high", "moved to model.init_args.loss.eps_high"),
        ("quickstart_flow.yaml", "grpo.top_entropy_quantile", "FlowGRPOModule has no such option"),
        ("quickstart_flow_nft.yaml", "sampling.timestep_fraction", "moved to model.init_args.nft.timestep_fraction"),
        ("quickstart_flow_nft.yaml", "sampling.sde_window", "FlowNFTModule has no such option"),
        ("quickstart_flow_nft.yaml", "grpo.eps_low", "FlowNFTModule has no such option"),
    ],
)
def test_each_family_names_where_an_old_key_went(config, override, expected, capsys):
    value = "null" if override == "sampling.sde_window" else "1.0"
    args = ["fit", "--config", str(ROOT / "configs" / "quickstart" / config), f"--model.init_args.{override}", value]
    code, output = run_main([*args, "--print_config"], capsys)
    assert code == 2, output
    assert output.splitlines()[0] == f"error: model.init_args.{override}: {expected}" + (
        "" if expected.startswith("moved") else ": it belongs to another family's settings; drop it"
    ), output


def test_the_moved_keys_table_names_gone_keys_and_existing_paths():
    """Each old key is one its module no longer accepts, and each new path one it does."""
    from app.command_line.error_messages import MOVED_KEYS, accepted_path

    for module, moved in MOVED_KEYS.items():
        for old, new in moved.items():
            assert not accepted_path(module, old), (module, old)
            assert new is None or accepted_path(module, new), (module, new)

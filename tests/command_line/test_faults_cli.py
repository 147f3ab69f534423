"""Fault drills through ``python -m app``: every error a user can cause is a short message naming the file or field
(the full traceback only with ``APP_DEBUG=1``), output folders are probed before the first step, a config with several
bad fields names them all, and an interrupted save leaves nothing behind that a later run keeps."""

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.demos.boring_classes import BoringModel

from app.command_line.commands import main
from app.command_line.faults import AtomicCheckpointIO, atomic_torch_save

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TINY_GRPO = FIXTURES / "tiny_grpo.yaml"
MAX_LINES = 12
AS_ROOT = os.geteuid() == 0  # root writes into a chmod 0o500 folder: an unwritable folder is a path under a file


def run_main(args: list[str], capsys) -> tuple[int, str]:
    """``main(args)`` in process: exit code and stdout + stderr. An exception that escapes ``main`` (a traceback on
    the terminal) fails the test."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    code = exit_info.value.code
    return (0 if code is None else code), captured.out + captured.err


def python_m_app(args: list[str], env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def tiny_fit(root: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--config",
        str(TINY_GRPO),
        "--trainer.default_root_dir",
        str(root),
        "--validate_before_and_after",
        "false",
        "--trainer.max_steps",
        "1",
        *extra,
    ]


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create or write: under a regular file as root, else under a chmod 0o500 folder."""
    if AS_ROOT:
        blocker = tmp_path / "a_file"
        blocker.write_text("not a folder")
        return blocker / "out"
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return locked / "out"


def assert_short(code: int, output: str, *expected: str) -> None:
    assert code == 1, output[-3000:]
    lines = output.strip().splitlines()
    assert 1 <= len(lines) <= MAX_LINES, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "APP_DEBUG=1" in lines[-1], output
    for text in expected:
        assert text in output, output


# ----------------------------------------------------------------------------------------- output folders
def test_an_unwritable_checkpoint_dirpath_fails_before_the_first_step(tmp_path, capsys):
    folder = unwritable_folder(tmp_path)
    config = tmp_path / "checkpoints.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "enable_checkpointing": True,
                    "callbacks": [
                        {"class_path": "callbacks.completion_table.CompletionTableLogger"},
                        {
                            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                            "init_args": {"dirpath": str(folder)},
                        },
                    ],
                }
            }
        )
    )
    code, output = run_main([*tiny_fit(tmp_path / "run", "--config", str(config))], capsys)
    assert_short(code, output, "trainer.callbacks[1].init_args.dirpath", str(folder), "is not writable")
    assert not (tmp_path / "run" / "completions.csv").exists(), "the run trained before failing"


def test_an_unwritable_logger_folder_is_one_message(tmp_path, capsys):
    folder = unwritable_folder(tmp_path)
    args = tiny_fit(tmp_path / "run", "--trainer.logger", "lightning.pytorch.loggers.CSVLogger")
    code, output = run_main([*args, "--trainer.logger.save_dir", str(folder)], capsys)
    assert_short(code, output, "trainer.logger.init_args.save_dir", str(folder), "is not writable")


def test_an_unwritable_root_folder_is_one_message(tmp_path, capsys):
    folder = unwritable_folder(tmp_path)
    code, output = run_main(tiny_fit(folder, "--trainer.logger", "true"), capsys)
    assert_short(code, output, "trainer.default_root_dir", str(folder), "is not writable")


# -------------------------------------------------------------------------------------------- checkpoints
@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A truncated checkpoint, a text file, and the (whole) checkpoint of another model (Lightning's BoringModel)."""
    folder = tmp_path_factory.mktemp("bad_checkpoints")
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=folder,
    )
    trainer.fit(BoringModel())
    other = folder / "boring.ckpt"
    trainer.save_checkpoint(other)
    truncated = folder / "truncated.ckpt"
    truncated.write_bytes(other.read_bytes()[: other.stat().st_size // 2])
    text = folder / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    return {"truncated": truncated, "text": text, "other_model": other}


@pytest.mark.parametrize("command", ["fit", "export"])
@pytest.mark.parametrize("kind", ["truncated", "text", "other_model"])
def test_a_bad_checkpoint_is_a_short_message_naming_the_file(kind, command, bad_checkpoints, tmp_path, capsys):
    path = bad_checkpoints[kind]
    if command == "fit":
        args = tiny_fit(tmp_path / "run", "--ckpt_path", str(path))
    else:
        args = ["export", "--config", str(TINY_GRPO), "--ckpt_path", str(path), "--output_dir", str(tmp_path / "x")]
    code, output = run_main(args, capsys)
    assert_short(code, output, str(path))
    assert not (tmp_path / "x").exists()


def test_a_bad_checkpoint_for_validate_is_a_short_message(bad_checkpoints, tmp_path, capsys):
    path = bad_checkpoints["truncated"]
    args = ["validate", "--config", str(TINY_GRPO), "--trainer.default_root_dir", str(tmp_path), "--ckpt_path"]
    code, output = run_main([*args, str(path)], capsys)
    assert_short(code, output, str(path))


@pytest.mark.slow
def test_a_truncated_checkpoint_in_a_subprocess_is_a_few_lines(bad_checkpoints, tmp_path, app_env):
    """What the terminal shows: Lightning's own lines included."""
    path = bad_checkpoints["truncated"]
    result = python_m_app(tiny_fit(tmp_path, "--ckpt_path", str(path)), app_env())
    output = result.stdout + result.stderr
    assert_short(result.returncode, output, str(path), "truncated")


# -------------------------------------------------------------------------------------------- non-finite
@pytest.mark.slow
def test_all_nan_rewards_stop_the_run_with_a_short_message(tmp_path, app_env):
    env = app_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{FIXTURES}"  # nan_reward.py
    rewards = '[{"class_path": "nan_reward.NaNReward", "init_args": {"name": "broken"}}]'
    args = tiny_fit(
        tmp_path, "--model.init_args.rewards", rewards, "--model.init_args.optimizer.max_nonfinite_steps", "1"
    )
    result = python_m_app(args, env)
    output = result.stdout + result.stderr
    assert_short(result.returncode, output, "every reward was non-finite", "'broken': 8")


@pytest.mark.slow
def test_a_reward_server_that_is_down_stops_the_run_with_a_short_message_naming_it(tmp_path, app_env):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    rewards = json.dumps([{"class_path": "app.rewards.RemoteReward", "init_args": {"url": url, "retries": 0}}])
    result = python_m_app(tiny_fit(tmp_path, "--model.init_args.rewards", rewards), app_env())
    output = result.stdout + result.stderr
    assert_short(result.returncode, output, f"reward 'remote': GET {url}/info failed 1 time(s)", "on_failure: skip")


# ----------------------------------------------------------------------------------------- missing data
def test_missing_shards_are_a_short_message_naming_the_field(tmp_path, capsys):
    pattern = str(tmp_path / "no_such_folder" / "dots-*.tar")
    args = tiny_fit(tmp_path / "run", "--data", "app.data.ShardDataModule", "--data.train_urls", pattern)
    code, output = run_main(args, capsys)
    assert_short(code, output, "data.init_args.train_urls", pattern)


# ---------------------------------------------------------------------------------------- several errors
def bad_fields(tmp_path: Path, model: dict, data: dict) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"model": {"init_args": model}, "data": {"init_args": data}}))
    return path


@pytest.mark.parametrize(
    "model, data, expected",
    [
        (
            {"loss": {"eps_lowww": 0.1}},
            {"batch_sizee": 2},
            ["model.init_args.loss.eps_lowww", "did you mean 'eps_low'?", "data.init_args.batch_sizee"],
        ),
        (
            {"optimizer": {"weight_decay": "abc"}},
            {"batch_size": "xyz"},
            ["model.init_args.optimizer.weight_decay: expected float", "data.init_args.batch_size: expected int"],
        ),
        (
            {"loss": {"eps_lowww": 0.1}, "optimizer": {"learning_rate": "abc"}},
            {},
            ["model.init_args.loss.eps_lowww", "model.init_args.optimizer.learning_rate"],
        ),
    ],
    ids=["two_unknown_keys", "two_bad_values", "two_in_one_section"],
)
def test_a_config_with_two_bad_fields_names_both(model, data, expected, tmp_path, capsys):
    config = bad_fields(tmp_path, model, data)
    code, output = run_main(["fit", "--config", str(TINY_GRPO), "--config", str(config)], capsys)
    assert code == 2 and len(output.splitlines()) <= MAX_LINES, output
    for text in expected:
        assert text in output, output
    assert "Traceback" not in output and "APP_DEBUG=1" in output.splitlines()[-1]


def test_two_bad_fields_on_the_command_line_are_both_named(capsys):
    args = ["fit", "--config", str(TINY_GRPO), "--model.init_args.eps_lowww", "0.1", "--trainer.max_stepz", "3"]
    code, output = run_main(args, capsys)
    assert code == 2 and len(output.splitlines()) <= MAX_LINES, output
    assert "model.init_args.eps_lowww" in output and "--trainer.max_stepz" in output, output


def test_two_values_constructors_reject_are_both_named(tmp_path, capsys):
    args = [
        "fit",
        "--config",
        str(TINY_GRPO),
        "--trainer.default_root_dir",
        str(tmp_path),
        "--model.init_args.sampling.group_size",
        "-2",
        "--data.init_args.train_size",
        "0",
    ]
    code, output = run_main(args, capsys)
    assert code == 1 and len(output.splitlines()) <= MAX_LINES, output
    assert "model.init_args.sampling.group_size = -2" in output, output
    assert "data.init_args.train_size = 0" in output, output


# ------------------------------------------------------------------------------------ leftovers of a save
def stale_temp_file(folder: Path, name: str = "last.ckpt") -> Path:
    """The hidden temporary file a save killed mid-write leaves (named as :func:`atomic_torch_save` names them), an
    hour old."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".{name}.k3j9x_2a.tmp"
    path.write_bytes(b"half a checkpoint")
    old = time.time() - 3600
    os.utime(path, (old, old))
    return path


def test_a_stale_temp_file_is_removed_by_the_next_save_in_its_folder(tmp_path, caplog):
    stale = stale_temp_file(tmp_path)
    fresh = tmp_path / ".other.ckpt.abcdefgh.tmp"  # being written by someone right now: kept
    fresh.write_bytes(b"")
    future = time.time() + 3600
    os.utime(fresh, (future, future))
    with caplog.at_level(logging.WARNING, logger="app.command_line.faults"):
        AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "epoch=0-step=1.ckpt")
    assert not stale.exists() and fresh.exists()
    assert any(stale.name in message for message in caplog.messages), caplog.messages


def test_a_stale_temp_file_is_removed_when_the_next_run_starts_in_its_folder(tmp_path, capsys, caplog):
    stale = stale_temp_file(tmp_path / "run" / "checkpoints")
    with caplog.at_level(logging.WARNING, logger="app.command_line.faults"):
        main(tiny_fit(tmp_path / "run"))
    capsys.readouterr()
    assert not stale.exists()
    assert any(stale.name in message for message in caplog.messages), caplog.messages


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_a_checkpoint_gets_the_mode_the_umask_gives_a_new_file(umask, mode, tmp_path):
    previous = os.umask(umask)
    try:
        atomic_torch_save({"step": 1}, tmp_path / "last.ckpt")
        AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "io.ckpt")
    finally:
        os.umask(previous)
    assert (tmp_path / "last.ckpt").stat().st_mode & 0o777 == mode
    assert (tmp_path / "io.ckpt").stat().st_mode & 0o777 == mode
    assert torch.load(tmp_path / "last.ckpt") == {"step": 1}

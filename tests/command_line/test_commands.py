"""The command line: fit / resume / export through ``AppCLI`` and ``python -m app``, config errors, and a two-process
DDP run on CPU."""

import contextlib
import copy
import io
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from export_checks import assert_export_matches_policy

from app.command_line.commands import AppCLI, main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TINY_GRPO = FIXTURES / "tiny_grpo.yaml"
TINY_SFT = FIXTURES / "tiny_sft.yaml"


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run ``AppCLI`` in process on arguments that make it exit (``--print_config`` or a config error)."""
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=args)
    captured = capsys.readouterr()
    code = exit_info.value.code
    return (0 if code is None else code), captured.out, captured.err


def python_m_app(args: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


# ------------------------------------------------------------------------------------------------ config errors
def test_print_config_shows_command_line_overrides(capsys):
    code, out, err = run_cli(
        [
            "fit",
            "--config",
            str(TINY_GRPO),
            "--model.init_args.loss.eps_high",
            "0.28",
            "--trainer.max_steps",
            "7",
            "--model.init_args.sampling.max_new_tokens",
            "5",
            "--print_config",
        ],
        capsys,
    )
    assert code == 0, err
    config = yaml.safe_load(out)
    assert config["model"]["init_args"]["loss"]["eps_high"] == 0.28
    assert config["model"]["init_args"]["sampling"]["max_new_tokens"] == 5
    assert config["model"]["init_args"]["sampling"]["group_size"] == 4  # the rest of the block is kept
    assert config["trainer"]["max_steps"] == 7
    assert config["validate_before_and_after"] is True


def malformed_config(tmp_path: Path, **init_args) -> Path:
    config = yaml.safe_load(TINY_GRPO.read_text())
    config["model"]["init_args"].update(init_args)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(loss={"eps_lowww": 0.1}), "loss.eps_lowww"),
        (dict(loss={"eps_low": "abc"}), "loss.eps_low"),
        (dict(grpo={"advantage_scale": "std"}), "grpo.advantage_scale"),
    ],
    ids=["unknown_field", "wrong_type", "bad_choice"],
)
def test_malformed_config_fails_naming_the_field(bad, field, tmp_path, capsys):
    code, _, err = run_cli(["fit", "--config", str(malformed_config(tmp_path, **bad)), "--print_config"], capsys)
    assert code != 0
    assert field in err, err[-2000:]


def test_unknown_command_line_option_fails_naming_it(capsys):
    code, _, err = run_cli(["fit", "--config", str(TINY_GRPO), "--model.init_args.eps_lowww", "0.1"], capsys)
    assert code != 0 and "eps_lowww" in err


def test_invalid_settings_fail_when_the_config_is_instantiated(tmp_path):
    config = yaml.safe_load(TINY_GRPO.read_text())
    config["model"]["init_args"]["sampling"]["temperature"] = 0.0
    path = tmp_path / "bad_sampling.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="temperature"):
        AppCLI(args=["--config", str(path)], run=False)


# ----------------------------------------------------------------------------------------- fit, resume, export
@pytest.fixture(scope="module")
def cli_fit(tmp_path_factory):
    """``fit`` of the tiny GRPO config through AppCLI, as ``python -m app fit`` runs it; then a checkpoint."""
    root = tmp_path_factory.mktemp("cli_fit")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        cli = AppCLI(
            args=["fit", "--config", str(TINY_GRPO), "--trainer.default_root_dir", str(root)],
            save_config_kwargs={"overwrite": True},
        )
    # an adapter that is visibly trained (the tiny model's accuracy/format rewards are all 0, so GRPO moves nothing)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in cli.model.policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    ckpt = root / "last.ckpt"
    cli.trainer.save_checkpoint(ckpt)
    return cli, root, ckpt, stdout.getvalue()


def test_fit_validates_before_and_after_and_writes_the_run_folder(cli_fit):
    cli, root, _, stdout = cli_fit
    assert cli.trainer.global_step == 2
    assert "held-out metric" in stdout and "before fit" in stdout and "val/acc" in stdout
    summary = yaml.safe_load((root / "summary.json").read_text())
    assert set(summary) == {"before", "after"} and "val/acc/dots_left_of" in summary["after"]
    assert (root / "config.yaml").exists()
    rows = (root / "completions.csv").read_text().splitlines()
    assert rows[0].startswith("step,task,question,completion,answer,reward,advantage")
    assert len(rows) > 1
    # it ends with where the artefacts are (no logger, no checkpoints in this config)
    assert [line.split() for line in stdout.rstrip().splitlines()[-4:]] == [
        ["Artefacts:"],
        ["completions", str(root / "completions.csv")],
        ["summary", str(root / "summary.json")],
        ["config", str(root / "config.yaml")],
    ]


def test_fit_resumes_from_a_checkpoint_through_the_cli(cli_fit, tmp_path, monkeypatch):
    """The resumed run starts from the checkpoint's state (the state the interrupted run had): its weights, the
    optimizer's moments and step counts, and the global generators' states; then it makes one more step."""
    from app.modules import VLMGRPOModule
    from app.modules.checkpoints import RANK_STATES, rng_states

    _, _, saved_ckpt, _ = cli_fit
    checkpoint = torch.load(saved_ckpt, map_location="cpu", weights_only=False)
    # generator states no fresh start has (the CLI seeds every generator first), so only restoring them explains them
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(7)
        np.random.seed(7)
        torch.manual_seed(7)
        checkpoint[RANK_STATES][0]["rng"] = rng_states()  # rank 0's, the only rank
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    ckpt = tmp_path / "step2.ckpt"
    torch.save(checkpoint, ckpt)
    at_start = {}
    training_step = VLMGRPOModule.training_step

    def record_the_starting_state(self, batch, batch_idx):
        if not at_start:
            at_start.update(
                weights={n: p.detach().clone() for n, p in self.named_parameters() if p.requires_grad},
                optimizer=copy.deepcopy(self.trainer.optimizers[0].state_dict()),
                torch=torch.get_rng_state(),
                python=random.getstate(),
                numpy=np.random.get_state(),
            )
        return training_step(self, batch, batch_idx)

    monkeypatch.setattr(VLMGRPOModule, "training_step", record_the_starting_state)
    cli = AppCLI(
        args=[
            "fit",
            "--config",
            str(TINY_GRPO),
            "--ckpt_path",
            str(ckpt),
            "--trainer.max_steps",
            "3",
            "--validate_before_and_after",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
        save_config_kwargs={"overwrite": True},
    )
    assert cli.trainer.global_step == 3
    assert at_start["weights"] and all(
        torch.equal(value, checkpoint["state_dict"][name]) for name, value in at_start["weights"].items()
    )
    saved, restored = checkpoint["optimizer_states"][0], at_start["optimizer"]
    assert saved["state"] and restored["state"].keys() == saved["state"].keys()
    for index, moments in saved["state"].items():
        assert float(moments["step"]) == float(restored["state"][index]["step"]) == 2
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(moments[key], restored["state"][index][key]), key
    rng = checkpoint[RANK_STATES][0]["rng"]
    assert torch.equal(at_start["torch"], rng["torch"]) and at_start["python"] == rng["python"]
    assert np.array_equal(at_start["numpy"][1], rng["numpy"][1].numpy().astype(np.uint32))
    assert at_start["numpy"][2] == rng["numpy"][2]
    final = cli.trainer.optimizers[0].state_dict()["state"]
    assert final.keys() == saved["state"].keys() and all(float(m["step"]) == 3 for m in final.values())


@pytest.mark.slow
def test_export_command_writes_a_folder_that_loads_with_from_pretrained(cli_fit, tmp_path, app_env, new_samples):
    cli, _, ckpt, _ = cli_fit
    out = tmp_path / "exported"
    result = python_m_app(
        [
            "export",
            "--config",
            str(TINY_GRPO),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--ckpt_path",
            str(ckpt),
            "--output_dir",
            str(out),
        ],
        app_env(),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"exported to {out}" in result.stdout
    assert (out / "config.json").exists() and (out / "adapter" / "adapter_config.json").exists()

    assert_export_matches_policy(cli.model.policy, out, new_samples(2), min_change=1e-3)


def test_export_without_required_options_names_them(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--config", str(TINY_GRPO)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: export needs --output_dir\n")


def test_export_rejects_a_checkpoint_of_another_model(cli_fit, tmp_path, capsys):
    _, _, ckpt, _ = cli_fit
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--config", str(TINY_SFT), "--ckpt_path", str(ckpt), "--output_dir", str(tmp_path / "x")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {ckpt}: the checkpoint does not match this model") and "Traceback" not in err
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------------------------------------- DDP
@pytest.mark.slow
def test_two_process_ddp_fit_on_cpu(tmp_path, app_env):
    """Two gloo ranks: each trains on its own prompts, both end with the same weights, rank 0 writes the reports."""
    env = app_env(OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{FIXTURES}"  # ddp_probe.py: a reward with signal, per-rank reports
    result = python_m_app(
        [
            "fit",
            "--config",
            str(TINY_GRPO),
            "--config",
            str(FIXTURES / "ddp_probe.yaml"),
            "--trainer.strategy",
            "ddp",
            "--trainer.devices",
            "2",
            "--trainer.accelerator",
            "cpu",
            "--trainer.max_steps",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
        env,
        timeout=300,
    )
    log = result.stdout + result.stderr
    assert "GLOBAL_RANK: 0" in log and "GLOBAL_RANK: 1" in log
    reports = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world_size"] for r in reports] == [2, 2]
    assert [r["global_step"] for r in reports] == [2, 2]
    assert not set(reports[0]["seen"]) & set(reports[1]["seen"]), "ranks should train on different prompts"
    for name, after in reports[0]["after"].items():
        assert torch.equal(after, reports[1]["after"][name]), f"{name} differs between ranks"
    moved = [n for n, a in reports[0]["after"].items() if not torch.equal(a, reports[0]["before"][n])]
    assert moved, "no weight changed"
    assert (tmp_path / "completions.csv").exists()
    assert result.returncode == 0, log[-4000:]
    assert (tmp_path / "summary.json").exists()

"""Every YAML recipe parses against its classes (without instantiating them: the GPU recipes name hub checkpoints that
cannot be downloaded here), and the tiny test fixtures instantiate into the objects they describe."""

from pathlib import Path

import pytest

from app.command_line.commands import AppCLI

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "configs").rglob("*.yaml"))
FIXTURE_CONFIGS = [ROOT / "tests" / "fixtures" / "tiny_grpo.yaml", ROOT / "tests" / "fixtures" / "tiny_sft.yaml"]


def test_there_are_recipes():
    assert RECIPES, "configs/ holds no YAML recipe"


@pytest.mark.parametrize("path", RECIPES + FIXTURE_CONFIGS, ids=lambda p: p.name)
def test_config_parses_against_its_classes(path, print_config):
    config = print_config(["--config", str(path)])
    assert config["model"]["class_path"].startswith("app.modules.")
    assert config["data"]["class_path"].startswith("app.data.")
    assert config["model"]["init_args"]["policy"]["class_path"] in ("app.models.VLMPolicy", "app.models.FlowPolicy")


@pytest.mark.parametrize("path", RECIPES + FIXTURE_CONFIGS, ids=lambda p: p.name)
def test_config_opens_with_the_command_that_runs_it(path):
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert any("python -m app fit --config" in line for line in header), f"{path.name} does not say how to run it"
    assert any(path.name in line for line in header)


@pytest.mark.parametrize(
    "path, module_class",
    [(FIXTURE_CONFIGS[0], "VLMGRPOModule"), (FIXTURE_CONFIGS[1], "VLMSFTModule")],
    ids=["tiny_grpo", "tiny_sft"],
)
def test_tiny_fixture_instantiates(path, module_class, tmp_path):
    cli = AppCLI(args=["--config", str(path), "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert type(cli.model).__name__ == module_class
    assert cli.model.policy.model_name == "tiny-qwen2-vl"
    assert cli.trainer.max_steps == 2
    assert cli.trainer.default_root_dir == str(tmp_path)
    assert cli.datamodule.image_size == 64 and cli.datamodule.val_size == 4 and cli.datamodule.batch_size == 2
    if module_class == "VLMGRPOModule":
        assert cli.model.sampling.group_size == 4 and cli.model.sampling.max_new_tokens == 8
        assert cli.model.policy.uses_lora
        assert cli.model.rewards.names == ["accuracy", "format"]


def test_a_misspelt_dataset_argument_fails_parsing_naming_the_key(tmp_path, capsys):
    """Data sets come in as ``class_path`` / ``init_args``: their arguments are checked when the config is parsed."""
    text = (ROOT / "configs" / "quickstart/quickstart.yaml").read_text()
    assert "        dot_radius: 12\n" in text
    path = tmp_path / "typo.yaml"
    path.write_text(text.replace("        dot_radius: 12\n", "        dot_radus: 12\n"))
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code not in (0, None)
    assert "Option 'dot_radus' is not accepted" in capsys.readouterr().err


def load_repro(name: str, monkeypatch):
    """A ``benchmarks/repro`` script as a module (it imports its neighbour ``common`` by name)."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "repro"))
    return importlib.import_module(name)


def test_objectives_arms_parse_as_their_settings(monkeypatch, print_config):
    """Every arm of benchmarks/repro/objectives.py is a valid quickstart GRPO run: its overrides parse, land in the
    settings they name, and build a valid ``VLMLossSettings``."""
    from app.settings import VLMLossSettings

    objectives = load_repro("objectives", monkeypatch)
    assert set(objectives.LABELS) == set(objectives.ARMS) and objectives.BASELINE in objectives.ARMS
    for arm in objectives.ARMS:
        args = ["--config", str(ROOT / "configs" / objectives.GRPO)]
        for item in objectives.arm_overrides(arm, objectives.MASK_KL):
            key, _, value = item.partition("=")
            args += [f"--{key}", value]
        module = print_config(args)["model"]["init_args"]
        loss = module["loss"] or {}  # null: the defaults
        VLMLossSettings(**loss)  # runs the settings' own checks (CISPO with a sequence ratio is refused, ...)
        assert (module["pipeline"] or {"delay": 0})["delay"] == (0 if arm == "grpo_delay0" else 1), arm
        for item in objectives.arm_overrides(arm, objectives.MASK_KL):
            key, _, value = item.partition("=")
            parsed = module
            for part in key.removeprefix("model.init_args.").split("."):
                parsed = parsed[part]
            assert parsed == (type(parsed)(value) if isinstance(parsed, (int, float)) else value), (arm, key)
    assert objectives.arm_overrides("masked", 0.5)[-1] == f"{objectives.G}off_policy_max_kl=0.5"


def test_flow_grpo_arms_parse_as_their_sampling_settings(monkeypatch, print_config):
    """Every arm of benchmarks/repro/flow_grpo.py that overrides its task's recipe parses and builds valid
    ``FlowGRPOSamplingSettings`` (a moving window needs its first position, ...)."""
    from app.settings import FlowGRPOSamplingSettings

    flow_grpo = load_repro("flow_grpo", monkeypatch)
    for task in flow_grpo.TASKS:
        for name, arm in flow_grpo.ARMS.items():
            if arm.config is not None:
                continue
            args = ["--config", str(ROOT / "configs" / flow_grpo.TASKS[task].grpo)]
            for item in arm.overrides_for(task):
                key, _, value = item.partition("=")
                args += [f"--{key}", value]
            config = print_config(args)
            settings = FlowGRPOSamplingSettings(**config["model"]["init_args"]["sampling"])
            if name.startswith("mixgrpo"):  # the window takes the same five positions over each recipe's steps
                steps, every = config["trainer"]["max_steps"], settings.window_every_n_steps
                assert steps == 5 * every and settings.window_at(0) == (0, 2), task
                assert settings.window_at(steps - 1) == (4, 6) and settings.window_at(steps - every - 1) == (3, 5), task
                assert settings.ode_tail == "unipc"


def test_flow_grpo_diffusionnft_arms_parse_with_their_own_recipe(monkeypatch, print_config):
    """The DiffusionNFT arms of benchmarks/repro/flow_grpo.py name an existing recipe of FlowNFTModule per task, and
    the equal-time arm's step count lands in the trainer."""
    flow_grpo = load_repro("flow_grpo", monkeypatch)
    for name in ("nft", "nft_time"):
        arm = flow_grpo.ARMS[name]
        for task in flow_grpo.NFT_CONFIGS:
            args = ["--config", str(ROOT / "configs" / arm.config_for(task))]
            for item in arm.overrides_for(task):
                key, _, value = item.partition("=")
                args += [f"--{key}", value]
            config = print_config(args)
            assert config["model"]["class_path"] == "app.modules.FlowNFTModule"
            if name == "nft_time":
                assert config["trainer"]["max_steps"] == flow_grpo.EQUAL_TIME_STEPS[task]

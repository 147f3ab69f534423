"""The settings blocks of the training modules (app.settings) refuse what they cannot do when built, naming the field,
also when a module gets a block as a mapping (as a config or a checkpoint's hyper-parameters hold it)."""

from pathlib import Path

import pytest
import yaml

from app.modules import FlowGRPOModule, VLMGRPOModule
from app.settings import GRPOSettings, PipelineSettings


def test_settings_refuse_what_the_pipeline_cannot_do():
    with pytest.raises(ValueError, match="pipeline.delay must be 0 or 1, got 2"):
        PipelineSettings(delay=2)
    with pytest.raises(ValueError, match="pipeline.workers must be"):
        PipelineSettings(workers="gpu")
    with pytest.raises(ValueError, match="reward_timeout_s must be > 0"):
        PipelineSettings(reward_timeout_s=0)


def test_the_grpo_settings_refuse_bad_iteration_and_micro_batch_settings():
    with pytest.raises(ValueError, match="num_iterations must be >= 1"):
        GRPOSettings(num_iterations=0)
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        GRPOSettings(micro_batch_size=0)


@pytest.mark.parametrize("family", [VLMGRPOModule, FlowGRPOModule])
def test_invalid_options_are_rejected(family):
    """Refused before the module looks at its policy (none here)."""
    with pytest.raises(ValueError, match="num_iterations"):
        family(None, [], grpo={"num_iterations": 0})
    with pytest.raises(ValueError, match="micro_batch_size"):
        family(None, [], grpo={"micro_batch_size": 0})
    with pytest.raises(ValueError, match="pipeline.delay"):
        family(None, [], pipeline={"delay": 2})


def test_the_grpo_objective_options_are_checked_naming_the_field():
    with pytest.raises(ValueError, match="grpo.importance_sampling_level must be 'token' or 'sequence', got 'row'"):
        GRPOSettings(importance_sampling_level="row")
    with pytest.raises(ValueError, match="grpo.objective must be 'ppo_clip' or 'cispo', got 'sapo'"):
        GRPOSettings(objective="sapo")
    with pytest.raises(ValueError, match="grpo.objective 'cispo' is token-level .*grpo.importance_sampling_level"):
        GRPOSettings(objective="cispo", importance_sampling_level="sequence")
    for name in ("off_policy_max_log_ratio", "off_policy_max_kl"):
        for bad in (0.0, -1.0, float("nan")):
            with pytest.raises(ValueError, match=f"grpo.{name} must be > 0 or null, got {bad}"):
                GRPOSettings(**{name: bad})
    assert not GRPOSettings().masks_off_policy
    assert GRPOSettings(off_policy_max_kl=0.1).masks_off_policy
    assert GRPOSettings(off_policy_max_log_ratio=0.1).masks_off_policy
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(
            ValueError, match=rf"grpo.top_entropy_quantile must be in \(0, 1\] \(1: every token\), got {bad}"
        ):
            GRPOSettings(top_entropy_quantile=bad)
    defaults = GRPOSettings()
    assert (defaults.importance_sampling_level, defaults.objective) == ("token", "ppo_clip")
    assert defaults.top_entropy_quantile == 1.0 and GRPOSettings(top_entropy_quantile=0.2).top_entropy_quantile == 0.2


@pytest.mark.parametrize(
    "option, named",
    [
        ({"importance_sampling_level": "sequence"}, "grpo.importance_sampling_level: sequence"),
        ({"objective": "cispo"}, "grpo.objective: cispo"),
        ({"off_policy_max_log_ratio": 0.5}, "grpo.off_policy_max_log_ratio"),
        ({"off_policy_max_kl": 0.5}, "grpo.off_policy_max_kl"),
        ({"top_entropy_quantile": 0.2}, "grpo.top_entropy_quantile"),
    ],
)
def test_flow_grpo_refuses_the_vlm_only_objectives_naming_them(option, named):
    """Its loss sees one denoising step at a time: no sequence ratio, no per-trajectory mask, no CISPO, and a Gaussian
    step has no token entropy to select on."""
    with pytest.raises(ValueError, match=f"token-level ppo_clip objective only .*drop {named}$"):
        FlowGRPOModule(None, [], grpo=option)


def test_a_config_selects_the_objectives_from_yaml(tmp_path, capsys):
    """The ``grpo:`` block of a YAML config parses into the new fields (and a misspelt value fails parsing)."""
    from app.command_line.commands import AppCLI

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_grpo.yaml"
    text = fixture.read_text()
    block = "    sampling:\n"
    assert block in text
    grpo = "    grpo:\n      objective: cispo\n      eps_low: 1.0\n      eps_high: 4.0\n      off_policy_max_kl: 0.05\n"
    path = tmp_path / "cispo.yaml"
    path.write_text(text.replace(block, grpo + block, 1))
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["grpo"]
    assert printed["objective"] == "cispo" and printed["eps_low"] == 1.0 and printed["off_policy_max_kl"] == 0.05
    assert printed["importance_sampling_level"] == "token" and printed["off_policy_max_log_ratio"] is None

    sequence = tmp_path / "gspo.yaml"
    sequence.write_text(text.replace(block, "    grpo:\n      importance_sampling_level: sequence\n" + block, 1))
    with pytest.raises(SystemExit):
        AppCLI(args=["fit", "--config", str(sequence), "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["grpo"]["importance_sampling_level"] == (
        "sequence"
    )

    path.write_text(text.replace(block, "    grpo:\n      objective: sapo\n" + block, 1))
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code not in (0, None)
    assert "sapo" in capsys.readouterr().err

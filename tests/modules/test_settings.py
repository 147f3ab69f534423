"""The settings blocks of the training modules (app.settings) refuse what they cannot do when built, naming the field,
also when a module gets a block as a mapping (as a config or a checkpoint's hyper-parameters hold it)."""

from pathlib import Path

import pytest
import yaml

from app.modules import FlowGRPOModule, VLMGRPOModule
from app.settings import FlowGRPOLossSettings, GRPOSettings, PipelineSettings, VLMLossSettings


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


def test_the_bounds_of_the_shared_and_the_loss_blocks_are_checked_naming_the_field():
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match=f"grpo.beta must be >= 0, got {bad}"):
            GRPOSettings(beta=bad)
        for block in (VLMLossSettings, FlowGRPOLossSettings):
            for name in ("eps_low", "eps_high"):
                with pytest.raises(ValueError, match=f"loss.{name} must be >= 0, got {bad}"):
                    block(**{name: bad})
    assert VLMLossSettings(eps_low=0.0, eps_high=0.0).eps_high == 0  # a zero-width clip range is allowed
    assert (VLMLossSettings().eps_low, FlowGRPOLossSettings().eps_low) == (0.2, 1e-4)  # each family's own default


def test_the_vlm_loss_options_are_checked_naming_the_field():
    with pytest.raises(ValueError, match="loss.importance_sampling_level must be 'token' or 'sequence', got 'row'"):
        VLMLossSettings(importance_sampling_level="row")
    with pytest.raises(ValueError, match="loss.objective must be 'ppo_clip' or 'cispo', got 'sapo'"):
        VLMLossSettings(objective="sapo")
    with pytest.raises(ValueError, match="loss.objective 'cispo' is token-level .*loss.importance_sampling_level"):
        VLMLossSettings(objective="cispo", importance_sampling_level="sequence")
    with pytest.raises(ValueError, match=r"loss.aggregation must be one of \(.*\), got 'sum'"):
        VLMLossSettings(aggregation="sum")
    for name in ("off_policy_max_log_ratio", "off_policy_max_kl"):
        for bad in (0.0, -1.0, float("nan")):
            with pytest.raises(ValueError, match=f"loss.{name} must be > 0 or null, got {bad}"):
                VLMLossSettings(**{name: bad})
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(
            ValueError, match=rf"loss.top_entropy_quantile must be in \(0, 1\] \(1: every token\), got {bad}"
        ):
            VLMLossSettings(top_entropy_quantile=bad)
    defaults = VLMLossSettings()
    assert (defaults.importance_sampling_level, defaults.objective, defaults.aggregation) == (
        "token",
        "ppo_clip",
        "token_mean",
    )
    assert (
        defaults.top_entropy_quantile == 1.0 and VLMLossSettings(top_entropy_quantile=0.2).top_entropy_quantile == 0.2
    )


def test_what_the_fused_loss_cannot_compute_is_refused_naming_the_option():
    fused = dict(fused_linear=True)
    with pytest.raises(ValueError) as error:
        VLMLossSettings(off_policy_max_log_ratio=0.5, off_policy_max_kl=0.1, **fused)
    assert str(error.value) == (
        "loss.fused_linear cannot mask off-policy sequences (loss.off_policy_max_log_ratio and "
        "loss.off_policy_max_kl set): the fused loss never materialises the log-probs the mask is decided on; unset "
        "it or set fused_linear: false"
    )
    with pytest.raises(ValueError, match=r"\(loss.off_policy_max_kl set\)"):
        VLMLossSettings(off_policy_max_kl=0.1, **fused)
    with pytest.raises(ValueError, match=r"cannot select high-entropy tokens \(loss.top_entropy_quantile = 0.2\)"):
        VLMLossSettings(top_entropy_quantile=0.2, **fused)
    cispo = dict(objective="cispo", eps_low=1.0, eps_high=4.0, **fused)
    with pytest.raises(ValueError, match="loss.objective 'cispo' supports loss.aggregation .*got 'sequence_mean'"):
        VLMLossSettings(aggregation="sequence_mean", **cispo)
    with pytest.raises(ValueError, match="needs loss.eps_low >= 1 .*got eps_low = 0.2"):
        VLMLossSettings(objective="cispo", **fused)
    for aggregation in ("token_mean", "global_token_mean", "constant"):  # Liger's cispo divides by the token count
        assert VLMLossSettings(aggregation=aggregation, **cispo).fused_linear
    # without the fused loss each of these is a loss the chunked path computes
    VLMLossSettings(off_policy_max_kl=0.1, top_entropy_quantile=0.2, objective="cispo", aggregation="sequence_mean")


def test_a_config_selects_the_objectives_from_yaml(tmp_path, capsys):
    """The ``loss:`` block of a YAML config parses into its fields (and a misspelt value fails parsing)."""
    from app.command_line.commands import AppCLI

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_grpo.yaml"
    text = fixture.read_text()
    block = "    sampling:\n"
    assert block in text
    loss = "    loss:\n      objective: cispo\n      eps_low: 1.0\n      eps_high: 4.0\n      off_policy_max_kl: 0.05\n"
    path = tmp_path / "cispo.yaml"
    path.write_text(text.replace(block, loss + block, 1))
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["loss"]
    assert printed["objective"] == "cispo" and printed["eps_low"] == 1.0 and printed["off_policy_max_kl"] == 0.05
    assert printed["importance_sampling_level"] == "token" and printed["off_policy_max_log_ratio"] is None

    sequence = tmp_path / "gspo.yaml"
    sequence.write_text(text.replace(block, "    loss:\n      importance_sampling_level: sequence\n" + block, 1))
    with pytest.raises(SystemExit):
        AppCLI(args=["fit", "--config", str(sequence), "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["loss"]["importance_sampling_level"] == (
        "sequence"
    )

    path.write_text(text.replace(block, "    loss:\n      objective: sapo\n" + block, 1))
    with pytest.raises(SystemExit) as exit_info:
        AppCLI(args=["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code not in (0, None)
    assert "sapo" in capsys.readouterr().err

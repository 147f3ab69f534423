"""The settings blocks of the training modules (app.settings) refuse what they cannot do when built, naming the field,
also when a module gets a block as a mapping (as a config or a checkpoint's hyper-parameters hold it)."""

import pytest

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

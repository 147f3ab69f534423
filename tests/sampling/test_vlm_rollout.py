"""The VLM sampler's settings (app.sampling.vlm_rollout): its micro-batch size is checked when it is built. Its draw
and log-probs on a tiny policy are tested through the module in tests/modules/test_vlm_grpo*.py."""

import pytest

from app.sampling import VLMSampler
from app.settings import SamplingSettings


@pytest.mark.parametrize("micro_batch_size", [0, -1])
def test_a_micro_batch_size_below_one_is_refused_with_a_message_naming_it(micro_batch_size):
    with pytest.raises(ValueError, match=rf"^micro_batch_size must be >= 1 or null, got {micro_batch_size}$"):
        VLMSampler(None, SamplingSettings(), micro_batch_size)


@pytest.mark.parametrize("micro_batch_size", [1, None])
def test_a_micro_batch_size_of_one_row_or_none_is_taken(micro_batch_size):
    settings = SamplingSettings(group_size=2)
    sampler = VLMSampler(None, settings, micro_batch_size)
    assert sampler.settings is settings and sampler.micro_batch_size == micro_batch_size

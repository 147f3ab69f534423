"""Per-prompt running statistics (app.algorithms.prompt_stats): a history saved and loaded goes on as if never saved."""

import pytest
import torch

from app.algorithms.prompt_stats import PromptStatTracker


@pytest.mark.parametrize("history", [2, 4, 6])  # shorter than, equal to and longer than the group size K = 4
def test_a_loaded_history_gives_the_advantages_the_saved_one_would_have_given(history):
    groups = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 6.0, 7.0], [1.0, 1.0, 1.0, 9.0]], dtype=torch.float64)
    kept = PromptStatTracker(history=history)
    kept.advantages(["a", "b"], groups[:2].reshape(-1))
    resumed = PromptStatTracker(history=history)
    resumed.load(kept.state())
    for group in groups[1:]:
        expected = kept.advantages(["a"], group)
        assert torch.equal(resumed.advantages(["a"], group), expected)
        assert resumed.state() == kept.state()

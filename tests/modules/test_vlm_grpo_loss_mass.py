"""``VLMGRPOModule.loss_mass``: when several rollouts make one update (dynamic sampling), each weighs its aggregation's
normaliser (kept tokens, rows with a token, or all rows), so the mass-weighted sum of their losses is the loss of all
their rows together."""

from types import SimpleNamespace

import pytest
import torch

from app.algorithms import grpo_loss
from app.modules import VLMGRPOModule
from app.rewards import AccuracyReward
from app.settings import SamplingSettings

L = 6  # completion length, the generation budget
MASKS = (
    torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]]),
    torch.tensor([[1, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0]]),
)
"""Two rollouts' loss masks: an empty row and single-token rows; 8 : 6 tokens, 3 : 2 rows with a token, 4 : 2 rows."""
MASSES = {"token_mean": (8.0, 6.0), "sequence_mean": (3.0, 2.0), "constant": (4.0, 2.0)}


@pytest.mark.parametrize("aggregation", sorted(MASSES))
def test_mass_weighted_losses_of_rollouts_are_the_loss_of_all_their_rows(tiny_policy, aggregation, random_seed):
    module = VLMGRPOModule(
        tiny_policy, [AccuracyReward()], SamplingSettings(max_new_tokens=L), loss_aggregation=aggregation
    )
    masses = [module.loss_mass(SimpleNamespace(loss_mask=mask)) for mask in MASKS]  # it reads only the loss mask
    assert [mass.item() for mass in masses] == list(MASSES[aggregation])

    g = torch.Generator().manual_seed(random_seed)
    mask = torch.cat(MASKS)  # [6, L]
    logprobs = -torch.rand(mask.shape, generator=g)
    old = logprobs + 0.3 * torch.randn(mask.shape, generator=g)
    advantages = torch.randn(mask.shape[0], generator=g)

    def loss(rows):
        return grpo_loss(logprobs[rows], old[rows], advantages[rows], mask[rows], aggregation=aggregation, max_length=L)

    weighted = sum(
        mass / sum(masses) * loss(rows).loss for mass, rows in zip(masses, (slice(0, 4), slice(4, 6)), strict=True)
    )
    torch.testing.assert_close(weighted, loss(slice(None)).loss)

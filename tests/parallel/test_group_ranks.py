"""Groups spread over ranks (``grpo.group_ranks``), in real process groups: each rank's advantages and kept rows are
its rows of what one process computes on the whole groups, and flow-GRPO with K = 16 over 2 or 4 processes trains the
weights one process holding the whole groups trains, from the same prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tolerances import assert_close_training

from app.algorithms import group_advantages, zero_std_groups

pytestmark = pytest.mark.timeout(600)
HERE = Path(__file__).resolve().parent
PROBE = HERE / "group_ranks_probe.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, probes) -> dict[int, Path]:
    folders = {n: tmp_path_factory.mktemp(f"group_ranks{n}") for n in (1, 2, 4)}
    probes.python(PROBE, folders[1], "fit-1")
    probes.torchrun(PROBE, 2, folders[2], "fit-world")
    probes.torchrun(PROBE, 4, folders[4], "fit-world", "scores-2", "scores-4")
    return folders


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_scores_its_rows_of_the_whole_groups(runs, ranks):
    from group_ranks_probe import WHOLE_REWARDS, WHOLE_UNSCORED

    k = 4
    skipped = WHOLE_UNSCORED.view(-1, k).any(dim=1).repeat_interleave(k)  # group 2 is left out whole
    scored = WHOLE_REWARDS[~skipped]
    expected = torch.zeros_like(WHOLE_REWARDS)
    # advantage_scale global: every rank holds the whole groups, so the std over ranks is the std of those rows
    expected[~skipped] = group_advantages(scored, k, "batch", batch_std=scored.std(unbiased=False))
    keep = ~skipped & ~zero_std_groups(WHOLE_REWARDS, k).repeat_interleave(k)
    got_advantages, got_keep = torch.zeros_like(expected), torch.zeros_like(keep)
    for rank in range(4):
        report = torch.load(runs[4] / f"scores-{ranks}.rank{rank}.pt", weights_only=True)
        assert len(report["rows"]) == 12 // ranks
        got_advantages[report["rows"]] = report["advantages"]
        got_keep[report["rows"]] = report["keep"]
    # float64 moments vs torch's float32 std of the same 8 values: a few float32 ulps of advantages of size <= 2
    torch.testing.assert_close(got_advantages, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(got_keep, keep)
    flat = torch.tensor([False, True, False]).repeat_interleave(k)
    assert not got_keep[flat].any() and not got_advantages[flat].any()  # the flat group, whole, on every rank


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_group_spread_over_ranks_trains_the_weights_one_process_trains(runs, world):
    from group_ranks_probe import FIT_GROUP_SIZE, STEPS

    single = torch.load(runs[1] / "fit-1.pt", weights_only=True)
    spread = torch.load(runs[world] / "fit-world.pt", weights_only=True)
    one = torch.load(runs[1] / "fit-1.rank0.pt", weights_only=True)["batches"]
    for rank in range(world):  # every rank of the group drew the prompts the one process drew, K / R rows of each
        drawn = torch.load(runs[world] / f"fit-world.rank{rank}.pt", weights_only=True)
        assert drawn["batches"] == one and drawn["rows_per_prompt"] == [FIT_GROUP_SIZE // world] * STEPS
    assert_close_training(spread, single, lr=1e-3, steps=STEPS)
    moved = max(float((w - torch.zeros_like(w)).abs().max()) for k, w in single.items() if "lora_B" in k)
    assert moved > 0  # the adapters trained
    worst = max(float((spread[k] - single[k]).abs().max()) for k in single)
    print(f"{world} processes vs one: largest weight difference {worst:.2e}")

"""``advantage_scale: global`` on two processes: each rank's advantages are those one process computes on the whole
global batch with the batch scale (centred per group, divided by the std of every rank's rewards)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.algorithms import group_advantages

pytestmark = pytest.mark.timeout(300)
HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_global_scale_on_two_ranks_is_the_batch_scale_of_the_whole_batch(tmp_path, probes):
    probes.torchrun(HERE / "advantages_probe.py", 2, tmp_path, timeout=240)
    ranks = [torch.load(tmp_path / f"global.rank{r}.pt", weights_only=True) for r in range(2)]
    whole = torch.cat([r["rewards"] for r in ranks])
    expected = group_advantages(whole, 3, scale="batch")
    got = torch.cat([r["advantages"] for r in ranks])
    # the std from float64 moments against torch's float32 std of the same 12 values: both within a few float32
    # ulps of the exact std, and the advantages are |centred| / std <= sqrt(K) = 1.8 in size, so 1e-6 is some ulps
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    alone = torch.cat([group_advantages(r["rewards"], 3, scale="batch") for r in ranks])
    assert not torch.allclose(got, alone, rtol=1e-3)  # each rank's own std would give other advantages

"""Lean loading under two-process FSDP2 (gloo, CPU): a policy built empty and filled shard by shard from its checkpoint
equals, bit for bit, the one every rank loads whole (weights, buffers, LoRA adapters' initial values, tied weights,
the frozen KL reference), computes the same outputs and trains the same step; each rank allocates and reads only its
share; ``python -m app fit`` under FSDP2 loads that way.

The probe runs (``lean_probe.py``) are launched once per module, in one ``torchrun``, and shared by the tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(600)
HERE = Path(__file__).resolve().parent
PROBE = HERE / "lean_probe.py"
WORLD = 2
POLICIES = ["vlm_lora", "vlm_full", "vlm_tied", "flow_lora"]
CASES = [*POLICIES, "cli_fit"]  # cli_fit last: Lightning keeps the process group to the end
SAME = [
    "state_same",
    "buffers_same",
    "requires_grad_same",
    "outputs_same",
    "outputs_after_step_same",
    "state_after_step_same",
]


@pytest.fixture(scope="module")
def reports(tmp_path_factory, probes) -> dict:
    """Every rank's report, by case, and the log (``"log"``): about 30 s on 2 idle cores."""
    out = tmp_path_factory.mktemp("lean")
    log = probes.torchrun(PROBE, WORLD, out, *CASES)
    found = {c: [torch.load(out / f"{c}.rank{r}.pt", weights_only=False) for r in range(WORLD)] for c in CASES}
    found["log"] = log
    return found


@pytest.mark.slow
@pytest.mark.parametrize("case", POLICIES)
def test_a_lean_loaded_policy_equals_the_normally_loaded_one_bit_for_bit(reports, case):
    for report in reports[case]:
        assert {key: report[key] for key in SAME} == dict.fromkeys(SAME, True)
        assert report["outputs_finite"] and report["outputs_moved"]  # the comparison is of a step that did something
        assert report["rng_same"]  # the same random draws (LoRA's initial A) as the normal build
        assert report["empty_networks"] == (2 if case in ("vlm_full", "vlm_tied") else 1)  # the reference too
        assert report["left_empty"] == 0


@pytest.mark.slow
def test_tied_weights_stay_tied(reports):
    assert [report["tied"] for report in reports["vlm_tied"]] == [(True, True)] * WORLD
    assert [report["tied"] for report in reports["vlm_full"]] == [(False, False)] * WORLD


@pytest.mark.slow
@pytest.mark.parametrize("case", POLICIES)
def test_each_rank_builds_nothing_whole_and_reads_only_its_share(reports, case):
    for report in reports[case]:
        assert report["built_bytes"] == 0  # the lean build allocates no parameter
        assert report["local_bytes"] <= report["network_bytes"] / WORLD + report["kept_bytes"] + 1024
        # what was filled: this rank's parameters, plus the buffers every rank keeps whole (SD3's positional table)
        assert report["loaded_local_bytes"] >= report["local_bytes"] - report["kept_bytes"]
        # the largest single read: half of the VLMs' 256 kB embedding, SD3's 128 kB positional table (a buffer)
        assert report["largest_read_bytes"] <= 131072


@pytest.mark.slow
def test_the_cli_fits_under_fsdp2_with_lean_loading(reports):
    for report in reports["cli_fit"]:
        assert report["global_step"] == 1 and report["left_empty"] == 0
        [load] = report["loads"]  # shard_policy loaded the policy once, from configure_model
        assert load is not None and 0 < load["local_bytes"] <= report["network_bytes"] / WORLD + 1024
    assert "lean loading: each rank read its own shards of the trained weights" in reports["log"]

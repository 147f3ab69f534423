"""Per-rank state in checkpoints, two processes on CPU (gloo): a run killed after step 1 and resumed from its checkpoint
gives every rank its own random states back (the rollout generator of a flow module, the global torch, numpy and python
generators) and its own place in the data, so the ranks keep drawing different noise and the resumed run ends with
the uninterrupted run's trainable weights, bit for bit.

The cases are launched once per module (``torchrun``, see ``rank_state_probe.py``): flow LoRA with the
coefficients-preserving sampler under FSDP2 (a sharded checkpoint folder) and with Flow-GRPO's SDE sampler under DDP,
and VLM LoRA under DDP (one checkpoint file).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(600)
HERE = Path(__file__).resolve().parent
PROBE = HERE / "rank_state_probe.py"
CASES = ["flow_cps-fsdp", "flow_sde-ddp", "vlm_lora-ddp"]
WORLD = 2
KILLED_AT = 1  # the probe's: the resumed fit starts from the checkpoint of step 1, so its first step is step 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory, probes) -> Path:
    """The output folder of the probe runs (every case in one two-process launch)."""
    out = tmp_path_factory.mktemp("rank_state")
    probes.torchrun(PROBE, WORLD, out, *CASES)
    return out


def draws(out: Path, case: str) -> list[dict[str, list[dict]]]:
    """Per rank: what it recorded as each step of the straight and of the resumed fit started."""
    return [torch.load(out / f"{case}.rank{rank}.pt", weights_only=True) for rank in range(WORLD)]


def weights(out: Path, case: str, fit: str) -> dict[str, torch.Tensor]:
    return torch.load(out / f"{case}.{fit}.pt", weights_only=True)


def same_rng(a: dict, b: dict) -> bool:
    """Whether two :func:`~app.modules.checkpoints.rng_states` are the same states."""
    numpy_a, numpy_b = a["numpy"], b["numpy"]
    return (
        torch.equal(a["torch"], b["torch"])
        and a["python"] == b["python"]
        and torch.equal(numpy_a[1], numpy_b[1])
        and list(numpy_a[2:]) == list(numpy_b[2:])
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_the_checkpoint_rank_0_writes_holds_every_ranks_random_states(runs, case):
    from app.modules.checkpoints import RANK_STATES
    from app.parallel.fsdp import METADATA_FILE

    path = runs / case / f"epoch=0-step={KILLED_AT}.ckpt"
    sharded = path.is_dir()
    assert sharded == case.endswith("-fsdp")
    checkpoint = torch.load(path / METADATA_FILE if sharded else path, weights_only=True)
    states = checkpoint[RANK_STATES]
    assert len(states) == WORLD and "rng_states" not in checkpoint and "rollout_generator" not in checkpoint
    assert not same_rng(states[0]["rng"], states[1]["rng"])
    if case.startswith("flow"):
        assert not torch.equal(states[0]["rollout_generator"], states[1]["rollout_generator"])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_each_rank_resumes_its_own_random_states_and_data_position(runs, case):
    ranks = draws(runs, case)
    for rank, recorded in enumerate(ranks):
        straight, resumed = recorded["straight"][KILLED_AT], recorded["resumed"][0]
        assert len(recorded["resumed"]) == len(recorded["straight"]) - KILLED_AT
        assert torch.equal(resumed["rollout"], straight["rollout"]), f"rank {rank}: the rollout's generator"
        assert same_rng(resumed["rng"], straight["rng"]), f"rank {rank}: the global generators"
        assert resumed["prompts"] == straight["prompts"], f"rank {rank}: the data sampler's position"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_ranks_draw_different_noise_after_resuming(runs, case):
    first, second = (recorded["resumed"][0] for recorded in draws(runs, case))
    assert not torch.equal(first["rollout"], second["rollout"]), "both ranks' rollouts draw the same noise"
    assert not same_rng(first["rng"], second["rng"])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_killed_and_resumed_run_ends_with_the_uninterrupted_runs_weights_bit_for_bit(runs, case):
    straight, resumed = weights(runs, case, "straight"), weights(runs, case, "resumed")
    assert straight.keys() == resumed.keys() and straight
    assert any("lora_B" in key and value.abs().sum() > 0 for key, value in straight.items()), "nothing trained"
    differing = [key for key in straight if not torch.equal(straight[key], resumed[key])]
    assert not differing, f"{len(differing)} of {len(straight)} trainable tensors differ, e.g. {differing[:3]}"

"""A sharded (FSDP2) checkpoint of two processes resumed on one and on four, on CPU (gloo): the resumed run starts from
the saved weights and optimizer state, continues the epoch at the global sample index (no prompt trained before the
checkpoint comes again, none after it is left out), and its ranks take their random states by the documented rule:
ranks that existed their own, new ranks fresh ones seeded from the checkpoint and their rank.

The runs are launched once per module (``torchrun``, see ``world_size_probe.py``): about 20 s to save on 2 processes,
20 s to resume on 1 and 35 s on 4, on 2 idle cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(600)
HERE = Path(__file__).resolve().parent
PROBE = HERE / "world_size_probe.py"
SAVED_WORLD, BATCH, SAVED_AT = 2, 2, 1  # the probe's: 2 processes, 2 prompts per rank and step, checkpoint of step 1
WORLDS = (1, 4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, probes) -> Path:
    out = tmp_path_factory.mktemp("world_size")
    probes.torchrun(PROBE, SAVED_WORLD, out, "save", timeout=300)
    for world in WORLDS:  # torchrun also for one process: the probe resumes as a launched rank
        probes.torchrun(PROBE, world, out, "resume", timeout=300)
    return out


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def epoch_order(train_set: list[str]) -> list[str]:
    """Epoch 0's prompts in the order the data module shuffles them (its seed is 0: ``randperm`` seeded with 0)."""
    return [train_set[i] for i in torch.randperm(len(train_set), generator=torch.Generator().manual_seed(0)).tolist()]


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_the_resumed_run_starts_from_the_saved_weights_and_optimizer_state(runs, world):
    saved, loaded = load(runs / "saved.pt"), load(runs / f"resume{world}.pt")
    assert saved["weights"].keys() == loaded["weights"].keys() and len(saved["weights"]) == 28  # 14 LoRA A/B pairs
    assert all(torch.equal(saved["weights"][k], loaded["weights"][k]) for k in saved["weights"])
    assert saved["optimizer"].keys() == loaded["optimizer"].keys() == saved["weights"].keys()
    for name, state in saved["optimizer"].items():
        assert state.keys() == {"step", "exp_avg", "exp_avg_sq"} and float(state["step"]) > 0
        assert all(torch.equal(value, loaded["optimizer"][name][key]) for key, value in state.items()), name


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_the_resumed_run_continues_the_epoch_at_the_global_sample_index(runs, world):
    order = epoch_order(load(runs / "saved.pt")["train_set"])
    trained = [load(runs / f"save.rank{rank}.pt")["prompts"] for rank in range(SAVED_WORLD)]
    assert trained == [[order[rank::SAVED_WORLD][:BATCH]] for rank in range(SAVED_WORLD)]
    consumed = SAVED_WORLD * BATCH * SAVED_AT
    rest = order[consumed:]  # 20 prompts: whole shares on 1 and on 4 ranks, no padding
    resumed = [load(runs / f"resume{world}.rank{rank}.pt") for rank in range(world)]
    assert [r["prompts"] for r in resumed] == [[rest[rank::world][:BATCH]] for rank in range(world)]
    assert [r["global_step"] for r in resumed] == [SAVED_AT + 1] * world
    drawn = [p for r in resumed for p in r["prompts"][0]]
    assert not set(drawn) & set(order[:consumed]), "a prompt trained before the checkpoint came again"


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_ranks_that_existed_take_their_random_states_and_new_ranks_seed_theirs_from_checkpoint_and_rank(runs, world):
    from app.modules.checkpoints import RANK_STATES, rng_states, saved_rank_state, seed_rng_states
    from app.parallel.fsdp import METADATA_FILE

    checkpoint = load(runs / f"epoch=0-step={SAVED_AT}.ckpt" / METADATA_FILE)
    started = [load(runs / f"resume{world}.rank{rank}.pt")["rng"]["torch"] for rank in range(world)]
    for rank in range(world):
        if rank < SAVED_WORLD:
            expected = checkpoint[RANK_STATES][rank]["rng"]["torch"]
        else:
            state, seed = saved_rank_state(checkpoint, rank, world)
            assert state == {} and seed is not None
            seed_rng_states(seed)
            expected = rng_states()["torch"]
        assert torch.equal(started[rank], expected), f"rank {rank}"
    assert len({bytes(state.numpy()) for state in started}) == world, "two ranks draw the same noise"

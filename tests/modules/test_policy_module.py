"""What every policy module shares, called directly (no trainer run): sharding the policy when the trainer's strategy
is FSDP2, in a one-process gloo group, and leaving it alone otherwise."""

from types import SimpleNamespace

import pytest
import torch
from test_grpo_skeleton import LinearPolicy, ToyGRPO  # the skeleton tests' toy module
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from app.parallel import FSDP2Strategy
from app.parallel.fsdp import MESH_DIMS, is_sharded


@pytest.fixture
def fsdp2():
    """An FSDP2 strategy over a one-process gloo group (its mesh built as ``setup_environment`` would)."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        strategy = FSDP2Strategy(reshard_after_forward=False)
        strategy._device_mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=MESH_DIMS)
        yield strategy
    finally:
        torch.distributed.destroy_process_group()


def under(strategy):
    module = ToyGRPO(LinearPolicy())
    module._trainer = SimpleNamespace(strategy=strategy)
    return module


def test_configure_model_shards_the_policy_on_the_strategy_s_mesh_once(fsdp2):
    module = under(fsdp2)
    module.configure_model()
    weight = module.policy.weight
    assert is_sharded(module.policy) and isinstance(weight, DTensor)
    assert weight.device_mesh is fsdp2.device_mesh
    assert torch.equal(weight.full_tensor(), torch.tensor([0.5, -0.25]))
    module.configure_model()  # Lightning may call it again (a second fit): the policy is not wrapped twice
    assert module.policy.weight is weight


def test_configure_model_leaves_the_policy_alone_without_a_trainer_or_under_another_strategy():
    for module in (ToyGRPO(LinearPolicy()), under(SimpleNamespace(name="ddp"))):
        module.configure_model()
        assert not is_sharded(module.policy) and not isinstance(module.policy.weight, DTensor)

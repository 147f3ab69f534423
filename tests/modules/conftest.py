"""Fixtures the module tests share (the test doubles themselves are in ``doubles.py``)."""

import pytest
import torch
from doubles import Clock
from torch.distributed.device_mesh import init_device_mesh

from app.modules import grpo
from app.parallel import FSDP2Strategy
from app.parallel.fsdp import MESH_DIMS


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


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """The GRPO skeleton's ``time.perf_counter`` replaced by a :class:`~doubles.Clock`."""
    fake = Clock()
    monkeypatch.setattr(grpo, "time", fake)
    return fake

"""Scale-out: FSDP2 (fully sharded / hybrid sharded data parallel) through Lightning's model-parallel strategy."""

from app.parallel.fsdp import FSDP2Strategy, gathered, shard_policy
from app.parallel.plan import ShardingPlan

__all__ = ["FSDP2Strategy", "ShardingPlan", "gathered", "shard_policy"]

"""Per-rank training state (parameters + gradients + AdamW moments) under DDP, FSDP2 and HSDP, 4 CPU processes (gloo).

    python benchmarks/sharding_memory.py                 # about 1 minute on 2 cores, ~8 GiB of RAM at peak
    python benchmarks/sharding_memory.py --hidden 2048   # a bigger model (16 blocks of 4 x hidden^2 weights)

The model is a stack of transformer-MLP-shaped blocks (``--blocks`` x [Linear(h, 4h), GELU, Linear(4h, h)] + an
embedding-sized input and output layer), float32, about 270 MB at the default size. Each strategy trains it for
``--steps`` AdamW steps on random data, sharded with the package's own :func:`app.parallel.shard_policy` (one FSDP unit
per block, the model as root) on a mesh built like :class:`app.parallel.FSDP2Strategy` builds it:

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel``, every rank holds everything;
- ``fsdp``: mesh (1, 4), every rank holds 1/4 of each parameter, its gradient and its optimizer state;
- ``hsdp``: mesh (2, 2), sharded within pairs of ranks and replicated across the pairs: 1/2.

"state" is the bytes this rank stores for parameters, gradients and optimizer moments (DTensor local shards counted
as stored); "peak RSS" is the process's maximum resident memory (``ru_maxrss``), which adds the interpreter, the
gathered parameters of the block being computed and the activations. Targets (issue 12): FSDP2's state <= 1/world +
10% of DDP's, HSDP's <= 1/shard_size + 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from app.parallel import ShardingPlan, shard_policy  # noqa: E402
from app.parallel.fsdp import MESH_DIMS, local_numel  # noqa: E402

WORLD = 4
MESHES = {"fsdp": (1, WORLD), "hsdp": (2, WORLD // 2)}


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Model(nn.Module):
    def __init__(self, hidden: int, blocks: int, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(blocks))
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    moments = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return sum(local_numel(group)[0] for group in (params, grads, moments)) * 4  # float32


def worker(args) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model(args.hidden, args.blocks, args.vocab)
    if args.strategy == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", MESHES[args.strategy], mesh_dim_names=MESH_DIMS)
        shard_policy(ShardingPlan(units=list(model.blocks), roots=[model]), {"mesh": mesh})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        tokens = torch.randint(0, args.vocab, (2, 16), generator=generator)
        loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()
        optimizer.step()
        measured = state_bytes(model, optimizer)  # gradients still held, as at the peak of a step
        optimizer.zero_grad(set_to_none=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, {"rank": rank, "state": measured, "peak_rss": peak})
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--strategy", choices=["ddp", "fsdp", "hsdp"])
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.strategy:  # a worker under torchrun
        worker(args)
        return
    results = {}
    for strategy in ("ddp", "fsdp", "hsdp"):
        out = Path(f"/tmp/sharding_memory_{strategy}.json")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD),
                   __file__, "--strategy", strategy, "--out", str(out), "--hidden", str(args.hidden),
                   "--blocks", str(args.blocks), "--vocab", str(args.vocab), "--steps", str(args.steps)]  # fmt: skip
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        results[strategy] = json.loads(out.read_text())
    ddp_state = max(r["state"] for r in results["ddp"])
    print(f"\n4 processes (gloo, CPU), hidden {args.hidden}, {args.blocks} blocks, vocab {args.vocab}, float32 + AdamW")
    print(f"{'strategy':9} {'state / rank (MB)':>18} {'vs DDP':>8} {'target':>8} {'peak RSS / rank (MB)':>21}")
    for strategy, rows in results.items():
        state = max(r["state"] for r in rows)
        peak = max(r["peak_rss"] for r in rows)
        shards = {"ddp": 1, **{k: v[1] for k, v in MESHES.items()}}[strategy]
        target = 1 / shards + 0.10 if strategy != "ddp" else 1.0
        verdict = "ok" if state / ddp_state <= target else "MISSED"
        print(f"{strategy:9} {state / 1e6:18.1f} {state / ddp_state:8.3f} {'<= ' + format(target, '.2f'):>8} "
              f"{peak / 1e6:21.0f}  {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()

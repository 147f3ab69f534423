"""Per-rank training state (parameters + gradients + AdamW moments) under DDP, FSDP2 and HSDP on 4 CPU processes
(gloo), and set-up memory at world 1, 2 and 4 with every rank building the whole model or with lean loading.

    python benchmarks/sharding_memory.py                 # about 4 minutes on 2 shared cores, ~11 GiB of RAM at peak
    python benchmarks/sharding_memory.py --repeats 3     # each run three times: min / median / max
    python benchmarks/sharding_memory.py --hidden 2048   # a bigger model (16 blocks of 4 x hidden^2 weights)

The model is a stack of transformer-MLP-shaped blocks (``--blocks`` x [Linear(h, 4h), GELU, Linear(4h, h)] + an
embedding-sized input and output layer), float32: 84 M parameters, 336 MB at the default size. Each strategy trains it
for ``--steps`` AdamW steps on random data, sharded with the package's own :func:`app.parallel.shard_policy` (one FSDP
unit per block, the model as root) on a mesh built like :class:`app.parallel.FSDP2Strategy` builds it:

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel``, every rank holds everything;
- ``fsdp``: mesh (1, world), every rank holds 1/world of each parameter, its gradient and its optimizer state;
- ``hsdp``: mesh (2, world / 2), sharded within pairs of ranks and replicated across the pairs: 1/2 at world 4;
- ``fsdp-lean`` and ``hsdp-lean``: the same meshes, the model loaded with :mod:`app.parallel.loading` from a
  safetensors checkpoint of the same weights (written once before the runs): built on the meta device, sharded, then
  each rank reads only the rows it stores. They must train the same weights as ``fsdp`` / ``hsdp`` (checked: the sum
  of every trained weight, "same weights").

"state" is the bytes this rank stores for parameters, gradients and optimizer moments (DTensor local shards counted
as stored); "peak RSS" is the process's maximum resident memory (``ru_maxrss``), which adds the interpreter, the
gathered parameters of the block being computed and the activations. Targets (issue 12): FSDP2's state <= 1/world +
10% of DDP's, HSDP's <= 1/shard_size + 10%.

Set-up memory: "baseline" is the resident memory (``VmRSS``) after the imports (torch, Lightning) and the process
group, before the model is built; "set-up peak" the process's peak so far (``VmHWM``) right after the model is built,
sharded and (lean) loaded, before any training step; "above baseline" = set-up peak - baseline, what building and
loading the model cost. Target (issue 32): lean set-up peak <= 0.4 x whole loading's at world 4.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from app.parallel import ShardingPlan, shard_policy  # noqa: E402
from app.parallel.fsdp import MESH_DIMS, local_numel  # noqa: E402
from app.parallel.loading import empty_network, same_names  # noqa: E402

WORLD = 4  # the training-state table's world
STRATEGIES = ("ddp", "fsdp", "hsdp", "fsdp-lean", "hsdp-lean")
SETUP_WORLDS = (1, 2)  # besides WORLD: FSDP2 over 1 and 2 processes, whole and lean loading
CHECKPOINT = Path("/tmp/sharding_memory_model.safetensors")
TARGET = 0.4  # issue 32: lean set-up peak per rank at world 4 <= 0.4 x the whole-loading one


def mesh_shape(kind: str, world: int) -> tuple[int, int]:
    """(replicate, shard): FSDP2 shards over every process, HSDP over pairs and replicates across them."""
    return (1, world) if kind == "fsdp" else (2, world // 2)


def runs_to_make() -> list[tuple[str, int]]:
    """(strategy, world) of every torchrun launch."""
    return [(strategy, WORLD) for strategy in STRATEGIES] + [
        (strategy, world) for world in SETUP_WORLDS for strategy in ("fsdp", "fsdp-lean")
    ]


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


def memory_kb(field: str) -> int:
    """A field of /proc/self/status in kB (``VmRSS``: resident now, ``VmHWM``: the peak so far)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1])


def worker(args) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kind, lean = args.strategy.removesuffix("-lean"), args.strategy.endswith("-lean")
    mesh = None
    if kind != "ddp":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", mesh_shape(kind, dist.get_world_size()), mesh_dim_names=MESH_DIMS)
    baseline = memory_kb("VmRSS") * 1024  # interpreter, imports, process group: before the model exists
    torch.manual_seed(0)
    build = functools.partial(Model, args.hidden, args.blocks, args.vocab)
    model = empty_network(build, [args.checkpoint], same_names) if lean else build()
    if kind == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        shard_policy(ShardingPlan(units=list(model.blocks), roots=[model]), {"mesh": mesh})  # lean: and loads it
    setup_peak = memory_kb("VmHWM") * 1024
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
    checksum = torch.tensor(sum(local_sum(p) for p in model.parameters()), dtype=torch.float64)
    if kind == "hsdp":  # a replicated pair holds the same shard twice
        checksum /= mesh_shape(kind, dist.get_world_size())[0]
    dist.all_reduce(checksum)
    rows = [None] * dist.get_world_size()
    row = {"rank": rank, "state": measured, "peak_rss": peak, "baseline_rss": baseline, "setup_peak_rss": setup_peak}
    dist.all_gather_object(rows, {**row, "checksum": float(checksum)})
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def local_sum(parameter: torch.Tensor) -> float:
    """The float64 sum of this rank's part of ``parameter`` (its local shard when sharded)."""
    from torch.distributed.tensor import DTensor

    local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
    return float(local.detach().double().sum())


def save_checkpoint(args) -> None:
    """The model's weights (seed 0, as every worker builds them) as one safetensors file, for the lean runs."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    save_file(Model(args.hidden, args.blocks, args.vocab).state_dict(), args.checkpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each strategy (min / median / max shown)")
    parser.add_argument("--checkpoint", default=str(CHECKPOINT), help="safetensors file the lean runs load")
    parser.add_argument("--strategy", choices=STRATEGIES)
    parser.add_argument("--save", action="store_true", help="only write --checkpoint")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.save:
        save_checkpoint(args)
        return
    if args.strategy:  # a worker under torchrun
        worker(args)
        return
    sizes = ["--hidden", str(args.hidden), "--blocks", str(args.blocks), "--vocab", str(args.vocab)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, __file__, "--save", "--checkpoint", args.checkpoint, *sizes], check=True, env=env)
    runs: dict[tuple[str, int], list] = {run: [] for run in runs_to_make()}
    for _ in range(args.repeats):
        for strategy, world in runs:
            out = Path(f"/tmp/sharding_memory_{strategy}_{world}.json")
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(world),
                __file__,
                "--strategy",
                strategy,
                "--out",
                str(out),
                "--checkpoint",
                args.checkpoint,
                *sizes,
                "--steps",
                str(args.steps),
            ]
            subprocess.run(command, check=True, env=env)
            runs[(strategy, world)].append(json.loads(out.read_text()))
    report(runs, args)


def spread(values: list[float]) -> str:
    """``min / median / max`` in MB (one value when there was one run)."""
    low, mid, high = (v / 1e6 for v in (min(values), statistics.median(values), max(values)))
    return f"{mid:.0f}" if len(values) == 1 else f"{low:.0f} / {mid:.0f} / {high:.0f}"


def largest(run_rows: list[list[dict]], field) -> list[float]:
    """Per run, the largest value over the ranks of ``field`` (a key or a function of a rank's row)."""
    value = field if callable(field) else (lambda row: row[field])
    return [max(value(row) for row in rows) for rows in run_rows]


def above_baseline(row: dict) -> float:
    return row["setup_peak_rss"] - row["baseline_rss"]


def report(runs: dict[tuple[str, int], list], args) -> None:
    """Print the training-state table (world 4) and the set-up table (every world, whole vs lean loading)."""
    trained = {strategy: runs[(strategy, WORLD)] for strategy in STRATEGIES}
    ddp_state = max(r["state"] for r in trained["ddp"][0])
    print(
        f"\nhidden {args.hidden}, {args.blocks} blocks, vocab {args.vocab}, float32 + AdamW, gloo on CPU, "
        f"{args.repeats} run(s) each (min / median / max over runs of the largest rank)"
    )
    print(f"\n{WORLD} processes: training state")
    print(f"{'strategy':10} {'state / rank (MB)':>18} {'vs DDP':>8} {'target':>8} {'peak RSS / rank (MB)':>21}")
    for strategy, strategy_runs in trained.items():
        state = max(r["state"] for r in strategy_runs[0])  # the same in every run
        shards = 1 if strategy == "ddp" else mesh_shape(strategy.removesuffix("-lean"), WORLD)[1]
        target = 1 / shards + 0.10 if strategy != "ddp" else 1.0
        verdict = "ok" if state / ddp_state <= target else "MISSED"
        print(
            f"{strategy:10} {state / 1e6:18.1f} {state / ddp_state:8.3f} {'<= ' + format(target, '.2f'):>8} "
            f"{spread(largest(strategy_runs, 'peak_rss')):>21}  {verdict}"
        )
    print("\nset-up: after the model is built, sharded and loaded, before the first step")
    print(
        f"{'world':>5} {'strategy':10} {'mesh':>6} {'baseline RSS':>13} {'set-up peak RSS':>16} "
        f"{'above baseline':>15} {'peak / whole':>13} {'above / whole':>14} {'same weights':>13}"
    )
    for (strategy, world), strategy_runs in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
        if strategy == "ddp":
            continue
        peaks, parts = largest(strategy_runs, "setup_peak_rss"), largest(strategy_runs, above_baseline)
        peak_ratio = part_ratio = same = ""
        whole = strategy.removesuffix("-lean")
        if whole != strategy:
            whole_runs = runs[(whole, world)]
            peak = statistics.median(peaks) / statistics.median(largest(whole_runs, "setup_peak_rss"))
            part = statistics.median(parts) / statistics.median(largest(whole_runs, above_baseline))
            peak_ratio, part_ratio = f"{peak:.2f}", f"{part:.2f}"
            checksums = {rows[0]["checksum"] for rows in strategy_runs + whole_runs}
            same = "yes" if len(checksums) == 1 else f"NO {sorted(checksums)}"
        shape = "x".join(map(str, mesh_shape(whole, world)))
        print(
            f"{world:5} {strategy:10} {shape:>6} {spread(largest(strategy_runs, 'baseline_rss')):>13} "
            f"{spread(peaks):>16} {spread(parts):>15} {peak_ratio:>13} {part_ratio:>14} {same:>13}"
        )
    print(
        f"(MB per rank; ratios: medians, lean / the same mesh with every rank building the whole model; target at "
        f"world {WORLD}: <= {TARGET})"
    )


if __name__ == "__main__":
    main()

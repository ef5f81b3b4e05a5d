"""Lose a rank of a hybrid-sharded job (FSDP2 in each replica group), keep training.

Run: ``tailtrain launch --nproc-per-node 4 --on-rank-loss shrink
examples/sharded_shrink_loop.py --kill-rank 3 --kill-step 5`` (CPU, gloo, digits data: two
replica groups of two ranks, ranks 0-1 and 2-3).

The loop is a plain HSDP loop (``fully_shard`` over the mesh's shard dimension in each group);
only ``on_rank_loss`` is new, and a rank whose group leaves catches ``Refused``::

    step_fn = ShardedStep(model, optimizer, args.strategy, mesh=mesh, on_rank_loss="shrink")
    try:
        for step in range(STEPS):
            record = step_fn(micro_batches(step), loss_fn)
    except Refused:          # a rank of this group died: the group left, the others go on
        return

Here one rank SIGKILLs itself in the middle of step ``--kill-step``. Its group's other rank
fails in FSDP's next collective and leaves with it (the group's shards are one model); the
other group computes the broken step again on its own (``record.redone``) and goes on:
``record.live`` names the groups that step, ``record.lost`` the groups lost.

``--strategy`` takes ``sync``, ``dropcompute`` (a fixed threshold, ``threshold=auto``) or
``local-sgd:period=H``. With ``--out DIR`` every rank that finished writes ``DIR/rank{r}.pt``:
its records and the full parameters, gathered within its group
(tests/integrate/test_shrink_sharded.py rebuilds the run from them).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from tailtrain import Refused, ShardedStep

STEPS, M, BATCH, LR, MOMENTUM = 12, 2, 16, 0.2, 0.5
GROUPS, SHARDS = 2, 2
#: seconds each micro-batch takes on top of its compute (a delay that dominates it)
SECONDS = 0.02


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)


def micro_batches(x, y, group: int, shard: int, step: int) -> list[tuple[torch.Tensor, ...]]:
    """Rank (``group``, ``shard``)'s M micro-batches of ``step``: consecutive slices."""
    out = []
    for unit in range(M):
        start = (((step * GROUPS + group) * SHARDS + shard) * M + unit) * BATCH
        idx = torch.arange(start, start + BATCH) % len(x)
        out.append((x[idx], y[idx]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, nargs="*", default=[])
    parser.add_argument("--kill-step", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--strategy", default="sync")
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (GROUPS, SHARDS), mesh_dim_names=("replicate", "shard"))
    group, shard = mesh.get_local_rank("replicate"), mesh.get_local_rank("shard")
    x, y = digits()
    model = make_model()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    step_fn = ShardedStep(model, optimizer, args.strategy, mesh=mesh, on_rank_loss="shrink")
    step = 0

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        time.sleep(SECONDS)
        if rank in args.kill_rank and step == args.kill_step:  # dies here
            os.kill(os.getpid(), signal.SIGKILL)
        return F.cross_entropy(model(batch[0]), batch[1])

    records = []
    try:
        for step in range(args.steps):
            records.append(step_fn(micro_batches(x, y, group, shard, step), loss_fn))
    except Refused:  # a rank of this group died: the group left, the others go on
        print(f"sharded_shrink_loop: rank {rank} left with group {group}", flush=True)
        return
    if args.out is not None:
        params = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
        args.out.mkdir(parents=True, exist_ok=True)
        state = {"records": [r.as_dict() for r in records], "model": params}
        torch.save(state, args.out / f"rank{rank}.pt")
    if rank == mesh["shard"].mesh.flatten()[0] and group == step_fn.live[0]:
        lost = sorted({g for record in records for g in record.lost})
        redone = [record.step for record in records if record.redone]
        print(
            f"sharded_shrink_loop: {len(records)} steps, groups {list(step_fn.live)} of "
            f"{GROUPS} finished, lost {lost}, redone {redone}, loss {records[-1].loss:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

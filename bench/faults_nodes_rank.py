"""One rank of ``bench_faults_nodes.py``'s tailtrain rows, under ``tailtrain launch --nnodes 3
--node-rank I --nproc-per-node 2 --store apart --on-rank-loss shrink``.

The task is the peers' (``faults_peer.py``): the model, its initial weights, the shards and the
lr from tailtrain's own ``World.build`` of the same scenario (``--workers`` the job's ranks),
this rank's micro-batches drawn by ``faults_peer.batch`` from its shard (worker = ``RANK``) and
its injected seconds by ``faults_peer.Noise`` (tailtrain's ``Injector``, the same seeded law;
``--slow-workers`` times ``--slow-factor``). The loop is the one ``examples/shrink_loop.py``
documents: ``StragglerStep(model, optimizer, STRATEGY, on_rank_loss="shrink")``, and a rank
started again (``TAILTRAIN_RESTART``: its node's launcher started again after the node died)
joins the live ranks at a step boundary and goes on from ``step_fn.next_step``. Each call
computes ``step_fn.wants`` micro-batches under ``rebalance`` (its share), else M; each
micro-batch's loss function sleeps that micro-batch's draw before its forward (a peer sleeps
draw u after micro-batch u and the last before the last: the same seconds a step).

Each process appends one JSON line per committed step to ``OUT/log-w{rank}-{pid}.jsonl``, as
the peers do (``t0``/``t`` its own ``time.time()`` at the call's start and return, the
record's loss, ``live``, ``completed``, ``lost``, ``rejoined``, ``redone``), and a ``start``
line.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from faults_peer import Log, Noise, batch, build
from tailtrain import StragglerStep

#: set by ``tailtrain launch`` in a rank it started as a restart (its node came back)
RESTART = "TAILTRAIN_RESTART"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--workers", type=int, default=6, help="the job's ranks")
    parser.add_argument("--task", default="digits-cnn")
    parser.add_argument("--delay", required=True)
    parser.add_argument("--pattern", default="iid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--strategy", default="sync")
    parser.add_argument(
        "--slow-workers", type=lambda t: [int(w) for w in t.split(",") if w], default=[]
    )
    parser.add_argument("--slow-factor", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    restarted = RESTART in os.environ
    if not restarted:  # a rank started again is in no group: its StragglerStep joins the live
        dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    world = build(args)
    model = world.task.module_at(world.task.init_params(args.seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=world.lr)
    m = args.micro_batches
    shares = {"micro_batches": m} if args.strategy.startswith("rebalance") else {}
    step_fn = StragglerStep(model, optimizer, args.strategy, on_rank_loss="shrink", **shares)
    noise = Noise(world, rank)
    noise.factor = args.slow_factor if rank in args.slow_workers else 1.0
    log = Log(args.out, rank)
    step = step_fn.next_step
    log.write(event="start", step=step, restart=int(restarted), t=time.time())

    def loss_fn(item: tuple[torch.Tensor, torch.Tensor, float]) -> torch.Tensor:
        x, y, seconds = item
        time.sleep(seconds)
        return F.cross_entropy(model(x), y)

    while step < args.steps:
        t0 = time.time()
        n = step_fn.wants or m  # rebalance: this rank's share; else M
        noise.m = n
        seconds = noise.seconds(step)
        items = [(*batch(world, rank, step, args.seed, u), seconds[u]) for u in range(n)]
        record = step_fn(items, loss_fn)
        log.write(
            step=record.step,
            t0=t0,
            t=time.time(),
            loss=record.loss,
            committed=True,
            part=rank in record.live,
            live=list(record.live),
            completed=list(record.completed),
            lost=list(record.lost),
            rejoined=list(record.rejoined),
            redone=bool(record.redone),
        )
        step = step_fn.next_step
    if dist.is_initialized():  # a rank started again never joined the job's group
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

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

Under ``rebalance:deal=demand`` each call gets the job's stream (:class:`Stream`: position p is
micro-batch u of worker w's draw for step s, p = s N M + w M + u, the same on every rank, so a
step applies sync's global batch whoever computes it), and the step deals each rank the
positions it asks for; each one sleeps this rank's next draw (:class:`Draws`: its M draws a
step, in order, however many it computes).

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


class Stream:
    """The job's micro-batches by position (module docstring); a unit's seconds are drawn by
    the rank that computes it (None here)."""

    def __init__(self, world, workers: int, m: int, seed: int) -> None:
        self.world, self.workers, self.m, self.seed = world, workers, m, seed

    def __getitem__(self, position: int) -> tuple[torch.Tensor, torch.Tensor, None]:
        step, k = divmod(position, self.workers * self.m)
        worker, u = divmod(k, self.m)
        return (*batch(self.world, worker, step, self.seed, u), None)


class Draws:
    """This rank's injected seconds, one per micro-batch it computes, in the order of its
    steps' draws (``Noise.seconds``)."""

    def __init__(self, noise: Noise) -> None:
        self.noise, self.left, self.step = noise, [], 0

    def next(self) -> float:
        if not self.left:
            self.left = self.noise.seconds(self.step)
            self.step += 1
        return self.left.pop(0)


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
    demand = "deal=demand" in args.strategy
    stream, draws = Stream(world, args.workers, m, args.seed), Draws(noise)
    log = Log(args.out, rank)
    step = step_fn.next_step
    log.write(event="start", step=step, restart=int(restarted), t=time.time())

    def loss_fn(item: tuple[torch.Tensor, torch.Tensor, float | None]) -> torch.Tensor:
        x, y, seconds = item
        time.sleep(draws.next() if seconds is None else seconds)
        return F.cross_entropy(model(x), y)

    while step < args.steps:
        t0 = time.time()
        if demand:  # the step deals the stream's positions this rank asks for
            record = step_fn(stream, loss_fn)
        else:
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
    step_fn.close()  # dealt on demand: the last rounds' store keys go (a barrier)
    if dist.is_initialized():  # a rank started again never joined the job's group
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Lose a rank, keep training: your own loop goes on without a rank that dies.

Run: ``tailtrain launch --nproc-per-node 3 --on-rank-loss shrink examples/shrink_loop.py
--kill-rank 0 --kill-step 10`` (CPU, gloo, digits data).

``tailtrain launch`` starts the ranks as torchrun does (``dist.init_process_group("gloo")``
unchanged), but hosts the store itself and lets a rank die without stopping the others. The
loop is the plain one; only the ``on_rank_loss`` argument is new::

    step_fn = StragglerStep(model, optimizer, args.strategy, on_rank_loss="shrink")   # <-
    for step in range(STEPS):
        record = step_fn(micro_batches(step), loss_fn)

Here one rank SIGKILLs itself in the middle of step ``--kill-step`` (any rank, rank 0 too).
The survivors' next collective fails, they agree on who is left, form a new group, take the
model, the optimizer's state and the rule's state from the survivor that completed the most
steps, and compute the broken step again without the dead rank (``record.redone``). Every
call still returns one record: ``record.live`` names the ranks that stepped, ``record.lost``
those lost just before. The dead rank's shard is skipped from then on.

**Healing** (``tailtrain launch --nproc-per-node 3 --on-rank-loss shrink --restart-lost 1
examples/shrink_loop.py --kill-rank 1 --kill-step 10 --rejoin-steps 20``): the launcher starts
the killed rank's script again, with ``TAILTRAIN_RESTART`` in its environment. That process
must not call ``dist.init_process_group`` (the job's group is broken; joining it again hangs),
so the script takes its rank from ``RANK``; its ``StragglerStep`` asks the live ranks to take it
in, they do so at their next step boundary and hand it the model, the optimizer's and the
rule's state, and the loop goes on from ``step_fn.next_step``::

    if "TAILTRAIN_RESTART" not in os.environ:         # a rank started again is in no group
        dist.init_process_group("gloo")
    step_fn = StragglerStep(model, optimizer, args.strategy, on_rank_loss="shrink")
    for step in range(step_fn.next_step, STEPS):      # 0, or where the live ranks are
        record = step_fn(micro_batches(step), loss_fn)

Every rank's record of the first step after the heal names it (``record.rejoined``). A restart
takes seconds (torch's import), so ``--rejoin-steps K`` runs until K steps after the rejoin
(at least ``--steps``; without a rejoin, at most 100 times ``--steps``): every rank decides
that from the same records.

``--strategy`` takes any allreduce rule but rebalance by shares (``"dropcompute:threshold=auto"``,
``"local-sgd:period=2"``, ...): the rule follows the live world, as ``tailtrain train``'s does.

**Keeping the global batch** (``--strategy rebalance:deal=demand``): each step's N M
micro-batches go to whichever rank asks next, from the job's stream by position (``Stream``:
the same on every rank), so a slow rank computes fewer of them, and when a rank dies the
survivors compute its part too: every update still applies N M micro-batches, and
``record.dealt`` names the positions each rank computed::

    step_fn = StragglerStep(model, optimizer, "rebalance:deal=demand", micro_batches=M,
                            on_rank_loss="shrink")
    for step in range(step_fn.next_step, STEPS):
        record = step_fn(stream, loss_fn)             # the step deals the stream's positions
**Float16 with a loss scaler** (``--overflow-step S``): the step scales each micro-batch's
loss by a ``torch.amp.GradScaler`` (``StragglerStep(..., scaler=scaler)``), and rank 0's loss
overflows in step S, as float16's does when the scale is too high: every rank's scaler skips
that update and halves its scale. A rank taken back gets the live ranks' scale with the
model, since every rank scales its gradients by it before they are summed.

With ``--out DIR`` every surviving rank writes ``DIR/rank{r}.pt``: its records, final
parameters and scale (tests/integrate/test_shrink_step.py rebuilds the run from them).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from tailtrain import StragglerStep

STEPS, M, BATCH, LR, MOMENTUM = 40, 2, 16, 0.2, 0.5
#: set by ``tailtrain launch --restart-lost`` in a rank it started again
RESTART = "TAILTRAIN_RESTART"
#: seconds each micro-batch takes on top of its compute (a delay that dominates it)
SECONDS = 0.02


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def digits() -> tuple[torch.Tensor, ...]:
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def micro_batches(x, y, rank: int, world: int, step: int) -> list[tuple[torch.Tensor, ...]]:
    """Rank ``rank``'s M micro-batches of ``step``, drawn from its own shard."""
    rng = np.random.default_rng([rank, step])
    idx = rng.choice(np.arange(rank, len(x), world), (M, BATCH))
    return [(x[i], y[i]) for i in idx]


class Stream:
    """The job's micro-batches by position, the same on every rank: position p is micro-batch
    u of rank w's draw for step s (p = s N M + w M + u), so a step dealt on demand applies
    sync's global batch, whoever computes it."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, world: int) -> None:
        self.x, self.y, self.world = x, y, world

    def __getitem__(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        step, k = divmod(position, self.world * M)
        rank, u = divmod(k, M)
        return micro_batches(self.x, self.y, rank, self.world, step)[u]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, nargs="*", default=[])  # one or more
    parser.add_argument("--kill-step", type=int, default=10)
    # rank: the rank dies; node: its machine does (its launcher goes, and its ranks with it)
    parser.add_argument("--kill-what", choices=("rank", "node"), default="rank")
    parser.add_argument("--out", type=Path, default=None)
    # any but rebalance by shares: "dropcompute", "rebalance:deal=demand", ...
    parser.add_argument("--strategy", default="sync")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--rejoin-steps", type=int, default=0)
    parser.add_argument("--overflow-step", type=int, default=None)  # with a GradScaler
    args = parser.parse_args()
    torch.set_num_threads(1)
    restarted = RESTART in os.environ
    if not restarted:  # a rank started again is in no group: its StragglerStep joins the live
        dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    x, y, x_test, y_test = digits()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    demand = "deal=demand" in args.strategy  # the step deals the stream's positions
    dealt = {"micro_batches": M} if demand else {}
    scaler = None if args.overflow_step is None else torch.amp.GradScaler("cpu")
    step_fn = StragglerStep(
        model, optimizer, args.strategy, on_rank_loss="shrink", scaler=scaler, **dealt
    )
    stream = Stream(x, y, world)
    step = step_fn.next_step  # 0, or the live ranks' next step in a rank started again

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        time.sleep(SECONDS)
        if rank in args.kill_rank and step == args.kill_step and not restarted:  # dies here
            os.kill(os.getppid() if args.kill_what == "node" else os.getpid(), signal.SIGKILL)
            time.sleep(60)  # a node's rank dies with its launcher (the launch's death signal)
        loss = F.cross_entropy(model(batch[0]), batch[1])
        return loss * math.inf if rank == 0 and step == args.overflow_step else loss

    records = []
    # --rejoin-steps: until K steps after the last rank rejoined (every rank reads it from the
    # same records); at most 100 times --steps while none did
    end, rejoined = args.steps, not args.rejoin_steps
    while step < end or (not rejoined and step < 100 * args.steps):
        record = step_fn(stream if demand else micro_batches(x, y, rank, world, step), loss_fn)
        records.append(record)
        if record.rejoined:  # each rejoin (a node's ranks may come back one by one)
            rejoined, end = True, max(end, record.step + args.rejoin_steps)
        step = step_fn.next_step

    step_fn.close()  # dealt on demand: the last rounds' store keys go
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        state = {"records": [r.as_dict() for r in records], "model": model.state_dict()}
        state["scale"] = None if scaler is None else scaler.get_scale()
        torch.save(state, args.out / f"rank{rank}.pt")
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    # the lowest survivor that stepped from the start speaks (a rank taken back holds the
    # records from its return on; every rank reads who that was from the same record)
    back = sorted({r for record in records for r in record.rejoined})
    if rank == min((r for r in step_fn.live if r not in back), default=step_fn.live[0]):
        lost = sorted({r for record in records for r in record.lost})
        redone = [record.step for record in records if record.redone]
        print(
            f"shrink_loop: {step} steps, ranks {list(step_fn.live)} of {world} finished, "
            f"lost {lost}, redone {redone}, rejoined {back}, loss {records[-1].loss:.3f}, "
            f"test accuracy {accuracy:.3f}",
            flush=True,
        )
    if dist.is_initialized():  # a rank started again never joined the job's group
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

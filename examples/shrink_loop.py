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

``--strategy`` takes any allreduce rule but rebalance (``"dropcompute:threshold=auto"``,
``"local-sgd:period=2"``, ...): the rule follows the live world, as ``tailtrain train``'s does.
With ``--out DIR`` every surviving rank writes ``DIR/rank{r}.pt``: its records and final
parameters (tests/integrate/test_shrink_step.py rebuilds the run from them).
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, default=None)
    parser.add_argument("--kill-step", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--strategy", default="sync")  # any but rebalance: "dropcompute", ...
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, x_test, y_test = digits()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    step_fn = StragglerStep(model, optimizer, args.strategy, on_rank_loss="shrink")
    step = 0

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        time.sleep(SECONDS)
        if rank == args.kill_rank and step == args.kill_step:  # dies inside the step
            os.kill(os.getpid(), signal.SIGKILL)
        return F.cross_entropy(model(batch[0]), batch[1])

    records = []
    for step in range(STEPS):
        records.append(step_fn(micro_batches(x, y, rank, world, step), loss_fn))

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        state = {"records": [r.as_dict() for r in records], "model": model.state_dict()}
        torch.save(state, args.out / f"rank{rank}.pt")
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if rank == step_fn.live[0]:  # the lowest survivor speaks
        lost = sorted({r for record in records for r in record.lost})
        redone = [record.step for record in records if record.redone]
        print(
            f"shrink_loop: {STEPS} steps, ranks {list(step_fn.live)} of {world} finished, "
            f"lost {lost}, redone {redone}, loss {records[-1].loss:.3f}, "
            f"test accuracy {accuracy:.3f}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""DropCompute for a job that keeps DistributedDataParallel: a comm hook and ``no_sync``.

Run: ``torchrun --nproc-per-node 2 examples/ddp_loop.py`` (CPU, gloo, digits data).

Without tailtrain, gradient accumulation over M micro-batches under DDP reads (the lines
that change are marked ``# <-``)::

    ddp = DDP(make_model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        batches = micro_batches(step)
        for i, (x, y) in enumerate(batches):                                      # <-
            with ddp.no_sync() if i < len(batches) - 1 else nullcontext():        # <-
                (F.cross_entropy(ddp(x), y) / M).backward()                       # <-
        optimizer.step()
        optimizer.zero_grad()

With tailtrain, DDP stays; the hook reduces sum_n w_n G_n / sum_n w_n, each rank's mean
gradient G_n over the micro-batches it finished before the threshold tau, weighted by their
number (DropCompute Eq. (1))::

    ddp = DDP(make_model())
    state = StragglerHookState("dropcompute:threshold=auto")                      # <-
    ddp.register_comm_hook(state, weighted_allreduce_hook)                        # <-
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        for x, y in state.micro_batches(ddp, micro_batches(step)):               # <-
            F.cross_entropy(ddp(x), y).backward()                                 # <-
        if not state.last.empty:                                                  # <-
            optimizer.step()
        optimizer.zero_grad()

``state.last`` is the round's record (ranks' weights, completed micro-batches, tau), and
``state.state_dict()`` checkpoints the rule. Here rank 1 is a straggler: now and then one of
its micro-batches takes 50 ms longer.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tailtrain import StragglerHookState, weighted_allreduce_hook

STEPS, M, BATCH, LR = 60, 4, 16, 0.3
STRATEGY = "dropcompute:threshold=auto,calibrate=10"


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def digits() -> tuple[torch.Tensor, ...]:
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def main() -> None:
    torch.set_num_threads(1)
    # the model and its optimizer before the process group: the first optimizer imports
    # torch._dynamo, which keeps references to a default group alive at that moment; the
    # group could then outlive destroy_process_group, its gloo threads running into exit
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, x_test, y_test = digits()
    rng = np.random.default_rng(rank)

    def micro_batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        idx = rng.choice(np.arange(rank, len(x), world), (M, BATCH))  # this rank's shard
        return [(x[i], y[i]) for i in idx]

    ddp = DDP(model)
    state = StragglerHookState(STRATEGY)
    ddp.register_comm_hook(state, weighted_allreduce_hook)
    drop_rates = []
    for step in range(STEPS):
        for bx, by in state.micro_batches(ddp, micro_batches(step)):
            if rank == 1 and rng.random() < 0.2:  # the straggler
                time.sleep(0.05)
            F.cross_entropy(ddp(bx), by).backward()
        if not state.last.empty:  # no rank's gradient entered: no update (momentum included)
            optimizer.step()
        optimizer.zero_grad()
        drop_rates.append(state.last.drop_rate)

    with torch.no_grad():
        accuracy = (ddp.module(x_test).argmax(1) == y_test).float().mean().item()
    if rank == 0:
        print(
            f"ddp_loop: {STEPS} steps on {world} ranks, tau {state.last.threshold:.4f} s, "
            f"drop rate {np.mean(drop_rates[10:]):.3f}, test accuracy {accuracy:.3f}"
        )
    # Tear down together, the reducer before its group: a rank that exits while its peer still
    # uses the group sometimes aborts ("terminate called without an active exception"). So
    # does one whose group outlives destroy_process_group, gloo's threads still running at
    # exit: why the optimizer above comes before init_process_group.
    dist.barrier()
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

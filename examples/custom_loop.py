"""DropCompute in a plain PyTorch loop: the same loop, with and without tailtrain.

Run: ``torchrun --nproc-per-node 2 examples/custom_loop.py`` (CPU, gloo, digits data).

Without tailtrain, a data-parallel loop with M micro-batches per step reads (the lines that
change are marked ``# <-``)::

    model, optimizer = make_model(), torch.optim.SGD(model.parameters(), lr=LR)
    dist.init_process_group("gloo")
    ddp = DDP(model)                                                        # <-
    for step in range(STEPS):
        optimizer.zero_grad()                                               # <-
        for x, y in micro_batches(step):                                    # <-
            (F.cross_entropy(ddp(x), y) / M).backward()                     # <-
        optimizer.step()                                                    # <-

With tailtrain (``dropcompute``: each rank stops computing at a threshold tau, found by
Algorithm 2 from the times of the first rounds, and the rest is averaged by weight)::

    model, optimizer = make_model(), torch.optim.SGD(model.parameters(), lr=LR)
    dist.init_process_group("gloo")
    step_fn = StragglerStep(model, optimizer, "dropcompute:threshold=auto")   # <-
    for step in range(STEPS):
        step_fn(micro_batches(step), lambda b: F.cross_entropy(model(b[0]), b[1]))  # <-

Any allreduce strategy fits the same line: ``"sync"``, ``"local-sgd:period=4"``, ... Here
rank 1 is a straggler: now and then one of its micro-batches takes 50 ms longer.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from tailtrain import StragglerStep

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
    # torch._dynamo, which keeps references to a default group alive at that moment, so
    # destroy_process_group could not end gloo's threads (examples/ddp_loop.py says more)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, x_test, y_test = digits()
    rng = np.random.default_rng(rank)

    def micro_batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        idx = rng.choice(np.arange(rank, len(x), world), (M, BATCH))  # this rank's shard
        return [(x[i], y[i]) for i in idx]

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if rank == 1 and rng.random() < 0.2:  # the straggler
            time.sleep(0.05)
        return F.cross_entropy(model(batch[0]), batch[1])

    step_fn = StragglerStep(model, optimizer, STRATEGY)
    records = [step_fn(micro_batches(step), loss_fn) for step in range(STEPS)]

    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if rank == 0:
        last = records[-1]
        dropped = np.mean([r.drop_rate for r in records[10:]])
        print(
            f"custom_loop: {STEPS} steps on {world} ranks, tau {last.threshold:.4f} s, "
            f"drop rate {dropped:.3f}, loss {last.loss:.3f}, test accuracy {accuracy:.3f}"
        )
    dist.barrier()  # tear down together (examples/ddp_loop.py says why)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

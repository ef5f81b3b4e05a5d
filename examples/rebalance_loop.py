"""`rebalance` in a plain PyTorch loop: a persistently slow rank gets a smaller share.

Run: ``torchrun --nproc-per-node 2 examples/rebalance_loop.py`` (CPU, gloo, digits data).

Rank 1 stands for an older GPU: every micro-batch takes it 40 ms against rank 0's 20 ms. Under
``sync`` both compute M micro-batches and rank 0 waits half of every step. ``rebalance``
measures the ranks' micro-batch times and, after a warm-up, deals sync's global batch of
N·M micro-batches by shares that follow their speed (here 8 and 4 of 12); the sampler draws
each rank's share from one permutation of the dataset, so every sample of an epoch is
computed once, by whichever rank its share reaches::

    step_fn = StragglerStep(model, optimizer, "rebalance", micro_batches=M)   # <-
    sampler = ShareSampler(len(x), step_fn, micro_batch_size=BATCH)           # <-
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for indices in sampler:                       # this rank's share of the step
            step_fn([(x[i], y[i]) for i in indices], loss_fn)

Each call returns a record whose ``wants`` is the next call's count (``step_fn.wants`` before
the first): a loop that draws its own micro-batches gives that many.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from tailtrain import ShareSampler, StragglerStep

EPOCHS, M, BATCH, LR = 2, 6, 8, 0.3
STRATEGY = "rebalance:warmup=3,window=5"
#: seconds each micro-batch of a rank takes on top of its compute: rank 1 is twice as slow
SECONDS = (0.02, 0.04)


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

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        time.sleep(SECONDS[rank % len(SECONDS)])  # the hardware: rank 1 is the older GPU
        return F.cross_entropy(model(batch[0]), batch[1])

    step_fn = StragglerStep(model, optimizer, STRATEGY, micro_batches=M)
    sampler = ShareSampler(len(x), step_fn, micro_batch_size=BATCH, seed=0)
    records, seen = [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        used: list[int] = []
        for indices in sampler:
            records.append(step_fn([(x[i], y[i]) for i in indices], loss_fn))
            used += [i for micro_batch in indices for i in micro_batch]
        seen.append(used)

    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    everyone = [None] * world
    dist.all_gather_object(everyone, seen)
    if rank == 0:
        per_epoch = [[i for ranks in everyone for i in ranks[e]] for e in range(EPOCHS)]
        once = all(len(set(e)) == len(e) == len(sampler) * sampler.global_batch for e in per_epoch)
        first, last = records[0], records[-1]
        step_times = np.array([r.time for r in records])
        print(
            f"rebalance_loop: {len(records)} steps on {world} ranks, shares {first.shares} -> "
            f"{last.shares}, step {step_times[:3].mean():.3f} s -> {step_times[-5:].mean():.3f} s, "
            f"every sample once an epoch: {once}, loss {last.loss:.3f}, "
            f"test accuracy {accuracy:.3f}"
        )
    dist.barrier()  # tear down together (examples/ddp_loop.py says why)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

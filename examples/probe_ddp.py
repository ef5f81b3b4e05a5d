"""Who is slow in my DDP job? The PyTorch DDP tutorial's loop with tailtrain's probe.

Run: ``torchrun --nproc-per-node 2 examples/probe_ddp.py [--slow-rank 1] [--out runs/probe]``
(CPU, gloo), then ``tailtrain advise runs/probe``.

The loop is the tutorial's (``DistributedSampler``, ``DataLoader``, ``DDP``, SGD); the probe
adds the two lines marked ``# <- probe``: it hooks DDP's gradients (DDP's own allreduce and
its overlap kept, no comm hook) and wraps the loader, and about every 2 seconds (the first
time after 10 steps, then at the end of each epoch) rank 0 logs each rank's score and verdict
and appends to ``runs/probe/trace.csv`` (each rank's seconds, wait and samples per step). Run it
again in the same folder (after adopting a remedy, say) and the trace keeps both runs, the new
one as ``run`` 1. ``--slow-rank R`` makes rank R's forward 20 ms slower (a slow GPU, a noisy
neighbour); ``--slow-ms`` sets by how much.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tailtrain import StragglerProbe

EPOCHS, BATCH, LR = 2, 32, 0.1


class ToyModel(nn.Module):
    """The DDP tutorial's model; ``delay`` seconds of extra forward time on a slow rank."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.net1, self.relu, self.net2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)  # the injected straggler
        return self.net2(self.relu(self.net1(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-ms", type=float, default=20.0)
    parser.add_argument("--out", default="runs/probe")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    torch.set_num_threads(1)
    # torch._dynamo, which the first optimizer imports, keeps references to a default group
    # alive when it is imported: before the group, so destroy_process_group ends gloo's
    # threads (examples/ddp_loop.py says why that matters)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1280, 10), torch.randn(1280, 5))
    model = ToyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    model.delay = args.slow_ms / 1e3 if rank == args.slow_rank else 0.0
    ddp = DDP(model)
    probe = StragglerProbe(args.out).watch(ddp)  # <- probe
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in probe.batches(loader):  # <- probe (was: for x, y in loader:)
            optimizer.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            optimizer.step()

    if rank == 0:
        named = probe.last.named() if probe.last else {}
        print(f"probe_ddp: {probe.steps} steps on {dist.get_world_size()} ranks, named {named}")
    dist.barrier()
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

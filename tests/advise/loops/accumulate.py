"""A DDP job with gradient accumulation: no_sync over the first M-1 micro-batches of a step."""

import os
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ACCUMULATE = 2


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 4), torch.randn(128, 2))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = nn.Linear(4, 2)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    steps = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % ACCUMULATE == 0
            with nullcontext() if last else ddp.no_sync():
                loss = F.mse_loss(ddp(x), y) / ACCUMULATE
                loss.backward()
            if last:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
    torch.save({"model": model.state_dict(), "steps": steps},
               os.path.join(sys.argv[1], f"rank{dist.get_rank()}.pt"))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A DDP job with one batch per step and a DistributedSampler (advise --for ddp's first shape)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 4), torch.randn(128, 2))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = nn.Linear(4, 2)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    steps = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(ddp(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
    torch.save({"model": model.state_dict(), "steps": steps},
               os.path.join(sys.argv[1], f"rank{dist.get_rank()}.pt"))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

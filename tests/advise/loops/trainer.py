"""A DDP job shaped like PyTorch's multi-GPU tutorial: a Trainer holding its model, optimizer
and loader as attributes, one batch per step."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Trainer:
    def __init__(self, model, data, optimizer):
        self.train_data = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, seed=0))
        self.model = DDP(model)
        self.optimizer = optimizer
        self.steps = 0

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        self.steps += 1

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def train(self, epochs):
        for epoch in range(epochs):
            self._run_epoch(epoch)


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 4), torch.randn(128, 2))
    model = nn.Linear(4, 2)
    trainer = Trainer(model, data, torch.optim.SGD(model.parameters(), lr=0.1))
    trainer.train(2)
    torch.save({"model": model.state_dict(), "steps": trainer.steps},
               os.path.join(sys.argv[1], f"rank{dist.get_rank()}.pt"))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A DDP training job as a user writes it: an MLP on scikit-learn's digits, torchrun, gloo.

Shaped on PyTorch's DDP tutorial series (``multigpu_torchrun.py`` in pytorch/examples,
distributed/ddp-tutorial-series): a ``Trainer`` with ``_run_batch`` / ``_run_epoch``,
``load_train_objs``, ``prepare_dataloader`` with a ``DistributedSampler``, ``env://`` set up by
torchrun; here gloo on CPU, no snapshots, and a seed so that two runs draw the same model and
the same batches. ``bench/bench_loop.py`` runs it unmodified, then with the probe's two lines
and the lines ``tailtrain advise`` prints, pasted by a program: it knows nothing of tailtrain.

    torchrun --nproc-per-node 2 bench/loop_job/multigpu_torchrun.py 10 --batch_size 32
"""

import argparse
import os

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer):
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.model = DDP(self.model)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        losses = []
        for source, targets in self.train_data:
            losses.append(self._run_batch(source, targets))
        if self.rank == 0:
            print(f"Epoch {epoch} | Steps: {len(losses)} | Loss: {sum(losses) / len(losses):.4f}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)


def load_train_objs(seed):
    x, y = load_digits(return_X_y=True)
    train_set = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
    torch.manual_seed(seed)  # the same initial model on every rank and in every run
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int, seed: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        sampler=DistributedSampler(dataset, seed=seed),
    )


def main(total_epochs, batch_size, seed):
    ddp_setup()
    dataset, model, optimizer = load_train_objs(seed)
    train_data = prepare_dataloader(dataset, batch_size, seed)
    trainer = Trainer(model, train_data, optimizer)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size per rank")
    parser.add_argument("--seed", default=0, type=int, help="Seed of the model and the batches")
    args = parser.parse_args()
    main(args.total_epochs, args.batch_size, args.seed)

"""A DDP job that accumulates gradients, as a user writes it: one function, no Trainer class.

The other loop shape ``tailtrain advise --for ddp`` names: an optimizer step every M loader
batches, the first M - 1 backwards under ``ddp.no_sync()`` so that DDP reduces once a step,
each loss divided by M. An MLP on scikit-learn's digits, torchrun's ``env://``, gloo on CPU,
a seed so that two runs draw the same model and the same batches. ``bench/bench_loop.py
--accumulate M`` runs it as it runs ``multigpu_torchrun.py``: unmodified, then with the
probe's two lines and the lines advise prints, pasted by a program.

    torchrun --nproc-per-node 2 bench/loop_job/accumulate_torchrun.py 10 --accumulate 4
"""

import argparse
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main(epochs: int, batch_size: int, seed: int, accumulate: int) -> None:
    dist.init_process_group("gloo")
    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    sampler = DistributedSampler(data, seed=seed)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total, seen = 0.0, 0
        for x, y in loader:
            seen += 1
            last = seen % accumulate == 0 or seen == len(loader)
            with nullcontext() if last else ddp.no_sync():
                loss = F.cross_entropy(ddp(x), y) / accumulate
                loss.backward()
            total += loss.item() * accumulate
            if last:
                optimizer.step()
                optimizer.zero_grad()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: mean loss {total / seen:.4f} over {seen} batches")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="DDP with gradient accumulation")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=4)
    args = parser.parse_args()
    main(args.epochs, args.batch_size, args.seed, args.accumulate)

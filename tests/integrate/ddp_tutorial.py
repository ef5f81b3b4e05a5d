"""The DDP job a user writes, with the DDP comm hook, that survives a node's death and heals it
under ``tailtrain launch --on-rank-loss shrink --restart-lost 1``: test_shrink_ddp.py runs it.

It is ``bench/loop_job/multigpu_torchrun.py`` (the shape of PyTorch's DDP tutorial,
``multigpu_torchrun.py``: a ``Trainer``, ``DistributedSampler(dataset)``, one batch a step)
with the comm hook's lines ``tailtrain advise --for ddp`` prints for DropCompute (the state,
``register_comm_hook``, the batch split in micro-batches, the guarded step), and three lines
for shrinking and healing, each marked ``# shrink``:

* ``import tailtrain``;
* ``tailtrain.init_process_group(backend="gloo")`` in place of torch's (a rank started again
  gets a stand-in default group of its job rank and world size);
* ``self.state.heal(self.model, self.optimizer)`` once the optimizer is built.

The ``DistributedSampler`` is the tutorial's, unchanged. What is marked ``# drill`` is the
test's, not the user's: one rank SIGKILLs itself inside a step, every rank paces its steps
until a record names the heal (a restart takes seconds) and ends ``--after-heal`` steps after
it, and each writes its records and final parameters to ``--out``.

    ddp_tutorial.py EPOCHS [--kill-rank R --kill-step S --after-heal K --pace SECONDS --out DIR]
"""

import argparse
import os
import signal  # drill
import time  # drill
from pathlib import Path  # drill

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.distributed import destroy_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import tailtrain  # shrink
from tailtrain import StragglerHookState, weighted_allreduce_hook

M = 2  # micro-batches a step (the hook's split of the batch)
#: drill: seconds a step from the kill until a record names the heal (a restart takes seconds)
PACE = 0.25


def ddp_setup():
    tailtrain.init_process_group(backend="gloo")  # shrink: was init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer, drill):
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.model = DDP(self.model)
        self.state = StragglerHookState("dropcompute")
        self.model.register_comm_hook(self.state, weighted_allreduce_hook)
        self.state.heal(self.model, self.optimizer)  # shrink
        self.drill, self.steps, self.records, self.end = drill, 0, [], None  # drill

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        batches = list(zip(source.chunk(M), targets.chunk(M), strict=True))
        loss = torch.tensor(float("nan"))  # a step may count none of its micro-batches
        for x, y in self.state.micro_batches(self.model, batches):
            self.kill_here()  # drill
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
        if not self.state.last.empty:  # no rank's gradient entered: no update
            self.optimizer.step()
        self.note(self.state.last)  # drill
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        losses = []
        for source, targets in self.train_data:
            losses.append(self._run_batch(source, targets))
            if self.over():  # drill
                break  # drill
        if self.rank == 0:
            print(f"Epoch {epoch} | Steps: {len(losses)} | Loss: {sum(losses) / len(losses):.4f}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if self.over():  # drill
                break  # drill

    # ---- drill ----------------------------------------------------------------------------------
    def kill_here(self) -> None:
        """The drill's rank dies inside its step (its first start only)."""
        rank, step = self.drill.kill_rank, self.drill.kill_step
        if self.rank == rank and self.steps == step and "TAILTRAIN_RESTART" not in os.environ:
            os.kill(os.getpid(), signal.SIGKILL)

    def note(self, record) -> None:
        """Keep the record; pace the steps from the kill until one names the heal, and end
        ``--after-heal`` steps after it (every rank reads it from the same record)."""
        self.steps += 1
        if record.skipped:  # a rank started again passes the steps taken before it joined
            return
        self.records.append(record.as_dict())
        if record.rejoined and self.end is None:
            self.end = record.step + 1 + self.drill.after_heal
        if self.drill.kill_rank is not None and self.steps > self.drill.kill_step:
            time.sleep(self.drill.pace if self.end is None else 0.0)

    def over(self) -> bool:
        return self.end is not None and self.steps >= self.end


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


def main(total_epochs, batch_size, seed, drill):
    ddp_setup()
    dataset, model, optimizer = load_train_objs(seed)
    train_data = prepare_dataloader(dataset, batch_size, seed)
    trainer = Trainer(model, train_data, optimizer, drill)
    trainer.train(total_epochs)
    if drill.out is not None:  # drill
        kept = {"records": trainer.records, "model": model.state_dict()}  # drill
        torch.save(kept, drill.out / f"rank{trainer.rank}.pt")  # drill
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size per rank")
    parser.add_argument("--seed", default=0, type=int, help="Seed of the model and the batches")
    parser.add_argument("--kill-rank", type=int, default=None)  # drill
    parser.add_argument("--kill-step", type=int, default=5)  # drill
    parser.add_argument("--after-heal", type=int, default=10)  # drill
    parser.add_argument("--pace", type=float, default=PACE)  # drill
    parser.add_argument("--out", type=Path, default=None)  # drill
    args = parser.parse_args()
    torch.set_num_threads(1)  # drill: four ranks on a shared machine
    main(args.total_epochs, args.batch_size, args.seed, args)

"""DropCompute in a Lightning ``Trainer``: one strategy line, ``accumulate_grad_batches`` as the
micro-batches.

Run: ``torchrun --nproc-per-node 2 examples/lightning_dropcompute.py`` (CPU, gloo, digits data;
``pip install 'tailtrain[lightning]'``). ``--plain`` runs Lightning's own DDP instead, for the
comparison; ``--strategy`` takes another spec (``dropcompute:drop-rate=0.1``, ...).

Without tailtrain::

    trainer = Trainer(accelerator="cpu", devices=2, accumulate_grad_batches=4,
                      strategy=DDPStrategy(process_group_backend="gloo"))

With tailtrain (the one line that changes)::

    trainer = Trainer(accelerator="cpu", devices=2, accumulate_grad_batches=4,
                      strategy=StragglerStrategy("dropcompute:threshold=auto",          # <-
                                                 process_group_backend="gloo"))

Each optimizer step, a rank stops starting micro-batches once the step is older than the
threshold tau (Algorithm 2 picks it after ``calibrate`` steps); the update is sum_n w_n G_n,
each rank's mean gradient over the micro-batches it finished, weighted by their number
(DropCompute Eq. (1)). ``strategy.last`` is the step's record, and ``tailtrain/drop_rate``,
``tailtrain/threshold``, ``tailtrain/completed/<rank>`` reach the trainer's loggers. Here
rank 1 is a straggler: a quarter of its micro-batches take ``--delay`` seconds longer.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tailtrain.lightning.strategy import StragglerStrategy

M, BATCH, LR = 4, 16, 0.3


class Digits(pl.LightningModule):
    def __init__(self, delay: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.delay = delay
        self.rng = np.random.default_rng(0)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.global_rank == 1 and self.rng.random() < 0.25:
            time.sleep(self.delay)  # the straggler's occasional slow micro-batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


def digits() -> tuple[TensorDataset, tuple[torch.Tensor, torch.Tensor]]:
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    return TensorDataset(x[:1500], y[:1500]), (x[1500:], y[1500:])


class Report(pl.Callback):
    """Rank 0 prints each step's record and, at the end, the run's summary."""

    def __init__(self) -> None:
        self.began, self.steps = 0.0, 0

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.began = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.steps:
            return
        self.steps = trainer.global_step
        last = getattr(trainer.strategy, "last", None)
        if trainer.is_global_zero and last is not None:
            print(
                f"step {last.step:3d}  tau {last.threshold:7.4f} s  completed {last.completed}"
                f"  weights {[round(w, 3) for w in last.weights]}  drop {last.drop_rate:.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="dropcompute:threshold=auto,calibrate=10")
    parser.add_argument("--plain", action="store_true", help="Lightning's own DDPStrategy")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--delay", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.plain:
        strategy: DDPStrategy = DDPStrategy(process_group_backend="gloo")
    else:
        strategy = StragglerStrategy(args.strategy, process_group_backend="gloo")
    train, (x_test, y_test) = digits()
    report = Report()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=args.steps,
        accumulate_grad_batches=M, callbacks=[report], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = Digits(args.delay)
    trainer.fit(module, DataLoader(train, batch_size=BATCH, shuffle=True))
    seconds = (time.perf_counter() - report.began) / args.steps
    if trainer.is_global_zero:
        accuracy = (module.net(x_test).argmax(1) == y_test).float().mean().item()
        records = list(getattr(strategy, "records", []))
        drop = float(np.mean([r.drop_rate for r in records])) if records else 0.0
        name = "ddp" if args.plain else strategy.rule.describe()  # type: ignore[attr-defined]
        print(
            f"lightning_dropcompute: {args.steps} steps on 2 ranks under {name}, "
            f"drop rate {drop:.2f}, {seconds * 1e3:.1f} ms/step, test accuracy {accuracy:.2f}"
        )


if __name__ == "__main__":
    main()

"""Who is slow in my Lightning job? One callback in ``Trainer(callbacks=[...])``.

Run (CPU, gloo, the digits data), with Lightning starting the two processes itself::

    python examples/lightning_probe.py --slow-rank 1

or under torchrun, which Lightning joins::

    torchrun --nproc-per-node 2 examples/lightning_probe.py --slow-rank 1

then ``tailtrain advise runs/lightning_probe --for lightning``. The LightningModule and the Trainer
are plain; the probe is the line marked ``# <- probe``. Per rank and optimizer step it measures
the data time, the compute, the wait in DDP's allreduce and the samples; about every 2 seconds
(the first time after 10 steps, the last at the end of training) rank 0 logs each rank's score
and verdict, hands them to the trainer's loggers (here the CSV logger, in
``runs/lightning_probe/csv``) and appends to ``runs/lightning_probe/trace.csv``.
``--slow-rank R`` makes rank R's training step ``--slow-ms`` (20) milliseconds slower, as a
slower GPU would.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tailtrain.lightning import StragglerProbeCallback

STEPS, BATCH, LR = 40, 32, 0.3


class Digits(LightningModule):
    """A two-layer classifier of the 8x8 digits; ``delay`` seconds more per training step."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.delay = delay

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)  # the injected straggler
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


def digits() -> tuple[torch.Tensor, ...]:
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-ms", type=float, default=20.0)
    parser.add_argument("--out", default="runs/lightning_probe")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    torch.set_num_threads(1)
    x, y, x_test, y_test = digits()
    probe = StragglerProbeCallback(args.out)  # <- probe
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS,
        callbacks=[probe],  # <- probe
        logger=CSVLogger(args.out, name="csv"), log_every_n_steps=10,
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
    )  # fmt: skip
    # the processes exist from here (Lightning's launcher started them in ``Trainer``)
    model = Digits(args.slow_ms / 1e3 if trainer.global_rank == args.slow_rank else 0.0)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    trainer.fit(model, loader)

    if trainer.global_rank == 0:
        with torch.no_grad():
            accuracy = (model.net(x_test).argmax(1) == y_test).float().mean().item()
        named = probe.report.named() if probe.report else {}
        print(
            f"lightning_probe: {trainer.global_step} steps on {trainer.world_size} ranks, "
            f"named {named}, test accuracy {accuracy:.3f}"
        )


if __name__ == "__main__":
    main()

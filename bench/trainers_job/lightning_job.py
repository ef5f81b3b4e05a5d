"""The Lightning job of ``bench/bench_trainers.py``: a ``LightningModule`` on the digits under
Lightning's DDP, gloo, CPU, ``accumulate_grad_batches`` = M micro-batches of MICRO samples.

    torchrun --nproc-per-node 2 bench/trainers_job/lightning_job.py --mode ddp --steps 100

``--mode ddp``: Lightning's own ``DDPStrategy``; ``probe``: the same with
``StragglerProbeCallback(--probe-dir)`` in its callbacks (the one line a user adds);
``straggler``: ``StragglerStrategy(--spec)`` in place of ``DDPStrategy`` (the one line that
changes). The injected law and the per-step log are ``common``'s; the step log is a callback
listed first, so the probe's own hooks run after it.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn.functional as F
from bench.trainers_job.common import LR, MICRO, Work, digits, model
from bench.trainers_job.common import M as MICRO_BATCHES
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from tailtrain.lightning import StragglerProbeCallback, StragglerStrategy


class Digits(LightningModule):
    def __init__(self, work: Work) -> None:
        super().__init__()
        self.net = model()
        self.work = work

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.work(self.net, x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


class StepLog(Callback):
    """A row of ``Work``'s log at the batch that advanced ``global_step`` (an optimizer step)."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.seen = 0

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self.seen:
            return
        self.seen = trainer.global_step
        self.work.step_end(getattr(trainer.strategy, "last", None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["ddp", "probe", "straggler"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--spec", default="dropcompute:drop-rate=0.25,calibrate=10")
    parser.add_argument("--probe-dir", default=None)
    parser.add_argument("--step-log", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Work.from_env()
    callbacks: list[Callback] = [StepLog(work)]
    if args.mode == "straggler":
        strategy: DDPStrategy = StragglerStrategy(args.spec, process_group_backend="gloo")
    else:
        strategy = DDPStrategy(process_group_backend="gloo")
    if args.mode == "probe":
        callbacks.append(StragglerProbeCallback(args.probe_dir))
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=args.steps,
        accumulate_grad_batches=MICRO_BATCHES, callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    loader = DataLoader(digits(), batch_size=MICRO, shuffle=True, drop_last=True)
    trainer.fit(Digits(work), loader)
    work.write(args.step_log)


if __name__ == "__main__":
    main()

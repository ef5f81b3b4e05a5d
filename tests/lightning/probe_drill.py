"""The probe callback's drill, one rank of two under ``torch.distributed.run`` (CPU, gloo): rank
1 sleeps ``SLOW`` seconds in every ``training_step`` of a tiny LightningModule (which computes
in well under a millisecond). In the same two processes, one after the other:

* ``ddp``: ``Trainer(strategy=DDPStrategy("gloo"))`` with the callback, ``STEPS`` steps,
  a report every 8 steps, a ``CSVLogger``;
* ``accumulate``: the same with ``accumulate_grad_batches=2``, ``ACCUMULATED`` optimizer steps;
* ``plain``: the same model and delay in a plain DDP loop with ``StragglerProbe``'s own two
  lines (``watch``, ``batches``), the verdict the callback should repeat.

Each rank writes ``rank{r}.json`` in the folder given: per run its last report (None on rank 1)
the probe's entries of ``trainer.callback_metrics`` and the gradient hooks left on the module.

Run: ``python -m torch.distributed.run --nproc-per-node 2 tests/lightning/probe_drill.py DIR``
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tailtrain.integrate.probe import StragglerProbe
from tailtrain.lightning import StragglerProbeCallback

N, STEPS, ACCUMULATED, BATCH, SLOW, EVERY = 2, 24, 8, 8, 0.04, 8
DATA = TensorDataset(
    torch.randn(STEPS * N * BATCH, 6, generator=torch.Generator().manual_seed(0)),
    torch.randn(STEPS * N * BATCH, 2, generator=torch.Generator().manual_seed(1)),
)


def network() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


class Drill(LightningModule):
    """A two-layer regression; ``delay`` seconds of sleep in every training step."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.net, self.delay = network(), delay

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(self.delay)
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(folder: Path, name: str, delay: float, steps: int, accumulate: int) -> dict[str, Any]:
    callback = StragglerProbeCallback(folder / name, every=EVERY // accumulate)
    trainer = Trainer(
        accelerator="cpu", devices=N, max_steps=steps, accumulate_grad_batches=accumulate,
        strategy=DDPStrategy(
            process_group_backend="gloo", timeout=datetime.timedelta(seconds=60)
        ),
        logger=CSVLogger(folder, name=f"csv_{name}", version=0), log_every_n_steps=1,
        callbacks=[callback], enable_progress_bar=False, enable_checkpointing=False,
        enable_model_summary=False,
    )  # fmt: skip
    module = Drill(delay)
    trainer.fit(module, DataLoader(DATA, batch_size=BATCH))
    return {
        "report": None if callback.report is None else callback.report.as_dict(),
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if "probe" in k},
        "global_step": trainer.global_step,
        # the probe's gradient hooks left on the module after the fit (torch's own table)
        "hooked": sum(len(p._post_accumulate_grad_hooks or ()) for p in module.parameters()),
    }


def plain(folder: Path, rank: int, delay: float) -> dict[str, Any]:
    """The same model and delay in a plain DDP loop with the probe's two lines."""
    ddp = DistributedDataParallel(network())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sampler = DistributedSampler(DATA, num_replicas=N, rank=rank, shuffle=True, seed=0)
    probe = StragglerProbe(folder / "plain", every=EVERY).watch(ddp)
    for x, y in probe.batches(DataLoader(DATA, batch_size=BATCH, sampler=sampler)):
        time.sleep(delay)
        optimizer.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        optimizer.step()
    return {"report": None if probe.last is None else probe.last.as_dict()}


def main() -> None:
    folder = Path(sys.argv[1])
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    delay = SLOW if rank == 1 else 0.0
    out = {
        "ddp": fit(folder, "ddp", delay, STEPS, 1),
        "accumulate": fit(folder, "accumulate", delay, ACCUMULATED, 2),
        "plain": plain(folder, rank, delay),
    }
    (folder / f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

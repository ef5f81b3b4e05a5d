"""The two-rank job behind tests/lightning/test_strategy.py (run under torchrun, gloo, CPU).

One process group, four ``Trainer.fit`` runs of the same tiny LightningModule with
``accumulate_grad_batches=ACCUMULATE``, each saving per optimizer step the parameters, the
indices of the step's micro-batches on this rank and the strategy's ``StepRecord``:

* ``auto``: ``StragglerStrategy(AUTO)``, rank ``SLOW_RANK`` sleeping ``DELAY`` s in every
  micro-batch (it dominates the milliseconds of compute, so the threshold's decisions do not
  depend on the machine); its checkpoint is saved;
* ``resume``: the same spec resumed from that checkpoint for ``RESUMED`` more steps;
* ``ddp``: Lightning's own ``DDPStrategy``, no delay;
* ``inf``: ``StragglerStrategy("dropcompute:threshold=inf")``, no delay;
* ``shares``: ``StragglerStrategy("rebalance", shares=SHARES)``, no delay;
* ``scaled-ddp`` / ``scaled``: ``DDPStrategy`` / ``StragglerStrategy("dropcompute:threshold=inf")``
  under ``16-mixed`` with a ``GradScaler`` (on the CPU: ``MixedPrecision``'s plugin given),
  rank ``SLOW_RANK``'s loss infinite in the first optimizer step (an overflow).

Rank r saves ``rank{r}.pt`` in the folder given as the first argument.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tailtrain.lightning.strategy import StragglerStrategy

N, ACCUMULATE, B, STEPS, RESUMED = 2, 4, 8, 10, 2
D, C, LR, MOMENTUM = 8, 3, 0.1, 0.5
AUTO = "dropcompute:threshold=auto,calibrate=3"
SLOW_RANK, DELAY = 1, 0.04
#: ``rebalance``'s samples per step for each rank (sum N B)
SHARES = [12, 4]
#: the GradScaler's initial scale in the ``scaled`` runs (halved by the first step's overflow)
SCALE = 2.0**10
SAMPLES = N * ACCUMULATE * B * STEPS  # one epoch is STEPS optimizer steps
X = torch.randn(SAMPLES, D, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, C, (SAMPLES,), generator=torch.Generator().manual_seed(1))


def make_net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, C))


def flat(net: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).clone()


class Tiny(pl.LightningModule):
    def __init__(self, delay: float = 0.0, overflow: bool = False) -> None:
        super().__init__()
        self.net = make_net()
        self.delay = delay
        self.overflow = overflow

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        if self.delay and self.global_rank == SLOW_RANK:
            time.sleep(self.delay)
        loss = F.cross_entropy(self.net(x), y)
        if self.overflow and self.global_rank == SLOW_RANK and self.global_step == 0:
            return loss * torch.inf
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(X, Y, torch.arange(SAMPLES)), batch_size=B)


class Steps(pl.Callback):
    """Per optimizer step: parameters, this rank's micro-batch indices, the record."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.window: list[list[int]] = []
        self.started = 0.0
        self.seen = 0

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.started = time.perf_counter()
        self.seen = trainer.global_step

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self.window.append(batch[2].tolist())

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.seen:  # no optimizer step after this batch
            return
        self.seen = trainer.global_step
        last = getattr(trainer.strategy, "last", None)
        self.steps.append(
            {
                "params": flat(module.net),
                "batches": self.window,
                "record": None if last is None else last.as_dict(),
            }
        )
        self.window = []


class Kept(Logger):
    """The metrics a trainer's logger receives, kept in memory (on every rank: Lightning's
    own loggers write on rank 0 only)."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "kept"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append((step, dict(metrics)))


def fit(
    strategy: Any, delay: float, steps: int, ckpt: Path | None = None, scaled: bool = False
) -> dict[str, Any]:
    steps_cb, kept = Steps(), Kept()
    plugins = []
    if scaled:  # Lightning's 16-mixed with a GradScaler, given as a plugin on the CPU
        plugins.append(MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", SCALE)))
    trainer = pl.Trainer(
        accelerator="cpu", devices=N, strategy=strategy, max_steps=steps,
        accumulate_grad_batches=ACCUMULATE, callbacks=[steps_cb], logger=kept,
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, plugins=plugins,
    )  # fmt: skip
    module = Tiny(delay, overflow=scaled)
    began = time.perf_counter()
    trainer.fit(module, ckpt_path=None if ckpt is None else str(ckpt))
    seconds = time.perf_counter() - began
    out: dict[str, Any] = {"steps": steps_cb.steps, "seconds": seconds}
    out["train_seconds"] = time.perf_counter() - steps_cb.started
    if isinstance(strategy, StragglerStrategy) and strategy.state is not None:
        out["buckets_reduced"] = strategy.state.buckets_reduced
        out["state"] = strategy.state.state_dict()
        out["metrics"] = [(step, m) for step, m in kept.metrics if "tailtrain/drop_rate" in m]
    if scaled:
        out["scale"] = trainer.precision_plugin.scaler.get_scale()
        out["initial"] = flat(make_net())
    if isinstance(strategy, StragglerStrategy):
        out["on_nonfinite"] = strategy.on_nonfinite
    out["trainer"] = trainer
    return out


def main(folder: Path) -> None:
    torch.set_num_threads(1)
    runs: dict[str, Any] = {}
    runs["auto"] = fit(StragglerStrategy(AUTO, process_group_backend="gloo"), DELAY, STEPS)
    ckpt = folder / "auto.ckpt"
    runs["auto"].pop("trainer").save_checkpoint(ckpt)
    resumed = StragglerStrategy(AUTO, process_group_backend="gloo")
    runs["resume"] = fit(resumed, DELAY, STEPS + RESUMED, ckpt)
    runs["resume"].pop("trainer")
    runs["ddp"] = fit(DDPStrategy(process_group_backend="gloo"), 0.0, STEPS)
    runs["ddp"].pop("trainer")
    inf = StragglerStrategy("dropcompute:threshold=inf", process_group_backend="gloo")
    runs["inf"] = fit(inf, 0.0, STEPS)
    runs["inf"].pop("trainer")
    dealt = StragglerStrategy("rebalance", shares=SHARES, process_group_backend="gloo")
    runs["shares"] = fit(dealt, 0.0, STEPS)
    runs["shares"].pop("trainer")
    runs["scaled-ddp"] = fit(DDPStrategy(process_group_backend="gloo"), 0.0, STEPS, scaled=True)
    runs["scaled-ddp"].pop("trainer")
    inf = StragglerStrategy("dropcompute:threshold=inf", process_group_backend="gloo")
    runs["scaled"] = fit(inf, 0.0, STEPS, scaled=True)
    runs["scaled"].pop("trainer")
    torch.save(runs, folder / f"rank{dist.get_rank()}.pt")
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

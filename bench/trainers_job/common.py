"""What the three jobs of ``bench/bench_trainers.py`` share: the data, the model, the injected
law and the per-step log, so that a Lightning run and an own loop differ only in the loop.

* **data**: scikit-learn's digits, the first :data:`TRAIN` samples (a multiple of 2 ranks x
  :data:`M` micro-batches x :data:`MICRO` samples, so every epoch ends on a whole step), in
  micro-batches of :data:`MICRO` samples, :data:`M` of them per optimizer step and rank.
* **model**: a 64-64-10 MLP drawn from seed 0 on every rank and in every job.
* **the law** (env :data:`LAW_ENV`, JSON ``{"d": s, "factors": [...], "chunk": C, "noise":
  spec or null, "noisy": [ranks] or null, "seed": k}``): ``bench/loop_job/inject.py``'s
  ``Injector`` (the DDP bench's law), called by the job itself around each forward: sample k
  of this rank's stream sleeps ``d X_rank (1 + e_{k // C})``, ``e`` the rank's own noise
  stream seeded by ``(seed, rank)``; ``noisy`` limits the noise to those ranks (null: all, as
  in ``bench_loop``). The sleep is proportional to the work, so a micro-batch DropCompute cuts
  costs nothing and the law is the same in every job.
* **the log** (``--step-log PATH``; ``PATH.RANK.jsonl`` at exit): per optimizer step, the wall
  clock at its end, the samples this rank forwarded since the previous step and, under a
  DropCompute rule, the step record's ``completed`` (every rank's counted micro-batches) and
  ``threshold`` (tau in force, inf while calibrating).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
from bench.loop_job.inject import Injector
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

LAW_ENV = "BENCH_TRAINERS_LAW"  #: the injected law, JSON (module docstring)
TRAIN = 1792  #: training samples: 2 ranks x 28 steps x M x MICRO
MICRO = 8  #: samples per micro-batch (the law's chunk: one noise draw per micro-batch)
M = 4  #: micro-batches per optimizer step and rank (``accumulate_grad_batches``)
LR = 0.1
SEED = 0


def digits() -> TensorDataset:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x[:TRAIN] / 16.0, dtype=torch.float32)
    return TensorDataset(x, torch.tensor(y[:TRAIN]))


def model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Work:
    """This rank's injected law and its per-step log (module docstring)."""

    def __init__(self, law: dict[str, Any], rank: int) -> None:
        noisy = law.get("noisy")
        if noisy is not None and rank not in noisy:
            law = {**law, "noise": None}
        self.injector = Injector(law, rank)
        self.rank = rank
        self.samples = 0  # forwarded since the last optimizer step
        self.rows: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    @classmethod
    def from_env(cls) -> Work:
        return cls(json.loads(os.environ.get(LAW_ENV, "{}")), rank())

    def __call__(self, net: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``net(x)`` after the law's sleep for ``len(x)`` samples of this rank's stream."""
        samples = int(x.shape[0])
        self.samples += samples
        if self.injector.scale > 0:
            time.sleep(self.injector.delay(samples))
        return net(x)

    def step_end(self, record: Any = None) -> None:
        """An optimizer step ended: its row (module docstring), with the ``StepRecord``'s
        ``completed`` and ``threshold`` under a rule."""
        row = {"t": time.perf_counter(), "samples": self.samples, "completed": None}
        if record is not None:
            row |= {"completed": list(record.completed), "threshold": float(record.threshold)}
        self.rows.append(row)
        self.samples = 0

    def write(self, log: str | None) -> None:
        if not log:
            return
        with open(f"{log}.{self.rank}.jsonl", "w") as f:
            f.write(json.dumps({"started": self.started, "rank": self.rank}) + "\n")
            f.writelines(json.dumps(row) + "\n" for row in self.rows)


def steps_of(loader: DataLoader, sampler: DistributedSampler, steps: int) -> Iterator[list[Any]]:
    """``steps`` optimizer steps of M micro-batches each, epoch after epoch (``set_epoch``)."""
    done, epoch = 0, 0
    while True:
        sampler.set_epoch(epoch)
        batches = iter(loader)
        while True:
            group = [b for _, b in zip(range(M), batches, strict=False)]
            if len(group) < M:
                break
            yield group
            done += 1
            if done == steps:
                return
        epoch += 1


def own_loader(world: int, rank: int) -> tuple[DataLoader, DistributedSampler]:
    """The own loops' loader: what Lightning builds for its ``DataLoader(shuffle=True)`` under
    DDP (a ``DistributedSampler`` of seed 0, micro-batches of MICRO)."""
    data = digits()
    sampler = DistributedSampler(data, world, rank, shuffle=True, seed=SEED, drop_last=True)
    return DataLoader(data, batch_size=MICRO, sampler=sampler, drop_last=True), sampler

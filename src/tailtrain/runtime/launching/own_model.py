"""Your own model on the parameter-server topology: plain callables in, a trained model out.

The user's entry is ``tailtrain.train_own_model`` (``tailtrain.face``), which parses the
strategy as every entry does and hands back a ``RunRecord``; this module runs the job:

    record = tailtrain.train_own_model(
        model=lambda: torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(),
                                          torch.nn.Linear(32, 3)),
        loss=torch.nn.functional.cross_entropy,
        data=lambda: (x_train, y_train, x_test, y_test),
        strategy="dbw", workers=4, iterations=100, delay="shifted-exp:shift=0.01,scale=0.02",
    )
    record.theta  # the final parameters, flat (``vector_to_parameters`` loads them)

``model()`` builds the ``nn.Module`` (called on every rank under a seeded generator, so every
rank starts from the same parameters), ``loss(output, target)`` is the mean loss of a batch,
and ``data()`` returns ``(x_train, y_train)`` or ``(x_train, y_train, x_test, y_test)``
tensors. The server, the workers, the rule (DBW, K-sync, LGC, ...) and the protocol are
``runtime.ps``'s; worker w's j-th job sees mini-batch (seed, w, j) of the training set, drawn
as everywhere else (``tasks.stream``). Locally the ranks start from the fork server where
the callables are the script's top-level functions and it has a ``__main__`` block, else they
fork from the launching process (``launching.launch.reaches_fork_server``); under torchrun
every rank runs your script and passes its own.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from tailtrain.core.records import RUN_FILES, TRAIN_EXTRA, held_run
from tailtrain.core.scenario import Scenario
from tailtrain.errors import UsageError
from tailtrain.runtime.config import RankResult, TrainConfig
from tailtrain.runtime.launching.checks import in_torchrun
from tailtrain.runtime.launching.endpoint import check_rendezvous, parse_endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.runtime.launching.rank_entry import rank_entry
from tailtrain.runtime.ps.server import train_parameter_server
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Strategy, Topology
from tailtrain.tasks.task import TRAIN_EVAL_SIZE


class OwnTask:
    """A user's model, loss and data behind the task interface the runtime uses
    (``init_params``, ``grads``, ``evaluate``, ``dim``, ``batch_size``, ``n_train``)."""

    metric_name = "loss"
    n_classes = None

    def __init__(
        self,
        model: Callable[[], nn.Module],
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        data: Callable[[], tuple[torch.Tensor, ...]],
        batch_size: int,
        seed: int,
    ) -> None:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.model = model()
        self.loss = loss
        tensors = data()
        if len(tensors) not in (2, 4):
            raise UsageError("data() must return (x_train, y_train) or (x, y, x_test, y_test)")
        self.x, self.y = tensors[0], tensors[1]
        self.x_test, self.y_test = (tensors[2], tensors[3]) if len(tensors) == 4 else (None, None)
        self.params = list(self.model.parameters())
        self.theta0 = parameters_to_vector(self.params).detach().clone()
        self.batch_size = batch_size

    has_model = True

    @property
    def dim(self) -> int:
        return self.theta0.numel()

    @property
    def n_train(self) -> int:
        return len(self.x)

    def train_labels(self) -> None:
        return None  # only the iid and shared partitions, which need no labels

    def init_params(self, seed: int) -> torch.Tensor:
        del seed  # the model was built under the run's seed
        return self.theta0.clone()

    def module_at(self, theta: torch.Tensor) -> nn.Module:
        vector_to_parameters(theta.detach(), self.params)
        return self.model

    def grads(self, theta: torch.Tensor, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss (1,) and gradient (1, D) over the one batch of ``indices`` (1, B)."""
        idx = torch.as_tensor(np.asarray(indices).reshape(-1), dtype=torch.int64)
        model = self.module_at(theta)
        loss = self.loss(model(self.x[idx]), self.y[idx])
        grads = torch.autograd.grad(loss, self.params)
        flat = torch.cat([g.reshape(-1) for g in grads])
        return loss.detach().reshape(1), flat[None]

    def evaluate(self, theta: torch.Tensor) -> dict[str, float]:
        model = self.module_at(theta)
        with torch.no_grad():
            sub = slice(0, min(self.n_train, TRAIN_EVAL_SIZE))
            train = float(self.loss(model(self.x[sub]), self.y[sub]))
            test = math.nan
            if self.x_test is not None:
                test = float(self.loss(model(self.x_test), self.y_test))
        return {"train_loss": train, "eval": test, "eval_loss": test}


def train_own_model(
    model: Callable[[], nn.Module],
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: Callable[[], tuple[torch.Tensor, ...]],
    *,
    strategy: Strategy,
    workers: int = 4,
    batch_size: int = 32,
    lr: float = 0.1,
    iterations: int | None = None,
    time_budget: float | None = None,
    delay: str | None = None,
    pattern: str = "iid",
    seed: int = 0,
    timeout: float = 120.0,
    out: str | Path | None = None,
    endpoint: str = "127.0.0.1:0",
) -> RankResult:
    """The job ``tailtrain.train_own_model`` describes (its arguments; ``strategy`` parsed
    there): the server's result, or under torchrun this rank's, holding the server's record
    (``runtime.launching.rank_entry.lead_records``)."""
    out = None if out is None else Path(out)
    if strategy.topology is not Topology.PARAMETER_SERVER:
        raise UsageError(
            f"strategy {strategy.describe()!r} runs on the {strategy.topology} topology, not on a "
            f"parameter server; try dbw, or k-sync:k={workers} for synchronous steps"
        )
    if iterations is None and time_budget is None:
        iterations = 100
    scenario = Scenario(
        task="own-model",
        workers=workers,
        delay=delay or "const:value=0",
        pattern=pattern,
        lr=lr,
        iterations=iterations,
        time_budget=time_budget,
    )
    if out is not None and not in_torchrun():  # a new run: never the old one's checkpoint
        held = held_run(Path(out), (*RUN_FILES, *TRAIN_EXTRA))
        if held:
            raise UsageError(f"out={str(out)!r} already holds a run ({held[0]}); give a new folder")
    inject = delay is not None
    config = TrainConfig(scenario, strategy, seed, inject, timeout=timeout, out=out)
    entry = functools.partial(own_entry, (model, loss, data, batch_size))
    if in_torchrun():
        check_rendezvous(os.environ, timeout)
        return rank_entry([config], False, entry)[0]
    return launch([config], reserve(parse_endpoint(endpoint)), entry)[0][0]


def own_entry(factories: tuple[Any, ...], config: TrainConfig, comm: Collectives) -> RankResult:
    """One rank: build the user's task from the factories, then serve or work."""
    model, loss, data, batch_size = factories
    task = OwnTask(model, loss, data, batch_size, config.seed)
    return train_parameter_server(config, comm, task=task)

"""Real gradients for allreduce rounds: micro-batch data, local steps and the weighted average.

Worker n's units in round r are micro-batches of ``task.batch_size`` samples from
``tasks.stream.job_batches`` keyed by (seed, n, r), the stream the parameter-server engine
uses for worker n's r-th job, so with one micro-batch and no drops the two engines see the same
data. Only completed micro-batches are ever differentiated: those of one local step go to one
batched ``torch.func`` call (shared parameters at the first local step, each worker's own copy
after it).

A round with H local steps of M micro-batches (DropCompute Eq. 1 with Algorithm 1; Local-SGD
as in DropCompute App. B.3), c_{n,h} of worker n's micro-batches done in local step h:

* local model: theta_n <- theta_n - lr * (1/M) * sum of its c_{n,h} micro-batch gradients;
* worker gradient: G_n = H * A_n / C_n, A_n the sum of all its micro-batch gradients, C_n their
  number, so that for H = 1 G_n is the mean over its completed micro-batches' samples;
* update: theta <- theta - lr * sum_n w_n G_n with the rule's weights w (``select``).

With w_n = (C_n / (H M)) / N this is the average of the local models (DropCompute's
divide-by-M normalisation; plain sync SGD when nothing is dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tailtrain.core.update import GradientStats, WeightedUpdate, gradient_stats
from tailtrain.strategies.base import Selection
from tailtrain.topology.allreduce import RoundData, worker_grads


@dataclass(frozen=True)
class RoundWork:
    """Worker gradients G (N, D), the units done (N,) and the losses of the computed units."""

    grads: torch.Tensor
    done: np.ndarray
    losses: torch.Tensor

    def stats(
        self, finite: np.ndarray | None = None, sq_sum: float | None = None, moments: bool = True
    ) -> GradientStats:
        """Mean loss of the computed units, sum_n ||G_n||^2 and ||mean_n G_n||^2 over the
        workers that computed; ``finite``: which rows of G are finite, if known; ``sq_sum``:
        sum_n ||G_n||^2 over every row of G, if known (the update's screen computed it);
        ``moments`` False: the loss only (``gradient_stats``)."""
        active = self.done > 0
        if not active.any():
            return GradientStats()
        if active.all():  # no copy of G
            return gradient_stats(self.losses, self.grads, finite, sq_sum, moments=moments)
        ok = None if finite is None else finite[active]
        grads = self.grads[torch.from_numpy(active)]
        return gradient_stats(self.losses, grads, ok, moments=moments)


class RoundLearner(RoundData):
    """Round data and the gradient work of all N workers at once, vectorised (the
    simulator's; a runtime rank computes its own, ``runtime.units``)."""

    def __init__(self, task, partition_state, lr: float, seed: int, n_workers: int) -> None:
        super().__init__(task, partition_state, lr, seed, n_workers)
        self.update = WeightedUpdate(lr)

    def work(
        self,
        batches: np.ndarray,
        done: np.ndarray,
        micro_batches: int,
        local_steps: int,
        lr_scale: float,
    ) -> RoundWork:
        """Run the round's local steps over the completed micro-batches only."""
        n, dim = len(done), self.task.dim
        total = torch.zeros(n, dim)  # stays so only when no worker completed a unit
        local: torch.Tensor | None = None
        losses = []
        for step in range(local_steps):
            owner, unit = completed_rows(done, step, micro_batches)
            if owner.size == 0:
                break
            loss, grads = self._grads(local, owner, batches[owner, unit])
            if owner.size == n and bool((owner == np.arange(n)).all()):
                summed = grads  # one unit per worker, in order (the common round): no scatter
            else:
                summed = torch.zeros(n, dim).index_add_(0, torch.from_numpy(owner), grads)
            total = summed if step == 0 else total + summed
            if step + 1 < local_steps:
                start = self.theta.expand(n, dim) if local is None else local
                local = start - self.lr * lr_scale * summed / micro_batches
            losses.append(loss)
        return RoundWork(worker_grads(total, done, local_steps), done, _cat(losses))

    def _grads(
        self, local: torch.Tensor | None, owner: np.ndarray, indices: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One batched call: at the shared parameters, or at each owner's local copy."""
        if local is None:
            return self.task.grads(self.theta, indices)
        return self.task.grads_multi(local[torch.from_numpy(owner)], indices)

    def apply(
        self, selection: Selection, keys: np.ndarray, work: RoundWork, lr_scale: float
    ) -> None:
        """theta <- theta - lr * sum_n w_n G_n (the hivemind-style weighted allreduce), plus
        any deferred term (``tailtrain.core.update``); ``keys`` are the workers' arrival keys."""
        self.theta = self.update.apply(self.theta, work.grads, keys, selection, lr_scale)


def completed_rows(done: np.ndarray, step: int, micro_batches: int) -> tuple[np.ndarray, ...]:
    """(worker, unit) of every micro-batch completed in local step ``step``, worker-major."""
    count = np.clip(done - step * micro_batches, 0, micro_batches)
    owner = np.repeat(np.arange(done.size), count)
    first = np.repeat(np.cumsum(count) - count, count)
    return owner, step * micro_batches + np.arange(owner.size) - first


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0)

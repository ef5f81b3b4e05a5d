"""Real gradients for the simulator: model versions, mini-batches and weighted updates.

Only gradients that enter an update are computed, and those of workers that share a model
version come from one batched ``torch.func`` call (``Task.grads``). Worker w's j-th job always
sees the same mini-batch for a given seed, so strategies compare on the same data too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tailtrain.core.update import GradientStats, WeightedUpdate, gradient_stats, rows_weighed
from tailtrain.strategies.base import ArrivalColumns, Selection
from tailtrain.tasks.stream import JobDraws


class Trainer:
    """Holds the model versions still referenced and applies ``Selection``s to them."""

    def __init__(self, task, partition_state, lr: float, seed: int) -> None:
        self.task = task
        self.partition = partition_state
        self.seed = seed
        self.versions: dict[int, torch.Tensor] = {0: task.init_params(seed)}
        self.update = WeightedUpdate(lr)
        # mini-batches drawn a block of jobs at a time (not checkpointed: rebuilt alike)
        self.drawn = JobDraws(partition_state, seed, task.batch_size, partition_state.n_workers)

    @classmethod
    def of(cls, world) -> Trainer:
        """The trainer of a ``core.scenario.World`` with a model."""
        return cls(world.task, world.partition, world.lr, world.seed)

    def batch(self, worker: int, job: int) -> np.ndarray:
        """The mini-batch (train indices) of ``worker``'s ``job``-th job."""
        return self.batches(np.array([worker]), np.array([job]))[0]

    def batches(self, workers: np.ndarray, jobs: np.ndarray) -> np.ndarray:
        """Mini-batches (R, B) of the jobs ``(workers[r], jobs[r])``."""
        return self.drawn.batches(workers, jobs)

    def _grads(self, arrivals: ArrivalColumns) -> tuple[torch.Tensor, torch.Tensor]:
        """Losses and gradients of ``arrivals``, each over its ``units`` of the batch."""
        versions, units = arrivals.version, arrivals.units
        # the common case: one version, whole batches; no key columns to build and compare
        if len(versions) and (versions == versions[0]).all() and (units == 1).all():
            return self._group_grads(arrivals, slice(None), (int(versions[0]), BLOCK_SCALE))
        blocks = np.round(units * BLOCK_SCALE).astype(np.int64)
        keys = np.stack([versions, blocks], axis=1)
        # one version, equal parts of the batch: no copy (and no np.unique over rows)
        if len(keys) and (keys == keys[0]).all():
            return self._group_grads(arrivals, slice(None), keys[0])
        groups = np.unique(keys, axis=0)
        dtype = self.versions[int(versions[0])].dtype
        losses = torch.empty(len(keys), dtype=dtype)
        grads = torch.empty(len(keys), self.task.dim, dtype=dtype)
        for key in groups:
            where = np.flatnonzero((keys == key).all(axis=1))
            losses[where], grads[where] = self._group_grads(arrivals, where, key)
        return losses, grads

    def _group_grads(
        self, arrivals: ArrivalColumns, rows: np.ndarray | slice, key: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One batched call: jobs that share a model version and a number of blocks
        (``key``: the version and the blocks in ``BLOCK_SCALE``)."""
        batch = self.batches(arrivals.worker[rows], arrivals.job[rows])
        if key[1] != BLOCK_SCALE:  # partial work: the first blocks of the batch
            batch = batch[:, : max(1, round(batch.shape[1] * key[1] / BLOCK_SCALE))]
        return self.task.grads(self.versions[int(key[0])], batch)

    def apply(
        self,
        new_version: int,
        base_version: int,
        selection: Selection,
        arrivals: ArrivalColumns,
        lr_scale: float,
    ) -> GradientStats:
        """theta_{v+1} = theta_v - lr * lr_scale * d_t (``tailtrain.core.update``); the statistics
        cover the whole gradients computed (partial work excluded)."""
        keys = arrivals.keys
        index = rows_weighed(keys, selection)
        if index.size < len(keys):  # only the weighed arrivals' gradients are computed
            arrivals, keys = arrivals.take(index), keys[index]
        losses, grads = self._grads(arrivals)
        theta = self.versions[base_version]
        self.versions[new_version] = self.update.apply(theta, grads, keys, selection, lr_scale)
        whole = ~arrivals.partial
        finite = self.update.finite  # the update's screen just checked these rows
        moments = self.update.moments
        if whole.all():
            return gradient_stats(losses, grads, finite, self.update.sq_sum, moments=moments)
        mask = torch.from_numpy(whole)
        finite = None if finite is None else finite[whole]
        return gradient_stats(losses[mask], grads[mask], finite, moments=moments)

    def retain(self, referenced: set[int]) -> None:
        """Forget model versions that no job in flight and no update needs any more."""
        for v in [v for v in self.versions if v not in referenced]:
            del self.versions[v]


# units are fractions r/s; this scale turns them into exact integers for grouping
BLOCK_SCALE = 720720

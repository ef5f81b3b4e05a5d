"""Real gradients for the simulator: model versions, mini-batches and weighted updates.

Only gradients that enter an update are computed, and those of workers that share a model
version come from one batched ``torch.func`` call (``Task.grads``). Worker w's j-th job always
sees the same mini-batch for a given seed, so strategies compare on the same data too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tailtrain.strategies.base import ArrivalColumns, Selection


@dataclass(frozen=True)
class UpdateStats:
    """Scalars about an update (``StepStats`` fields), over the fresh whole gradients used."""

    loss: float
    grad_sq_sum: float
    mean_grad_sq: float


class Trainer:
    """Holds the model versions still referenced and applies ``Selection``s to them."""

    def __init__(self, task, partition_state, lr: float, seed: int) -> None:
        self.task = task
        self.partition = partition_state
        self.lr = lr
        self.seed = seed
        self.versions: dict[int, torch.Tensor] = {0: task.init_params(seed)}
        self.deferred: torch.Tensor | None = None

    def batch(self, worker: int, job: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, 7, worker, job))
        return self.partition.sample(rng, np.array([worker]), self.task.batch_size)[0]

    def _grads(
        self, arrivals: ArrivalColumns, jobs: np.ndarray, index: np.ndarray, blocks: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Losses and gradients of ``arrivals[index]``, over the first ``blocks`` fraction."""
        dtype = self.versions[int(arrivals.version[index[0]])].dtype if index.size else None
        losses = torch.empty(index.size, dtype=dtype)
        grads = torch.empty(index.size, self.task.dim, dtype=dtype)
        keys = np.stack([arrivals.version[index], blocks], axis=1)
        for key in np.unique(keys, axis=0):
            where = np.flatnonzero((keys == key).all(axis=1))
            rows = index[where]
            batch = np.stack([self.batch(arrivals.worker[i], jobs[i]) for i in rows])
            size = max(1, round(batch.shape[1] * key[1] / BLOCK_SCALE))
            loss, grad = self.task.grads(self.versions[int(key[0])], batch[:, :size])
            losses[where], grads[where] = loss, grad
        return losses, grads

    def apply(
        self,
        new_version: int,
        base_version: int,
        selection: Selection,
        arrivals: ArrivalColumns,
        jobs: np.ndarray,
        lr_scale: float,
    ) -> UpdateStats:
        """theta_{v+1} = theta_v - lr * (sum_i now_i g_i + previous deferred) (base.Selection)."""
        index = np.array(sorted(set(selection.now) | set(selection.later)), dtype=np.int64)
        blocks = np.round(arrivals.units[index] * BLOCK_SCALE).astype(np.int64)
        losses, grads = self._grads(arrivals, jobs, index, blocks)
        now = torch.tensor([selection.now.get(int(i), 0.0) for i in index], dtype=grads.dtype)
        later = torch.tensor([selection.later.get(int(i), 0.0) for i in index], dtype=grads.dtype)
        step = now @ grads
        if self.deferred is not None:
            step = step + self.deferred
        self.deferred = later @ grads if selection.later else None
        self.versions[new_version] = self.versions[base_version] - self.lr * lr_scale * step
        return self._stats(losses, grads, arrivals.partial[index], arrivals.version[index])

    def _stats(self, losses, grads, partial, versions) -> UpdateStats:
        whole = torch.from_numpy(~partial)
        if not bool(whole.any()):
            nan = float("nan")
            return UpdateStats(nan, nan, nan)
        g = grads[whole]
        return UpdateStats(
            loss=float(losses[whole].mean()),
            grad_sq_sum=float((g * g).sum()),
            mean_grad_sq=float(g.mean(0).square().sum()),
        )

    def retain(self, referenced: set[int]) -> None:
        """Forget model versions that no job in flight and no update needs any more."""
        for v in [v for v in self.versions if v not in referenced]:
            del self.versions[v]


# units are fractions r/s; this scale turns them into exact integers for grouping
BLOCK_SCALE = 720720

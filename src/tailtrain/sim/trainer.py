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
        """The mini-batch (train indices) of ``worker``'s ``job``-th job."""
        return self.batches(np.array([worker]), np.array([job]))[0]

    def batches(self, workers: np.ndarray, jobs: np.ndarray) -> np.ndarray:
        """Mini-batches (R, B) of the jobs ``(workers[r], jobs[r])``."""
        return job_batches(self.partition, self.seed, self.task.batch_size, workers, jobs)[:, 0]

    def _grads(
        self, arrivals: ArrivalColumns, jobs: np.ndarray, index: np.ndarray, blocks: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Losses and gradients of ``arrivals[index]``, over the first ``blocks`` fraction."""
        keys = np.stack([arrivals.version[index], blocks], axis=1)
        groups = np.unique(keys, axis=0)
        if len(groups) == 1:  # the common case: one version, whole batches; no copy
            return self._group_grads(arrivals, jobs, index, groups[0])
        dtype = self.versions[int(arrivals.version[index[0]])].dtype
        losses = torch.empty(index.size, dtype=dtype)
        grads = torch.empty(index.size, self.task.dim, dtype=dtype)
        for key in groups:
            where = np.flatnonzero((keys == key).all(axis=1))
            losses[where], grads[where] = self._group_grads(arrivals, jobs, index[where], key)
        return losses, grads

    def _group_grads(
        self, arrivals: ArrivalColumns, jobs: np.ndarray, rows: np.ndarray, key: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One batched call: jobs that share a model version and a number of blocks."""
        batch = self.batches(arrivals.worker[rows], jobs[rows])
        size = max(1, round(batch.shape[1] * key[1] / BLOCK_SCALE))
        return self.task.grads(self.versions[int(key[0])], batch[:, :size])

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
        step = weights(selection.now, index, grads.dtype) @ grads
        if self.deferred is not None:
            step = step + self.deferred
        later = selection.later
        self.deferred = weights(later, index, grads.dtype) @ grads if later else None
        self.versions[new_version] = self.versions[base_version] - self.lr * lr_scale * step
        return self._stats(losses, grads, arrivals.partial[index], arrivals.version[index])

    def _stats(self, losses, grads, partial, versions) -> UpdateStats:
        whole = torch.from_numpy(~partial)
        if not bool(whole.any()):
            nan = float("nan")
            return UpdateStats(nan, nan, nan)
        g = grads if bool(whole.all()) else grads[whole]
        flat, mean = g.reshape(-1), g.mean(0)
        return UpdateStats(
            loss=float(losses[whole].mean()),
            grad_sq_sum=float(flat @ flat),
            mean_grad_sq=float(mean @ mean),
        )

    def retain(self, referenced: set[int]) -> None:
        """Forget model versions that no job in flight and no update needs any more."""
        for v in [v for v in self.versions if v not in referenced]:
            del self.versions[v]


def weights(by_index: dict[int, float], index: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The weights of ``by_index`` laid out along ``index`` (0 where absent)."""
    get = by_index.get
    return torch.tensor([get(i, 0.0) for i in index.tolist()], dtype=dtype)


def job_batches(
    partition, seed: int, batch: int, workers: np.ndarray, jobs: np.ndarray, units: int = 1
) -> np.ndarray:
    """Train indices (R, units, B) of job ``jobs[r]`` of worker ``workers[r]``.

    Each job has its own stream keyed by (seed, worker, job), so a job sees the same data
    whatever else the strategy does; draws are uniform with replacement from the worker's
    shard, all in one vectorised call.
    """
    workers = np.asarray(workers, dtype=np.uint64)
    jobs = np.asarray(jobs, dtype=np.uint64)
    draw = np.arange(units * batch, dtype=np.uint64).reshape(1, units, batch)
    # distinct (seed, worker, job) give distinct keys for workers < 2^24 and jobs < 2^40
    key = splitmix64(np.uint64(seed)) ^ (workers << np.uint64(40)) ^ jobs
    u = keyed_uniform(key[:, None, None], draw)
    sizes = partition.sizes[workers.astype(np.int64)][:, None, None]
    offsets = np.minimum((u * sizes).astype(np.int64), sizes - 1)
    return partition.pool[partition.starts[workers.astype(np.int64)][:, None, None] + offsets]


def keyed_uniform(key: np.ndarray, counter: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) doubles, a pure function of (key, counter), vectorised.

    Hand-written because numpy has no vectorised keyed (counter-based) generator and one
    seeded Generator per job costs more than the gradient bookkeeping it serves: this is the
    SplitMix64 finaliser (Steele, Lea and Flood, 2014) applied twice, to key then counter.
    """
    with np.errstate(over="ignore"):
        x = splitmix64(splitmix64(key) + counter)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


# units are fractions r/s; this scale turns them into exact integers for grouping
BLOCK_SCALE = 720720

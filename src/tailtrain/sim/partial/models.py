"""The processes' model copies in the eager-SGD simulator, shared while they are equal.

Under eager-SGD every process keeps its own model w_t^p (eager-SGD §6.1). Processes that
adopted the same results from the same model hold equal copies, so a copy is stored once per
distinct lineage and processes point at it by id. Gradients of the work that shares a model
come from one batched ``torch.func`` call (``Task.grads``, or ``Task.grads_multi`` when the
rows sit on different copies), never from a per-process loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tailtrain.sim.partial.processes import Work
from tailtrain.tasks.stream import job_batches


@dataclass(frozen=True)
class Gradients:
    """Per-gradient mean mini-batch losses (n,) and gradients (n, D), in the work's order."""

    losses: torch.Tensor
    grads: torch.Tensor


class ModelStore:
    """Distinct model copies by id; ``adopt`` applies a round's result to a set of copies."""

    def __init__(self, task, partition_state, seed: int) -> None:
        self.task = task
        self.partition = partition_state
        self.seed = seed
        self.models: dict[int, torch.Tensor] = {0: task.init_params(seed)}
        self._next = 1

    def _add(self, theta: torch.Tensor) -> int:
        key = self._next
        self.models[key] = theta
        self._next += 1
        return key

    def adopt(self, ids: np.ndarray, update: torch.Tensor, scale: float) -> np.ndarray:
        """w <- w - scale * update for each distinct copy in ``ids``; returns the new ids."""
        if ids.size == 0:
            return ids
        uniq, inverse = np.unique(ids, return_inverse=True)
        new = np.array([self._add(self.models[int(u)] - scale * update) for u in uniq])
        return new[inverse]

    def mean(self, ids: np.ndarray) -> torch.Tensor:
        """The average of the processes' models (what a model synchronisation gives)."""
        return self.mean_later(ids)()

    def mean_later(self, ids: np.ndarray) -> Callable[[], torch.Tensor]:
        """:meth:`mean` of today's models, computed on demand, even after they are dropped."""
        uniq, counts = np.unique(ids, return_counts=True)
        held = [self.models[int(u)] for u in uniq]
        if len(held) == 1:
            return lambda: held[0]
        weights = counts / ids.size
        return lambda: torch.as_tensor(weights, dtype=held[0].dtype) @ torch.stack(held)

    def average(self, ids: np.ndarray) -> np.ndarray:
        """Synchronise: every process gets the mean model (unchanged if all are equal)."""
        if np.unique(ids).size == 1:
            return ids
        return np.full(ids.size, self._add(self.mean(ids)))

    def retain(self, referenced: np.ndarray) -> None:
        """Forget copies no process and no send buffer refers to any more."""
        keep = set(np.unique(referenced).tolist())
        for key in [k for k in self.models if k not in keep]:
            del self.models[key]

    def distinct(self, ids: np.ndarray) -> int:
        return int(np.unique(ids).size)

    def gradients(self, work: Work) -> Gradients:
        """Losses and gradients of ``work`` in one batched call: at a shared model when all
        rows share one, else each row at its own copy (``Task.grads_multi``)."""
        task = self.task
        if len(work) == 0:
            return Gradients(torch.zeros(0), torch.zeros(0, task.dim))
        batch = job_batches(self.partition, self.seed, task.batch_size, work.worker, work.job)
        batch = batch[:, 0]
        uniq, inverse = np.unique(work.model, return_inverse=True)
        if uniq.size == 1:
            return Gradients(*task.grads(self.models[int(uniq[0])], batch))
        copies = torch.stack([self.models[int(u)] for u in uniq])
        return Gradients(*task.grads_multi(copies[torch.from_numpy(inverse)], batch))

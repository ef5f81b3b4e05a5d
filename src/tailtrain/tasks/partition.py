"""Who samples which training examples: ``iid``, ``shared`` and ``noniid:classes=c``.

- ``iid``: a random permutation of the train set cut into N disjoint, near-equal shards.
- ``shared``: every worker samples the whole train set, as DBW §5 does for MNIST.
- ``noniid:classes=c``: LGC §III-A's non-IID(c), "each worker is allocated with c
  categories of samples". The paper gives no construction; ours permutes the classes,
  gives worker i the c consecutive classes starting at i·c (mod K), and splits each
  class's examples evenly and disjointly among the workers that hold it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.spec import parse_spec

log = logging.getLogger(__name__)

KNOWN_PARTITIONS = ("iid", "shared", "noniid:classes=c")


class PartitionedData(Protocol):
    """What a partition needs from a task."""

    @property
    def n_train(self) -> int: ...

    @property
    def n_classes(self) -> int | None: ...

    def train_labels(self) -> np.ndarray | None: ...


@dataclass(frozen=True)
class PartitionState:
    """Worker w's shard is ``pool[starts[w] : starts[w] + sizes[w]]`` (train-set indices).

    ``classes`` is (N, c), the classes each worker holds, for ``noniid`` only.
    """

    pool: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    classes: np.ndarray | None = None

    @property
    def n_workers(self) -> int:
        return int(self.sizes.shape[0])

    def shard(self, worker: int) -> np.ndarray:
        return self.pool[self.starts[worker] : self.starts[worker] + self.sizes[worker]]

    def sample(
        self, rng: np.random.Generator, workers: np.ndarray, batch: int, count: int = 1
    ) -> np.ndarray:
        """Uniform draws with replacement from each worker's shard, all in one call.

        Shape (len(workers), batch) when ``count == 1``, else (len(workers), count, batch).
        Drawing with replacement keeps each mini-batch gradient unbiased (LGC Eq. (4))
        and lets shards smaller than the batch work.
        """
        w = np.asarray(workers, dtype=np.int64).reshape(-1)
        if count < 1 or batch < 1:
            raise ValueError(f"count and batch must be >= 1, got {count}, {batch}")
        if w.size and (w.min() < 0 or w.max() >= self.n_workers):
            raise IndexError(f"worker ids must lie in [0, {self.n_workers})")
        sizes = self.sizes[w][:, None, None]
        pos = self.starts[w][:, None, None] + rng.integers(0, sizes, (w.size, count, batch))
        idx = self.pool[pos]
        return idx[:, 0] if count == 1 else idx


def _from_owner(owner: np.ndarray, n_workers: int) -> tuple[np.ndarray, ...]:
    """Group example indices by owning worker: (pool, starts, sizes)."""
    sizes = np.bincount(owner, minlength=n_workers)
    starts = np.cumsum(sizes) - sizes
    return np.argsort(owner, kind="stable"), starts, sizes


def _even_owner(count: int, holders: np.ndarray) -> np.ndarray:
    """Owner of each of ``count`` shuffled examples when split evenly among ``holders``."""
    return holders[np.arange(count) * holders.size // count]


@dataclass(frozen=True)
class Partition:
    """A parsed partition spec; :meth:`assign` draws the shards for N workers."""

    kind: str
    classes: int = 0
    text: str = ""

    def assign(
        self, task: PartitionedData, n_workers: int, rng: np.random.Generator
    ) -> PartitionState:
        """Shards for ``n_workers`` workers of ``task``, validated so every worker has data."""
        if n_workers < 1:
            raise UsageError(f"need at least one worker, got {n_workers}")
        n = task.n_train
        if n == 0:  # a timing-only task: nothing to sample
            empty = np.zeros(n_workers, dtype=np.int64)
            return PartitionState(np.zeros(0, dtype=np.int64), empty, empty)
        if self.kind == "shared":
            zeros = np.zeros(n_workers, dtype=np.int64)
            return PartitionState(np.arange(n), zeros, np.full(n_workers, n))
        if self.kind == "iid":
            owner = np.empty(n, dtype=np.int64)
            owner[rng.permutation(n)] = _even_owner(n, np.arange(n_workers))
            return self._checked(PartitionState(*_from_owner(owner, n_workers)), n)
        return self._noniid(task, n_workers, rng)

    def _noniid(
        self, task: PartitionedData, n_workers: int, rng: np.random.Generator
    ) -> PartitionState:
        labels, k = task.train_labels(), task.n_classes
        if labels is None or k is None:
            raise UsageError(f"partition {self.text!r} needs a classification task, not regression")
        if self.classes > k:
            raise UsageError(
                f"partition {self.text!r}: classes={self.classes} exceeds the task's {k} classes"
            )
        windows = np.arange(n_workers)[:, None] * self.classes + np.arange(self.classes)
        held = rng.permutation(k)[windows % k]
        owner = np.empty(labels.shape[0], dtype=np.int64)
        for cls in range(k):  # K classes, not per example
            members = rng.permutation(np.flatnonzero(labels == cls))
            holders = np.flatnonzero((held == cls).any(axis=1))
            if holders.size == 0:
                log.warning("partition %s: no worker holds class %d", self.text, cls)
                owner[members] = -1
            elif members.size:
                owner[members] = _even_owner(members.size, holders)
        kept = np.flatnonzero(owner >= 0)
        pool, starts, sizes = _from_owner(owner[kept], n_workers)
        state = PartitionState(kept[pool], starts, sizes, classes=np.sort(held, axis=1))
        return self._checked(state, task.n_train)

    def _checked(self, state: PartitionState, n: int) -> PartitionState:
        empty = np.flatnonzero(state.sizes == 0)
        if empty.size:
            raise UsageError(
                f"partition {self.text!r} leaves worker {empty[0]} without data "
                f"({n} training examples for {state.n_workers} workers); "
                "use fewer workers or --partition shared"
            )
        return state


def parse_partition(text: str) -> Partition:
    """Parse ``iid``, ``shared`` or ``noniid:classes=c``."""
    spec = parse_spec(text, what="partition")
    if spec.name in ("iid", "shared"):
        spec.require_known(())
        return Partition(spec.name, text=spec.text)
    if spec.name == "noniid":
        spec.require_known(("classes",))
        return Partition("noniid", spec.get_int("classes", minimum=1), spec.text)
    raise UsageError(f"unknown partition {spec.name!r}; known: {', '.join(KNOWN_PARTITIONS)}")

"""What the stragglers cost: synchronous E[T] on the trace against the mean worker time.

Scenario worker n replays trace worker n mod W (``delays.trace``), so with N >= W workers the
slowest of an iteration is the slowest of the W trace workers, and with N < W it is among the
first N. E[T] is the mean over the trace's iterations of max_n t[i, n], plus the mean T^c per round
(the trace's recorded noncompute seconds, ``delays.trace``, or ``--comm-time``); the mean
worker time is the mean of t[i, n] over iterations and scenario workers (trace workers weighted
by how many scenario workers replay them). The straggler cost is E[T] - T^c - mean per step,
also as a share of E[T]. Excluding workers drops every scenario worker that replays them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from tailtrain.errors import UsageError


@dataclass(frozen=True)
class Cost:
    """Sync iteration time on the trace and what waiting for the slowest costs."""

    workers: int
    iteration_time: float  # E[T] = mean_i max_n t[i, n] + E[T^c]
    mean_worker_time: float
    excluded: tuple[int, ...] = ()
    kept_workers: int = 0
    comm_time: float = 0.0  # E[T^c] per round

    @property
    def overhead(self) -> float:
        """Seconds per step spent waiting for the slowest worker; 0 where the replayed E[T]
        falls below the direct mean by the replay's own noise (no worker waits there)."""
        return max(self.iteration_time - self.comm_time - self.mean_worker_time, 0.0)

    @property
    def overhead_share(self) -> float:
        return self.overhead / self.iteration_time if self.iteration_time > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Worker mini-batches per second."""
        kept = self.kept_workers or self.workers
        return kept / self.iteration_time if self.iteration_time > 0 else float("inf")

    def as_dict(self) -> dict[str, object]:
        return {
            "workers": self.kept_workers or self.workers,
            "excluded": list(self.excluded),
            "iteration_time": self.iteration_time,
            "mean_worker_time": self.mean_worker_time,
            "comm_time": self.comm_time,
            "overhead": self.overhead,
            "overhead_share": self.overhead_share,
            "throughput": self.throughput,
        }


def sync_cost(
    times: NDArray[np.float64],
    ids: NDArray[np.int64],
    workers: int,
    exclude: Collection[int] = (),
    comm: float = 0.0,
) -> Cost:
    """E[T] and the mean worker time of ``workers`` scenario workers replaying ``times[i, w]``
    (trace worker ids ``ids``) with ``comm`` seconds of T^c per round, leaving out every
    replica of the trace workers ``exclude``."""
    replicas = _replicas(ids.size, workers)
    keep = replicas > 0
    keep &= ~np.isin(ids, list(exclude))
    if not keep.any():
        raise UsageError("excluding those workers leaves none to train")
    kept = times[:, keep]
    weights = replicas[keep]
    mean = float((kept.mean(axis=0) * weights).sum() / weights.sum())
    return Cost(
        workers=workers,
        iteration_time=float(kept.max(axis=1).mean()) + comm,
        mean_worker_time=mean,
        excluded=tuple(sorted(int(w) for w in exclude)),
        kept_workers=int(weights.sum()),
        comm_time=comm,
    )


def _replicas(trace_workers: int, workers: int) -> NDArray[np.int64]:
    """How many of ``workers`` scenario workers replay each trace worker (n -> n mod W)."""
    if workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    base, extra = divmod(workers, trace_workers)
    return base + (np.arange(trace_workers) < extra).astype(np.int64)

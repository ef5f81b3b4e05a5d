"""Per-worker job durations drawn in bulk from a delay process.

Worker w's j-th job always takes the same time for a given seed, whatever the strategy does
with it. That gives every strategy the same sampled delay paths (common random numbers), so a
comparison between strategies is not blurred by different luck.

With a communication model, a job is a parameter-server round trip: pull the model, compute,
push the gradient, so it lasts compute + T^c. T^c is drawn per job from its own seeded stream
(as ``sim.allreduce.timing.RoundClock`` does per round), so adding ``--comm-time`` leaves the
compute draws unchanged, and a worker pattern's slowdown scales the compute only.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from tailtrain.delays.base import DelayModel


class DelaySource(Protocol):
    """What durations need from ``tailtrain.delays.DelayProcess``."""

    def next_block(self, iterations: int) -> np.ndarray: ...

    def time_factor(self, starts: np.ndarray, workers: np.ndarray) -> np.ndarray: ...


BLOCK = 256
#: stream of the per-job communication times, apart from the delay process's
COMM_STREAM = 12


class JobDurations:
    """Durations of each worker's successive jobs, sampled ``BLOCK`` iterations at a time.

    ``comm`` (with ``seed``) adds a round trip T^c to every job, from its own stream.
    """

    def __init__(
        self,
        process: DelaySource,
        n_workers: int,
        comm: DelayModel | None = None,
        seed: int = 0,
    ) -> None:
        self._process = process
        self._comm = comm
        self._comm_rng = np.random.default_rng((seed, COMM_STREAM))
        self._table = np.empty((0, n_workers))
        self._comm_table = np.zeros((0, n_workers))
        self._offset = 0  # rows below this were used by every worker and are dropped
        # for jobs made of micro-batches: share of the job's work done after each of them
        self._progress: np.ndarray | None = None
        self.next_job = np.zeros(n_workers, dtype=np.int64)

    def _ensure(self, rows: int) -> None:
        if rows <= self._offset + self._table.shape[0]:
            return
        low = int(self.next_job.min())
        blocks = [self._table[low - self._offset :]]
        comms = [self._comm_table[low - self._offset :]]
        shares = [] if self._progress is None else [self._progress[low - self._offset :]]
        have = self._offset + self._table.shape[0]
        while have < rows:
            block = self._process.next_block(BLOCK)
            # a job made of micro-batches lasts their sum
            blocks.append(block if block.ndim == 2 else block.sum(axis=2))
            comms.append(self._comm_block(blocks[-1].shape))
            if block.ndim == 3:
                total = np.maximum(blocks[-1][..., None], np.finfo(float).tiny)
                shares.append(np.cumsum(block, axis=2) / total)
            have += BLOCK
        self._table = np.concatenate(blocks, axis=0)
        self._comm_table = np.concatenate(comms, axis=0)
        self._progress = np.concatenate(shares, axis=0) if shares else None
        self._offset = low

    def _comm_block(self, shape: tuple[int, ...]) -> np.ndarray:
        if self._comm is None:
            return np.zeros(shape)
        return np.maximum(self._comm.sample(self._comm_rng, shape), 0.0)

    def peek(self, workers: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Durations of the next job of each worker if it starts at ``starts``; consumes nothing."""
        if workers.size == 0:
            return np.empty(0)
        idx = self.next_job[workers]
        self._ensure(int(idx.max()) + 1)
        rows = idx - self._offset
        compute = self._table[rows, workers] * self._process.time_factor(starts, workers)
        return compute + self._comm_table[rows, workers]

    def peek_progress(self, workers: np.ndarray) -> np.ndarray | None:
        """(W, M) share of each worker's next job done after each of its M micro-batches
        (cumulative micro-batch time over the job's time); None if jobs have no micro-batches."""
        if workers.size:
            self._ensure(int(self.next_job[workers].max()) + 1)
        if self._progress is None:
            return None
        return self._progress[self.next_job[workers] - self._offset, workers]

    def advance(self, workers: np.ndarray) -> None:
        """Mark the next job of each worker (distinct) as started."""
        self.next_job[workers] += 1

"""Per-worker job durations drawn in bulk from a delay process.

Worker w's j-th job always takes the same time for a given seed, whatever the strategy does
with it. That gives every strategy the same sampled delay paths (common random numbers), so a
comparison between strategies is not blurred by different luck.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class DelaySource(Protocol):
    """What durations need from ``tailtrain.delays.DelayProcess``."""

    def next_block(self, iterations: int) -> np.ndarray: ...

    def time_factor(self, starts: np.ndarray, workers: np.ndarray) -> np.ndarray: ...


BLOCK = 256


class JobDurations:
    """Durations of each worker's successive jobs, sampled ``BLOCK`` iterations at a time."""

    def __init__(self, process: DelaySource, n_workers: int) -> None:
        self._process = process
        self._table = np.empty((0, n_workers))
        self._offset = 0  # rows below this were used by every worker and are dropped
        # for jobs made of micro-batches: share of the job's work done after each of them
        self._progress: np.ndarray | None = None
        self.next_job = np.zeros(n_workers, dtype=np.int64)

    def _ensure(self, rows: int) -> None:
        if rows <= self._offset + self._table.shape[0]:
            return
        low = int(self.next_job.min())
        keep = self._table[low - self._offset :]
        blocks = [keep]
        shares = [] if self._progress is None else [self._progress[low - self._offset :]]
        have = self._offset + self._table.shape[0]
        while have < rows:
            block = self._process.next_block(BLOCK)
            # a job made of micro-batches lasts their sum
            blocks.append(block if block.ndim == 2 else block.sum(axis=2))
            if block.ndim == 3:
                total = np.maximum(blocks[-1][..., None], np.finfo(float).tiny)
                shares.append(np.cumsum(block, axis=2) / total)
            have += BLOCK
        self._table = np.concatenate(blocks, axis=0)
        self._progress = np.concatenate(shares, axis=0) if shares else None
        self._offset = low

    def peek(self, workers: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Durations of the next job of each worker if it starts at ``starts``; consumes nothing."""
        if workers.size == 0:
            return np.empty(0)
        idx = self.next_job[workers]
        self._ensure(int(idx.max()) + 1)
        base = self._table[idx - self._offset, workers]
        return base * self._process.time_factor(starts, workers)

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

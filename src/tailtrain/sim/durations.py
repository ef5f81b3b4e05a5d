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
        self.next_job = np.zeros(n_workers, dtype=np.int64)

    def _ensure(self, rows: int) -> None:
        if rows <= self._offset + self._table.shape[0]:
            return
        low = int(self.next_job.min())
        keep = self._table[low - self._offset :]
        blocks = [keep]
        have = self._offset + self._table.shape[0]
        while have < rows:
            block = self._process.next_block(BLOCK)
            # a job made of micro-batches lasts their sum
            blocks.append(block if block.ndim == 2 else block.sum(axis=2))
            have += BLOCK
        self._table = np.concatenate(blocks, axis=0)
        self._offset = low

    def peek(self, workers: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Durations of the next job of each worker if it starts at ``starts``; consumes nothing."""
        if workers.size == 0:
            return np.empty(0)
        idx = self.next_job[workers]
        self._ensure(int(idx.max()) + 1)
        base = self._table[idx - self._offset, workers]
        return base * self._process.time_factor(starts, workers)

    def advance(self, workers: np.ndarray) -> None:
        """Mark the next job of each worker (distinct) as started."""
        self.next_job[workers] += 1

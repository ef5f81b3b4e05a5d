"""Virtual-time state of N workers around a parameter server, advanced one step at a time.

Each worker runs at most one job: the model version it started from, its start and its finish
time. A step collects arrivals in time order until ``k`` usable ones have come (DBW §2; the
slow-and-stale paper §II-C). Events are processed in vectorised batches: the earliest events
are taken together unless a job that one of them starts would finish in between, in which
case the batch is cut there. That keeps the exact event order at numpy speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tailtrain.errors import TailtrainError
from tailtrain.sim.durations import JobDurations
from tailtrain.strategies.base import ArrivalColumns, SyncMode

IDLE = -1


@dataclass(frozen=True)
class StepArrivals:
    """Everything that arrived during one step, in time order, with each arrival's job id."""

    arrivals: ArrivalColumns
    jobs: np.ndarray
    usable: np.ndarray
    close: float


class ServerTimeline:
    """Worker jobs and the virtual clock of one simulated parameter-server run."""

    def __init__(self, durations: JobDurations, n_workers: int) -> None:
        self.n = n_workers
        self.durations = durations
        self.now = 0.0
        self.version = np.full(n_workers, IDLE, dtype=np.int64)
        self.start = np.zeros(n_workers)
        self.finish = np.full(n_workers, np.inf)
        self.job = np.zeros(n_workers, dtype=np.int64)
        # workers that finished at the latest instant: they restart only once no other event
        # of that instant remains, since one of those could close the step first
        self._waiting = np.empty(0, dtype=np.int64)
        self._waiting_since = -np.inf

    def _launch(self, workers: np.ndarray, version: int, starts: np.ndarray) -> None:
        self._launch_known(workers, version, starts, self.durations.peek(workers, starts))

    def _launch_known(
        self, workers: np.ndarray, version: int, starts: np.ndarray, took: np.ndarray
    ) -> None:
        self.job[workers] = self.durations.next_job[workers]
        self.durations.advance(workers)
        self.version[workers] = version
        self.start[workers] = starts
        self.finish[workers] = starts + took

    def begin(self, version: int, mode: SyncMode) -> None:
        """At the update making ``version``: interrupt if the mode says so; start idle workers."""
        if mode.interrupts:
            self.cancel(np.flatnonzero(self.version != IDLE))
        idle = np.flatnonzero(self.version == IDLE)
        self._launch(idle, version, np.full(idle.size, self.now))

    def cancel(self, workers: np.ndarray) -> None:
        self.version[workers] = IDLE
        self.finish[workers] = np.inf

    def busy_on(self, version: int) -> np.ndarray:
        return np.flatnonzero(self.version == version)

    def collect(self, k: int, version: int, mode: SyncMode, accept_stale: bool) -> StepArrivals:
        """Advance the clock until ``k`` usable arrivals; return them and the stale ones between."""
        chunks: list[tuple[np.ndarray, ...]] = []
        have = 0
        while have < k:
            self._release_waiting(version)
            batch, usable = self._next_batch(k - have, version, accept_stale, mode)
            have += int(usable.sum())
            closes = self.finish[batch[-1]] if have >= k else None
            chunks.append(self._commit(batch, usable, version, mode, closes))
        cols = (np.concatenate(c) for c in zip(*chunks, strict=True))
        worker, ver, start, finish, job, usable = cols
        self.now = float(finish[-1])
        arrivals = ArrivalColumns(worker, ver, start, finish)
        return StepArrivals(arrivals, job, usable, self.now)

    def _release_waiting(self, version: int) -> None:
        if self._waiting.size == 0:
            return
        pending = self.finish[self.version != IDLE]
        if pending.size == 0 or pending.min() > self._waiting_since:
            starts = np.full(self._waiting.size, self._waiting_since)
            self._launch(self._waiting, version, starts)
            self._waiting = np.empty(0, dtype=np.int64)

    def _next_batch(
        self, need: int, version: int, accept_stale: bool, mode: SyncMode
    ) -> tuple[np.ndarray, np.ndarray]:
        busy = np.flatnonzero(self.version != IDLE)
        if busy.size == 0:
            raise TailtrainError("no worker is computing: the step can never collect k arrivals")
        order = busy[np.lexsort((busy, self.finish[busy]))]
        usable = accept_stale | (self.version[order] == version)
        count = np.cumsum(usable)
        m = int(np.searchsorted(count, need)) + 1 if count[-1] >= need else order.size
        batch = order[:m]
        if self._waiting.size:  # finish this instant first, then release who waits on it
            batch = batch[self.finish[batch] <= self._waiting_since]
        # a job started by an event of this batch may end before the batch's last event;
        # events are ordered by (time, worker) wherever they come from
        while batch.size > 1:
            follow = batch[self._follows(batch, version, mode)]
            if follow.size == 0:
                break
            ends = self.finish[follow] + self.durations.peek(follow, self.finish[follow])
            first = np.lexsort((follow, ends))[0]
            t, w = ends[first], follow[first]
            last_t, last_w = self.finish[batch[-1]], batch[-1]
            if t > last_t or (t == last_t and w > last_w):
                break
            times = self.finish[batch]
            batch = batch[(times < t) | ((times == t) & (batch < w))]
        return batch, usable[: batch.size]

    def _follows(self, batch: np.ndarray, version: int, mode: SyncMode) -> np.ndarray:
        """Which finishing workers start a new job at once (pull, or a stale one under push)."""
        if mode.refills:
            return np.ones(batch.size, dtype=bool)
        return self.version[batch] < version

    def _commit(
        self,
        batch: np.ndarray,
        usable: np.ndarray,
        version: int,
        mode: SyncMode,
        closes: float | None,
    ) -> tuple[np.ndarray, ...]:
        """Record the batch and start follow-up jobs; who finishes as the step closes waits
        for the update, so that it starts from the new version."""
        record = (
            batch.copy(),
            self.version[batch].copy(),
            self.start[batch].copy(),
            self.finish[batch].copy(),
            self.job[batch].copy(),
            usable,
        )
        follows = self._follows(batch, version, mode)
        done = self.finish[batch]
        at_last = done == done[-1]
        self.cancel(batch)
        self._launch(batch[follows & ~at_last], version, done[follows & ~at_last])
        if closes is None:
            self._waiting = np.concatenate([self._waiting, batch[follows & at_last]])
            self._waiting_since = done[-1]
        else:
            self._waiting = np.empty(0, dtype=np.int64)
        return record

    def partial_work(self, version: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
        """Blocks of s completed by the workers still on ``version`` at ``now`` (LGC Alg. 1)."""
        busy = self.busy_on(version)
        elapsed = self.now - self.start[busy]
        total = self.finish[busy] - self.start[busy]
        done = np.floor(blocks * elapsed / np.maximum(total, np.finfo(float).tiny))
        return busy, np.clip(done, 0, blocks - 1).astype(np.int64)

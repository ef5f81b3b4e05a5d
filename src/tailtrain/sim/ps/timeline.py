"""Virtual-time state of N workers around a parameter server, advanced one step at a time.

Each worker runs at most one job: the model version it started from, its start and its finish
time. A step collects arrivals in time order until ``k`` usable ones have come (DBW §2; the
slow-and-stale paper §II-C). Events are processed in vectorised batches: the earliest events
are taken together unless a job that one of them starts would finish in between, in which
case the batch is cut there. That keeps the exact event order at numpy speed.

What a worker does after it delivers depends on the mode (see ``SyncMode``):

- push (PsI, PsW): a worker whose gradient counts waits for the update and then starts on the
  new version; so under K-async (PsW, stale accepted) a worker counts at most once per step
  (slow-and-stale §II-C, Fig. 5: "some workers being idle ... until any K finish"). A worker
  whose gradient is dropped as stale takes the current version at once (DBW §2, PsW).
- pull with stale gradients accepted (K-batch-async, slow-and-stale §II-C): it fetches the
  current version at once and may count several times per step.
- pull with stale gradients dropped (DBW §2's PI): TensorFlow's token queue. Each update
  enqueues n tokens tagged with the new version; a free worker dequeues the oldest token, and
  its next gradient carries that token's version, so one whose token is older than the model
  is computed in vain (DBW footnote 3). With no token left it waits for the next update.
  Hence at most n jobs of a version are ever started, however fast some workers are.
- pull & interrupt (K-batch-sync): it computes again at the same version until the update.

Those rules, and the token queue, are ``topology.ps.transition``, shared with the real server
(``runtime.ps``); this module feeds it events in virtual-time order and keeps the times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tailtrain.delays.schedule import JobDurations
from tailtrain.errors import TailtrainError
from tailtrain.strategies.base import ArrivalColumns, SyncMode, step_closes, usable
from tailtrain.topology import ps
from tailtrain.topology.ps import IDLE


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
        self.start = np.zeros(n_workers)
        self.finish = np.full(n_workers, np.inf)
        self.job = np.zeros(n_workers, dtype=np.int64)
        # workers that finished at the latest instant: they restart only once no other event
        # of that instant remains, since one of those could close the step first
        self._waiting = np.empty(0, dtype=np.int64)
        self._waiting_since = -np.inf
        # who computes which version, and DBW §2 PI's token queue (``topology.ps``)
        self.schedule = ps.Schedule.fresh(n_workers)
        # (N, M) share of each running job done after each micro-batch; None without them
        self.progress: np.ndarray | None = None

    def _launch(self, workers: np.ndarray, starts: np.ndarray) -> None:
        took = self.durations.peek(workers, starts)
        shares = self.durations.peek_progress(workers)
        if shares is not None:
            if self.progress is None:
                self.progress = np.ones((self.n, shares.shape[1]))
            self.progress[workers] = shares
        self.job[workers] = self.durations.next_job[workers]
        self.durations.advance(workers)
        self.start[workers] = starts
        self.finish[workers] = starts + took

    def begin(self, version: int, mode: SyncMode, accept_stale: bool) -> None:
        """At the update making ``version``: interrupt if the mode says so; start idle workers.

        With tokens the update enqueues n tokens of ``version`` first, and the idle workers,
        lowest index first, dequeue the oldest ones.
        """
        update = ps.Update(version, mode, accept_stale)
        self.schedule, starts = ps.transition(self.schedule, update)
        # an interrupted job (``Start.cancels``) is replaced by the job this launch starts,
        # which overwrites its finish time: no separate cancel. An update starts a worker at
        # most once, and every draw is the worker's own, so the launch order is immaterial
        if len(starts):
            self._launch(starts.worker, np.full(len(starts), self.now))

    def _deliver(self, workers: np.ndarray, done: np.ndarray, hold: np.ndarray) -> None:
        """``workers`` delivered at ``done``, in event order; the held ones ask later."""
        self.schedule, starts = ps.transition(self.schedule, ps.Delivered(workers, hold))
        if not len(starts):  # push: who counts waits for the update
            return
        # each starts when it delivered: its own event's time
        when = np.empty(self.n)
        when[workers] = done
        self._launch(starts.worker, when[starts.worker])

    def _ask(self, workers: np.ndarray, since: float) -> None:
        """Serve the held ``workers``, in event order, at ``since``."""
        self.schedule, starts = ps.transition(self.schedule, ps.Ask(workers))
        if len(starts):
            self._launch(starts.worker, np.full(len(starts), since))

    @property
    def version(self) -> np.ndarray:
        """The version each worker computes (``IDLE``: none): the schedule's jobs, read-only."""
        return self.schedule.jobs

    def cancel(self, workers: np.ndarray) -> None:
        self.finish[workers] = np.inf

    def busy_on(self, version: int) -> np.ndarray:
        return np.flatnonzero(self.version == version)

    def collect(
        self, k: int, version: int, accept_stale: bool, *, drain: bool = False
    ) -> StepArrivals:
        """Advance the clock until ``k`` usable arrivals; return them and the stale ones between.

        ``drain`` also waits until no job of an older version is running (LGC with
        ``complete=true``: the previous step's stragglers deliver before the next update), and
        a worker that delivers a stale gradient goes on to the current version even as the step
        closes, so that every worker computes every version in turn.
        """
        chunks: list[tuple[np.ndarray, ...]] = []
        have = 0
        while not step_closes(have, k, drain and bool(self._older_running(version).any())):
            self._release_waiting()
            batch, fit = self._next_batch(k - have, version, accept_stale, drain)
            have += int(fit.sum())
            older = False
            if drain:
                rest = self._older_running(version)
                rest[batch] = False
                older = bool(rest.any())
            closes = step_closes(have, k, older)
            # a straggler drained as the step closes goes on to this version, not the next
            carry_on = closes and drain
            chunks.append(self._commit(batch, fit, closes, carry_on))
        if len(chunks) == 1:  # the usual step: one event batch, nothing to join
            worker, ver, start, finish, job, fits = chunks[0]
        else:
            cols = (np.concatenate(c) for c in zip(*chunks, strict=True))
            worker, ver, start, finish, job, fits = cols
        self.now = float(finish[-1])
        n = worker.size
        # columns of the timeline's own dtypes: no conversion to check
        arrivals = ArrivalColumns.trusted(
            worker, job, ver, start, finish, np.ones(n), np.zeros(n, dtype=bool)
        )
        return StepArrivals(arrivals, job, fits, self.now)

    def _older_running(self, version: int) -> np.ndarray:
        return (self.version != IDLE) & (self.version < version)

    def _release_waiting(self) -> None:
        if self._waiting.size == 0:
            return
        pending = self.finish[self.version != IDLE]
        if pending.size == 0 or pending.min() > self._waiting_since:
            self._ask(self._waiting, self._waiting_since)
            self._waiting = np.empty(0, dtype=np.int64)

    def _next_batch(
        self, need: int, version: int, accept_stale: bool, drain: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        jobs = self.version
        busy = (jobs != IDLE).nonzero()[0]
        if busy.size == 0:
            raise TailtrainError("no worker is computing: the step can never collect k arrivals")
        order = busy[_by_time(self.finish[busy])]
        fit = usable(jobs[order], version, accept_stale)
        count = np.cumsum(fit)
        m = int(np.searchsorted(count, need)) + 1 if count[-1] >= need else order.size
        if drain:  # up to the last older job too
            older = np.flatnonzero(jobs[order] < version)
            m = max(m, int(older[-1]) + 1) if older.size else m
        batch = order[:m]
        if self._waiting.size:  # finish this instant first, then release who waits on it
            batch = batch[self.finish[batch] <= self._waiting_since]
        # a job started by an event of this batch may end before the batch's last event;
        # events are ordered by (time, worker) wherever they come from
        while batch.size > 1:
            follow = batch[self._follows(batch)]
            if follow.size == 0:
                break
            ends = self.finish[follow] + self.durations.peek(follow, self.finish[follow])
            # the first follow-up job's end, ties by worker: a minimum, not a sort
            t = ends.min()
            w = follow[ends == t].min()
            last_t, last_w = self.finish[batch[-1]], batch[-1]
            if t > last_t or (t == last_t and w > last_w):
                break
            times = self.finish[batch]
            batch = batch[(times < t) | ((times == t) & (batch < w))]
        return batch, fit[: batch.size]

    def _follows(self, batch: np.ndarray) -> np.ndarray:
        """Which finishing workers (in event order) start a new job at once.

        Pull: each one, while tokens last. Push: only one whose gradient was dropped as stale
        (DBW §2, PsW); one whose gradient counts waits for the update (K-async, Fig. 5).
        """
        return ps.follows(self.schedule, batch)

    def _commit(
        self, batch: np.ndarray, fits: np.ndarray, closes: bool, carry_on: bool = False
    ) -> tuple[np.ndarray, ...]:
        """Record the batch and start follow-up jobs; who finishes as the step closes waits
        for the update, so that it starts from the new version, unless ``carry_on``."""
        # indexing by an array copies: the record keeps these as they are now
        done = self.finish[batch]
        record = (batch, self.version[batch], self.start[batch], done, self.job[batch], fits)
        # who finishes at the batch's last instant is held (``ps.Delivered``), unless carry_on
        hold = (done == done[-1]) & (not carry_on)
        self.cancel(batch)
        self._deliver(batch, done, hold)
        if not closes:
            held = self.schedule.asking[batch]
            self._waiting = np.concatenate([self._waiting, batch[hold & held]])
            self._waiting_since = done[-1]
            return record
        if carry_on and self._waiting.size:  # they finished at the closing instant: go on too
            self._ask(self._waiting, self._waiting_since)
        self._waiting = np.empty(0, dtype=np.int64)
        return record

    def partial_work(self, version: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
        """Blocks of s completed by the workers still on ``version`` at ``now`` (LGC Alg. 1).

        LGC Eq. (6)'s r: the mini-batch is split into s blocks of equal work, processed in
        order. Without micro-batches the work runs at a constant rate, so r = floor(s e / d)
        for e seconds elapsed of a d-second job. With M micro-batches, c of them completed by
        ``now`` (from their real cumulative times), block b is done once the micro-batches
        holding its share of the work are, i.e. once c >= b M / s: r = floor(s c / M).
        r stays below s, since the job has not finished.
        """
        busy = self.busy_on(version)
        elapsed = self.now - self.start[busy]
        total = np.maximum(self.finish[busy] - self.start[busy], np.finfo(float).tiny)
        if self.progress is None:
            done = np.floor(blocks * elapsed / total)
        else:
            micro = self.progress.shape[1]
            finished = (self.progress[busy] * total[:, None] <= elapsed[:, None]).sum(axis=1)
            done = (blocks * finished) // micro
        return busy, np.clip(done, 0, blocks - 1).astype(np.int64)


def _by_time(times: np.ndarray) -> np.ndarray:
    """The order of ``times`` (of workers in ascending order), ties by worker: a stable sort.
    Where no two times tie, any sort gives that order, and a plain one is ~4x faster at 2048
    workers; so it runs first, and the stable sort only where times tie (const delays)."""
    order = np.argsort(times)
    ranked = times[order]
    if (ranked[1:] == ranked[:-1]).any():
        return np.argsort(times, kind="stable")
    return order

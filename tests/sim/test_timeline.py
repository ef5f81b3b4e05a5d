"""The vectorised timeline against a plain one-event-at-a-time reference simulator."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.delays.schedule import JobDurations
from tailtrain.sim.ps.timeline import ServerTimeline
from tailtrain.strategies.base import SyncMode


class TableProcess:
    """A delay process that serves a fixed table of durations (rows = successive jobs)."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table
        self.row = 0

    def next_block(self, iterations: int) -> np.ndarray:
        rows = np.arange(self.row, self.row + iterations) % len(self.table)
        self.row += iterations
        return self.table[rows]

    def time_factor(self, starts: np.ndarray, workers: np.ndarray) -> np.ndarray:
        return np.ones(len(workers))


def reference(table, n, ks, mode: SyncMode, accept_stale: bool, drain: bool = False):
    """One event at a time with a heap: the obvious, slow semantics the timeline must match.

    After delivering, a worker: under push, waits for the update if its gradient counted and
    takes the current version if it was dropped as stale (K-async counts a worker once per
    step); under pull, takes a new job at once, at the current version when stale gradients
    count (K-batch-async), else on the oldest token of DBW's PI queue (n tokens per update),
    or waits for the update if no token is left. ``drain``: a step also waits for every job
    of an older version, and a worker that delivers one goes on to the current version.
    """
    tokens_used = not mode.interrupts and mode.refills and not accept_stale
    jobs = np.zeros(n, dtype=int)
    busy: dict[int, tuple[int, float, float]] = {}
    heap: list[tuple[float, int]] = []
    queue: deque[int] = deque()  # one entry per token: its version
    now, out = 0.0, []

    def launch(w, v, t):
        if tokens_used:
            if not queue:
                return  # no token: idle until the next update
            v = queue.popleft()
        d = table[jobs[w] % len(table), w]
        jobs[w] += 1
        busy[w] = (v, t, t + d)
        heapq.heappush(heap, (t + d, w))

    for version, k in enumerate(ks):
        if mode.interrupts:
            busy.clear()
            heap.clear()
        queue.extend([version] * n)
        for w in range(n):
            if w not in busy:
                launch(w, version, now)
        got, events, pending = 0, [], []
        while got < k or (drain and any(v < version for v, _, _ in busy.values())):
            t, w = heap[0] if heap else (np.inf, -1)
            if pending and pending[0][1] < t:
                # follow-ups start once no event of their own instant remains
                launch(pending[0][0], version, pending.pop(0)[1])
                continue
            heapq.heappop(heap)
            v, _s, f = busy.pop(w)
            usable = accept_stale or v == version
            events.append((w, v, f, usable))
            got += usable
            if mode.refills or not usable:
                pending.append((w, f))
        # who finished as the step closed waits for the update (starts on the next version)
        now = events[-1][2]
        if drain:
            for w, f in pending:
                launch(w, version, f)
        out.append(events)
    return out


def run_timeline(table, n, ks, mode, accept_stale, drain=False):
    tl = ServerTimeline(JobDurations(TableProcess(table), n), n)
    out = []
    for version, k in enumerate(ks):
        tl.begin(version, mode, accept_stale)
        got = tl.collect(k, version, accept_stale, drain=drain)
        a = got.arrivals
        out.append(
            list(
                zip(
                    a.worker.tolist(),
                    a.version.tolist(),
                    a.finish.tolist(),
                    got.usable.tolist(),
                    strict=True,
                )
            )
        )
    return out


MODES = [
    (SyncMode.PSI, False),
    (SyncMode.PSW, False),
    (SyncMode.PSW, True),
    (SyncMode.PULL, True),
    (SyncMode.PULL, False),
    (SyncMode.PULL_INTERRUPT, False),
]


@pytest.mark.parametrize(("mode", "accept_stale"), MODES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_timeline_matches_one_event_at_a_time(mode, accept_stale, data):
    n = data.draw(st.integers(1, 6))
    seed = data.draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    # rounded durations make ties frequent; ties must break the same way (time, then worker)
    table = np.round(rng.exponential(1.0, size=(300, n)) + 0.05, 1)
    ks = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=12))
    assert run_timeline(table, n, ks, mode, accept_stale) == reference(
        table, n, ks, mode, accept_stale
    )


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_draining_stragglers_matches_one_event_at_a_time(data):
    n = data.draw(st.integers(1, 6))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    table = np.round(rng.exponential(1.0, size=(300, n)) + 0.05, 1)
    ks = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=12))
    got = run_timeline(table, n, ks, SyncMode.PSW, False, drain=True)
    assert got == reference(table, n, ks, SyncMode.PSW, False, drain=True)


def test_a_straggler_drained_at_the_closing_instant_goes_on_to_this_version():
    """Worker 0's stale job ends at 12.5, the instant the step's k-th arrival closes it; a
    drained straggler goes on to the current version, not the next (found by hypothesis)."""
    n, ks = 3, [1, 1, 1, 1, 3, 1, 2, 1]
    table = np.round(np.random.default_rng(500).exponential(1.0, size=(300, n)) + 0.05, 1)
    got = run_timeline(table, n, ks, SyncMode.PSW, False, drain=True)
    assert got == reference(table, n, ks, SyncMode.PSW, False, drain=True)
    assert got[-1][0] == (0, 6, 12.7, False)


def test_push_and_wait_hand_example():
    # worker 0 takes 1 s, worker 1 takes 2 s, worker 2 takes 5 s per job; k = 2
    table = np.tile([1.0, 2.0, 5.0], (10, 1))
    steps = run_timeline(table, 3, [2, 2, 2], SyncMode.PSW, False)
    assert steps[0] == [(0, 0, 1.0, True), (1, 0, 2.0, True)]
    assert steps[1] == [(0, 1, 3.0, True), (1, 1, 4.0, True)]
    # worker 2's stale gradient of version 0 arrives at 5 s, between the fresh ones
    assert steps[2] == [(0, 2, 5.0, True), (2, 0, 5.0, False), (1, 2, 6.0, True)]


def drive(table, n, ks, mode, accept_stale, drain=False):
    """Run the timeline and rebuild every job it ran: (worker, job, start, end, finished)."""
    tl = ServerTimeline(JobDurations(TableProcess(table), n), n)
    jobs = []

    def running(finished: bool):
        busy = np.flatnonzero(tl.version >= 0)
        end = tl.finish[busy] if finished else np.full(busy.size, tl.now)
        return list(
            zip(busy, tl.job[busy], tl.start[busy], end, [finished] * busy.size, strict=True)
        )

    for version, k in enumerate(ks):
        if mode.interrupts:
            jobs += running(False)  # cut short at the update
        tl.begin(version, mode, accept_stale)
        got = tl.collect(k, version, accept_stale, drain=drain)
        a = got.arrivals
        jobs += list(zip(a.worker, got.jobs, a.start, a.finish, [True] * len(a), strict=True))
    return jobs + running(True)


MODES_AND_DRAIN = [(m, s, False) for m, s in MODES] + [(SyncMode.PSW, False, True)]


@pytest.mark.parametrize(("mode", "accept_stale", "drain"), MODES_AND_DRAIN)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_no_worker_ever_runs_two_jobs_at_once(mode, accept_stale, drain, data):
    n = data.draw(st.integers(1, 8))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    scale = data.draw(st.sampled_from([0.1, 1.0]))  # coarse rounding makes many ties
    table = np.round(rng.exponential(1.0, size=(300, n)) + 0.05, 1) * scale
    ks = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=15))
    jobs = drive(table, n, ks, mode, accept_stale, drain)
    for w in range(n):
        mine = sorted((j for j in jobs if j[0] == w), key=lambda j: (j[2], j[1]))
        ids = [j[1] for j in mine]
        assert ids == sorted(set(ids)), "a job ran twice or out of order"
        for (_, job, start, end, finished), nxt in zip(mine, [*mine[1:], None], strict=True):
            duration = table[job % len(table), w]
            assert end <= start + duration + 1e-9
            if finished:
                assert end == pytest.approx(start + duration)
            if nxt is not None:
                assert nxt[2] >= end - 1e-9, f"worker {w} overlaps: {(start, end)} and {nxt}"


@pytest.mark.parametrize("scale", [0.1, 1.0])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_pull_starts_at_most_n_jobs_of_a_version(scale, data):
    # DBW §2 PI: n tokens per update, so at most n gradients of any one version, in total
    n = data.draw(st.integers(1, 8))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    table = np.round(rng.exponential(1.0, size=(300, n)) + 0.05, 1) * scale
    ks = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=15))
    jobs = drive(table, n, ks, SyncMode.PULL, False)
    steps = run_timeline(table, n, ks, SyncMode.PULL, False)
    versions = [v for step in steps for _, v, _, _ in step]
    assert max(np.bincount(versions)) <= n
    assert len(jobs) <= n * len(ks)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_partial_blocks_count_real_micro_batch_times(data):
    # LGC Eq. (6) with M micro-batches: block b of s is done once c >= b M / s micro-batches
    # are, so r = floor(s c / M), counted here from the drawn micro-batch times themselves
    n = data.draw(st.integers(2, 6))
    micro = data.draw(st.integers(1, 9))
    s = data.draw(st.integers(1, 6))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    table = rng.lognormal(0.0, 1.0, size=(50, n, micro))  # uneven micro-batches
    tl = ServerTimeline(JobDurations(TableProcess(table), n), n)
    for version, k in enumerate(data.draw(st.lists(st.integers(1, n - 1), min_size=1))):
        tl.begin(version, SyncMode.PSI, False)
        tl.collect(k, version, False)
        workers, blocks = tl.partial_work(version, s)
        for w, r in zip(workers, blocks, strict=True):
            ends = tl.start[w] + np.cumsum(table[tl.job[w] % len(table), w])
            done = int((ends <= tl.now).sum())
            assert r == min(s * done // micro, s - 1)
        assert set(workers) == {w for w in range(n) if tl.version[w] == version}

"""Properties of the parameter server's scheduling transition (``topology.ps``), over random
event sequences: one worker an event (the runtime) or many (the simulator)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.errors import TailtrainError
from tailtrain.strategies.base import SyncMode, uses_tokens
from tailtrain.topology import ps
from tailtrain.topology.ps import IDLE, Phase, Schedule

MODES = list(SyncMode)


@st.composite
def runs(draw):
    """A worker count, a mode, and a legal sequence of events (built against the schedule)."""
    n = draw(st.integers(1, 6))
    mode = draw(st.sampled_from(MODES))
    stale = draw(st.booleans())
    choices = draw(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5), st.booleans()),
                            max_size=60))  # fmt: skip
    return n, mode, stale, choices


def play(n, mode, stale, choices):
    """Yield (before, event, after, starts) along a legal event sequence: updates come in
    order, only BUSY workers deliver, only ASKING ones are asked."""
    s = Schedule.fresh(n)
    version = 0
    events: list[ps.Event] = [ps.Update(0, mode, stale)]
    for kind, pick, flag in choices:
        busy = [w for w in range(n) if s.phase(w) is Phase.BUSY]
        asking = [w for w in range(n) if s.phase(w) is Phase.ASKING]
        if events:
            event = events.pop()
        elif kind == 0 or not busy:
            version += 1
            event = ps.Update(version, mode, stale)
        elif kind == 1 and asking:
            event = ps.Ask(asking[pick % len(asking)])
        elif kind == 2 and flag:
            event = ps.Lost(busy[pick % len(busy)])
        else:
            event = ps.Delivered(busy[pick % len(busy)], hold=flag)
        after, starts = ps.transition(s, event)
        yield s, event, after, starts
        s = after


@settings(max_examples=300, deadline=None)
@given(runs())
def test_every_worker_computes_one_job_or_none(run):
    for before, event, after, starts in play(*run):
        started = Counter(a.worker for a in starts)
        freed = event.worker if isinstance(event, ps.Delivered) else None
        assert max(started.values(), default=0) <= 1  # one job per worker per event
        for a in starts:
            # only an interrupt replaces a running job; a free worker is simply started
            running = before.phase(a.worker) is Phase.BUSY and a.worker != freed
            assert running == a.cancels
            assert after.phase(a.worker) is Phase.BUSY and after.jobs[a.worker] == a.version
        for w in range(after.n):
            assert after.phase(w) in Phase
            assert not (after.asking[w] and after.jobs[w] != IDLE)
            if w not in started and after.jobs[w] != IDLE:
                assert after.jobs[w] == before.jobs[w]  # no job changes without a Start


@settings(max_examples=300, deadline=None)
@given(runs())
def test_tokens_start_at_most_n_jobs_of_a_version_and_never_a_newer_one(run):
    n, mode, stale, _ = run
    per_version: Counter[int] = Counter()
    for before, _, after, starts in play(*run):
        for a in starts:
            assert a.version <= after.version
            if not uses_tokens(mode, stale):
                assert a.version == after.version  # no queue: always the newest version
            per_version[a.version] += 1
        versions = [v for v, _ in after.tokens]  # FIFO: oldest first, no empty run
        assert versions == sorted(versions) and all(c > 0 for _, c in after.tokens)
        del before
    if uses_tokens(mode, stale):
        assert max(per_version.values(), default=0) <= n  # DBW §2 footnote 3


@settings(max_examples=300, deadline=None)
@given(runs())
def test_interrupt_mode_never_leaves_a_stale_job_running(run):
    _, mode, _, _ = run
    for _, event, after, _ in play(*run):
        if mode.interrupts:
            assert all(j in (IDLE, after.version) for j in after.jobs)
        if isinstance(event, ps.Update) and not uses_tokens(mode, event.accept_stale):
            # every free worker starts at the update: nobody idles while a version waits
            assert all(after.phase(w) is Phase.BUSY for w in range(after.n))


@settings(max_examples=300, deadline=None)
@given(runs())
def test_push_counts_a_fresh_worker_once_per_step(run):
    _, mode, stale, _ = run
    for before, event, after, starts in play(*run):
        if not isinstance(event, ps.Delivered):
            continue
        w = event.worker
        fresh = before.jobs[w] == before.version
        if not mode.refills and (fresh or stale):
            assert not starts and after.phase(w) is Phase.IDLE  # waits for the update
        if event.hold:
            assert not starts  # a held worker is served by Ask or the update


def test_token_queue_serves_the_oldest_version_first():
    s = Schedule.fresh(2)
    s, starts = ps.transition(s, ps.Update(0, SyncMode.PULL, False))
    assert [(a.worker, a.version) for a in starts] == [(0, 0), (1, 0)]
    s, _ = ps.transition(s, ps.Delivered(0, hold=True))  # closes step 0, held
    s, starts = ps.transition(s, ps.Update(1, SyncMode.PULL, False))
    assert [(a.worker, a.version) for a in starts] == [(0, 1)]
    assert s.tokens == ((1, 1),)
    s, starts = ps.transition(s, ps.Delivered(1))  # stale, dropped: takes version 1's token
    assert [(a.worker, a.version) for a in starts] == [(1, 1)]
    s, starts = ps.transition(s, ps.Delivered(1))  # no token left: waits for the update
    assert not starts and s.phase(1) is Phase.IDLE


def test_the_server_leaves_a_dead_worker_out():
    s = Schedule.fresh(3)
    s, starts = ps.transition(s, ps.Update(0, SyncMode.PULL, False, frozenset({1})))
    assert [a.worker for a in starts] == [0, 2] and s.tokens == ()
    s, _ = ps.transition(s, ps.Lost(0))
    assert s.phase(0) is Phase.IDLE


def one_by_one(s, events):
    """``events`` applied one after the other: the schedule after them and every start."""
    starts = []
    for event in events:
        s, started = ps.transition(s, event)
        starts += list(started)
    return s, starts


def same_schedule(a, b):
    return (a.version, a.tokens, a.mode, a.accept_stale) == (
        b.version,
        b.tokens,
        b.mode,
        b.accept_stale,
    ) and (a.jobs.tolist(), a.asking.tolist()) == (b.jobs.tolist(), b.asking.tolist())


@settings(max_examples=300, deadline=None)
@given(runs(), st.randoms(use_true_random=False))
def test_an_event_of_several_workers_is_their_events_one_by_one(run, rnd):
    """The simulator's batches (``Delivered``, ``Ask``, ``Lost`` of many workers, one pass
    over arrays) and the runtime's single events are one rule: a batch does what its events
    do in order, and ``follows`` says who of a batch starts at once."""
    for before, _, _, _ in play(*run):
        busy = [w for w in range(before.n) if before.phase(w) is Phase.BUSY]
        rnd.shuffle(busy)
        busy = busy[: rnd.randint(0, len(busy))]
        holds = [rnd.random() < 0.5 for _ in busy]
        workers = np.array(busy, dtype=np.int64)
        batch = ps.transition(before, ps.Delivered(workers, np.array(holds, dtype=bool)))
        events = [ps.Delivered(w, h) for w, h in zip(busy, holds, strict=True)]
        single = one_by_one(before, events)
        assert same_schedule(batch[0], single[0]) and list(batch[1]) == single[1]
        s, followed = before, []
        for w in busy:  # none held: does each start at once, after those before it?
            s, started = ps.transition(s, ps.Delivered(w))
            followed.append(len(started) > 0)
        assert ps.follows(before, workers).tolist() == followed
        anyone = list(range(before.n))
        rnd.shuffle(anyone)  # asking or not: only the asking are served
        for kind in (ps.Ask, ps.Lost):
            batch = ps.transition(before, kind(np.array(anyone, dtype=np.int64)))
            single = one_by_one(before, [kind(w) for w in anyone])
            assert same_schedule(batch[0], single[0]) and list(batch[1]) == single[1]


def test_an_event_names_each_worker_once():
    s, _ = ps.transition(Schedule.fresh(3), ps.Update(0, SyncMode.PULL, True))
    with pytest.raises(TailtrainError, match="twice"):
        ps.transition(s, ps.Delivered(np.array([1, 2, 1])))
    with pytest.raises(TailtrainError, match="without a job"):
        ps.transition(ps.Schedule.fresh(2), ps.Delivered(np.array([0, 1])))


def test_a_schedule_is_immutable_and_takes_ints_as_a_checkpoint_held_them():
    """Checkpoints written when the schedule held tuples of ints load as arrays."""
    s = Schedule(2, (1, IDLE, 2), (False, True, False), ((2, 1),), SyncMode.PULL.value)
    assert s.jobs.dtype == np.int64 and s.asking.dtype == bool
    assert s.phase(0) is Phase.BUSY and s.phase(1) is Phase.ASKING
    with pytest.raises(ValueError):
        s.jobs[0] = 3
    after, starts = ps.transition(s, ps.Ask(1))
    assert [tuple(a) for a in starts] == [(1, 2, False)] and s.phase(1) is Phase.ASKING
    assert after.tokens == () and after.jobs.tolist() == [1, 2, 2]

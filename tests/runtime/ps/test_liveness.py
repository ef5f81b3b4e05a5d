"""The parameter server's liveness bookkeeping, without processes: suspicion, death, rejoin,
the cap on k and the step row's columns (``runtime.ps.liveness``)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from tailtrain.errors import TailtrainError
from tailtrain.runtime.ps import wire as ps_wire
from tailtrain.runtime.ps.liveness import MIN_BOUND, Liveness, WorkerState, failure_reason


class Pings:
    def __init__(self) -> None:
        self.sent: list[int] = []


def liveness(n: int = 4, timeout: float = 30.0, worker_timeout: float | None = 1.0):
    pings = Pings()
    live = Liveness(n, timeout, worker_timeout)
    live.ping = pings.sent.append  # the outbox's PING, recorded
    return live, pings


def test_a_silent_busy_worker_is_suspected_pinged_every_bound_and_k_is_capped():
    live, pings = liveness()
    busy = np.array([True, True, False, True])
    start = np.array([0.0, 0.2, 0.0, 1.5])
    assert live.watch(busy, start, 0.9) == pytest.approx(0.1)  # worker 0's bound ends at 1.0
    assert live.cap(4) == 4 and pings.sent == []
    assert live.watch(busy, start, 1.1) == pytest.approx(0.1)  # worker 1's at 1.2
    alive, suspect = WorkerState.ALIVE, WorkerState.SUSPECT
    assert live.state.tolist() == [suspect, alive, alive, alive] and pings.sent == [0]
    assert live.cap(4) == 3 and live.cap(2) == 2
    live.watch(busy, start, 1.5)  # worker 1 suspected; worker 0's next PING is due at 2.1
    assert pings.sent == [0, 1]
    live.watch(busy, start, 2.15)
    assert pings.sent == [0, 1, 0]
    assert live.take_events() == {"suspect": [0, 1], "live": 2}
    assert live.take_events() == {"live": 2}  # a clean slate, still two missing


def test_a_suspect_that_speaks_rejoins_and_a_lost_one_is_dead_once():
    live, _ = liveness()
    live.watch(np.ones(4, bool), np.zeros(4), 1.5)
    assert live.cap(4) == 1  # every worker suspected: the next arrival closes the step
    live.heard(2)
    assert live.lost(3, "Connection closed by peer") and not live.lost(3, "again")
    live.heard(3)  # the dead stay dead
    assert live.take_events() == {"suspect": [0, 1, 2, 3], "rejoined": [2], "dead": [3], "live": 1}
    assert live.summary() == {"dead_workers": [3], "hung_workers": [0, 1, 2, 3], "rejoins": 1}
    assert live.reasons == {3: "Connection closed by peer"}


def test_the_default_bound_follows_the_longest_round_trip_within_its_limits():
    live, _ = liveness(timeout=5.0, worker_timeout=None)
    assert live.bound == MIN_BOUND
    live.delivered(0, 0.35)
    assert live.bound == pytest.approx(3.5)
    live.delivered(1, 0.9)
    assert live.bound == 5.0  # never more than --timeout
    live.hung.add(2)
    live.delivered(2, 100.0)  # a rejoining worker's round trip includes its hang: not counted
    assert live.longest == 0.9
    assert liveness(timeout=5.0, worker_timeout=9.0)[0].bound == 5.0


def test_without_events_a_row_gets_no_liveness_columns():
    live, _ = liveness()
    live.watch(np.ones(4, bool), np.zeros(4), 0.5)
    live.delivered(1, 0.5)
    assert live.take_events() == {}


def test_a_failed_sends_reason_is_its_first_sentence_without_gloos_source_location():
    text = "[/x/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1. This is"
    assert failure_reason(RuntimeError(text)) == "Connection closed by peer [127.0.0.1]:1"
    assert failure_reason(RuntimeError("")) == "RuntimeError"


def test_with_no_worker_alive_the_server_waits_one_timeout_then_names_the_workers():
    live, _ = liveness(n=4, timeout=30.0)
    assert live.unanswered(0.5) == np.inf
    live.watch(np.array([True, True, False, True]), np.zeros(4), 1.5)  # 0, 1, 3 suspected
    assert live.unanswered(1.5) == np.inf  # worker 2, idle, is still ALIVE
    live.lost(2)
    assert live.unanswered(2.0) == pytest.approx(30.0)
    live.heard(1)  # a suspect answered: the wait starts over when it falls silent again
    assert live.unanswered(20.0) == np.inf
    live.watch(np.array([True, True, False, True]), np.full(4, 19.0), 21.0)
    assert live.unanswered(21.0) == pytest.approx(30.0)
    assert live.unanswered(50.0) == pytest.approx(1.0)
    with pytest.raises(TailtrainError, match=r"^no worker answered for 30 s: workers 0, 1, 3 "):
        live.unanswered(51.0)
    with pytest.raises(TailtrainError) as caught:
        live.unanswered(51.0)
    assert str(caught.value) == "no worker answered for 30 s: workers 0, 1, 3 suspect, 2 dead"


def test_a_ping_is_a_header_on_its_own_tag_and_never_queues_behind_a_pending_send(monkeypatch):
    """A frozen worker reads nothing: a send to it stays on the wire. No PING may join it
    (pings piling into its socket would block the server's one sending thread)."""
    sent: list[tuple[int, int, int]] = []
    stuck = threading.Event()

    def send(buffer, dst, tag):
        sent.append((buffer.numel(), dst, tag))
        if dst == 2:
            stuck.wait(30)  # worker 1's socket is full

    monkeypatch.setattr(ps_wire.dist, "send", send)
    outbox = ps_wire.Outbox(1000, torch.float32, 30.0)
    live = Liveness(3, 30.0, 1.0)
    live.connect(outbox, None)
    try:
        live.ping(0)
        live.ping(1)
        _until(lambda: len(sent) == 2 and outbox.pending(1) == 0)
        assert sent == [(ps_wire.HEADER, 1, ps_wire.PROBE), (ps_wire.HEADER, 2, ps_wire.PROBE)]
        assert outbox.pending(2) == 1  # still on the wire
        for _ in range(5):
            live.ping(1)
        assert outbox.pending(2) == 1
        live.ping(0)  # worker 0 answers its probes: it is pinged again
        assert outbox.pending(1) + len(sent) >= 3
    finally:
        stuck.set()
    _until(lambda: outbox.pending(2) == 0 and outbox.pending(1) == 0)
    assert len(sent) == 3


def _until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)

"""Dead and hung workers on the parameter server: who can still deliver, and k capped at that.

A killed or frozen worker must not stop a parameter-server run (issue 14). The server keeps
one state per worker:

* ALIVE. A BUSY, ALIVE worker that has sent nothing for longer than the bound since its job
  started becomes SUSPECT (hung): logged, recorded in the step's ``suspect`` column, and sent
  a PING at once and every bound after (header only, on its own tag; the worker's probe
  thread drops it). No PING leaves while an earlier send to that worker is still queued or
  on the wire: a frozen (SIGSTOP) worker reads nothing, and pings piling into its socket
  would at last block the server's one sending thread, and with it every healthy worker.
* DEAD: a send to the worker or a receive from it failed (a JOB, a PING, STOP; its gradient),
  so its connection is closed and its process is gone (column ``dead``). gloo (tcp transport,
  torch 2.x) was checked for this: a send to or a receive from the dead peer fails at once,
  while the others' go on. An any-source receive goes on hearing the others when a peer
  closes its connection, but not when the connection is reset mid-message (a worker dying
  with its gradient on the wire): then it fails, posted again or not. So the server receives
  from each worker on a thread of its own (``runtime.ps.wire``), and learns of a death from
  that thread or its sends, the PING making one when nothing else would: a killed worker,
  whose connection closes, is found dead at once; one whose connection stays open (a frozen
  or unreachable host) is SUSPECT one bound after it last started a job.
* Any message from a SUSPECT worker makes it ALIVE again (column ``rejoined``): its gradient
  is an arrival like any other, used if the version rules allow (K-async takes it, stale;
  K-sync drops it), and its next job follows as usual.

Every wait is bounded by ``--timeout``: when no worker has been ALIVE for that long and none
has answered, the run stops with an error naming the suspect and dead workers
(:meth:`Liveness.unanswered`).

The bound is ``--worker-timeout`` seconds or, by default, ``FACTOR`` times the longest round
trip a never-suspected worker has delivered, at least ``MIN_BOUND`` seconds; never more than
``--timeout``.

The cap: a step closes with min(k, ALIVE workers) usable arrivals (at least one). The rule is
not told: its plan and k stay its own (the row's ``k``), only the server closes earlier, so
every rule keeps one implementation, and a run in which every worker stays ALIVE closes its
steps exactly as ``sim.ps.timeline`` does. (A worker silent past the bound without any fault,
a straggler 10 times slower than any round trip seen, is suspected too; it rejoins when it
delivers.)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import numpy as np

from tailtrain.errors import TailtrainError
from tailtrain.runtime.ps.wire import DOWN, Kind, Mailbox, Message, Outbox, receive_report

log = logging.getLogger(__name__)


class WorkerState(StrEnum):
    """A worker as the server sees it (the module docstring has the transitions). The server
    keeps one per worker in ``Liveness.state``, an array of these strings; none goes over the
    wire (a PING is a message kind, ``runtime.ps.wire.Kind``)."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


#: the dtype of ``Liveness.state``: the longest state's string
STATE_DTYPE = f"<U{max(len(s) for s in WorkerState)}"
#: the default bound: this many times the longest round trip delivered so far ...
FACTOR = 10.0
#: ... and at least this many seconds
MIN_BOUND = 2.0
#: the step row's columns of liveness events (present only on a step that had one)
LIVENESS_COLUMNS = ("suspect", "rejoined", "dead")


class Liveness:
    """The server's view of which of ``workers`` workers can still deliver, and the end of
    the run that waits only for those (STOP, BYE, each worker's report).

    :meth:`failed` is the server's ``Outbox`` and ``Mailbox`` error handler (the sending
    thread, a worker's receiving thread) and :meth:`last` its ``Mailbox``'s last-message test
    (a worker's receiving thread, before the message is queued); every other method runs on
    the server's main thread, after :meth:`connect`."""

    def __init__(self, workers: int, timeout: float, worker_timeout: float | None) -> None:
        self.state = np.full(workers, WorkerState.ALIVE, dtype=STATE_DTYPE)
        self.timeout, self.worker_timeout = timeout, worker_timeout
        self.said_bye = np.zeros(workers, dtype=bool)
        self.outbox: Outbox | None = None
        self.mailbox: Mailbox | None = None
        self.longest = 0.0
        self.pinged = np.full(workers, -np.inf)
        self.events: dict[str, list[int]] = {c: [] for c in LIVENESS_COLUMNS}
        self.hung: set[int] = set()
        self.rejoins = 0
        #: since when no worker has been ALIVE (the server's clock; None: some worker is)
        self.silent_since: float | None = None
        #: why each dead worker is dead (the failed send's first line)
        self.reasons: dict[int, str] = {}

    def connect(self, outbox: Outbox, mailbox: Mailbox) -> None:
        self.outbox, self.mailbox = outbox, mailbox

    def last(self, message: Message) -> bool:
        """A worker's receiving thread's test: its BYE ends it."""
        if message.kind is Kind.BYE:
            self.said_bye[message.worker] = True
            return True
        return False

    def failed(self, dst: int, exc: BaseException) -> None:
        """A send to rank ``dst`` or a receive from it failed (the sending thread, or that
        worker's receiving thread): worker dst - 1 is LOST."""
        assert self.mailbox is not None
        self.reasons.setdefault(dst - 1, failure_reason(exc))
        self.mailbox.put(Message(Kind.LOST, dst - 1))

    def ping(self, worker: int) -> None:
        """PING ``worker`` unless a send to it is still pending (module docstring)."""
        assert self.outbox is not None
        if not self.outbox.pending(worker + 1):
            self.outbox.probe(Message(Kind.PING, worker), worker + 1)

    @property
    def bound(self) -> float:
        """Seconds of silence after which a busy worker is suspected (module docstring)."""
        if self.worker_timeout is not None:
            return min(self.worker_timeout, self.timeout)
        return min(self.timeout, max(MIN_BOUND, FACTOR * self.longest))

    @property
    def alive(self) -> np.ndarray:
        return self.state == WorkerState.ALIVE

    @property
    def dead(self) -> np.ndarray:
        return self.state == WorkerState.DEAD

    def cap(self, k: int) -> int:
        """The usable arrivals that close a step: the rule's k, at most the ALIVE workers."""
        return min(k, max(1, int(self.alive.sum())))

    def delivered(self, worker: int, round_trip: float) -> None:
        """A job's round trip, for the default bound (a once-hung worker's do not count)."""
        if worker not in self.hung:
            self.longest = max(self.longest, round_trip)

    def heard(self, worker: int) -> None:
        """A message from ``worker``: a suspect rejoins."""
        if self.state[worker] == WorkerState.SUSPECT:
            self.state[worker] = WorkerState.ALIVE
            self.events["rejoined"].append(worker)
            self.rejoins += 1
            log.warning("worker %d rejoined; %d workers live", worker, self.alive.sum())

    def watch(self, busy: np.ndarray, start: np.ndarray, now: float) -> float:
        """Suspect the busy workers silent past the bound since ``start`` (the server's clock),
        ping the suspects that are due; the seconds until the next check is due."""
        bound = self.bound
        watched = self.alive & busy
        for w in np.flatnonzero(watched & (now - start > bound)).tolist():
            self.state[w] = WorkerState.SUSPECT
            self.events["suspect"].append(w)
            self.hung.add(w)
            self.pinged[w] = -np.inf
            watched[w] = False
            log.warning(
                "worker %d sent nothing for %.2fs (bound %.2fs): suspected hung; k capped at "
                "%d live workers",
                w,
                now - start[w],
                bound,
                self.alive.sum(),
            )
        due = start[watched]
        if self.hung:  # else no worker is SUSPECT: nothing to ping
            suspects = self.state == WorkerState.SUSPECT
            for w in np.flatnonzero(suspects & (now - self.pinged >= bound)).tolist():
                self.pinged[w] = now
                self.ping(w)
            due = np.concatenate([due, self.pinged[suspects]])
        return float(due.min() + bound - now) if due.size else bound

    def unanswered(self, now: float) -> float:
        """The seconds the server may still wait with no worker ALIVE (inf while one is): at
        ``--timeout`` after the last one was suspected or lost, stop with a one-line error."""
        if self.alive.any():
            self.silent_since = None
            return np.inf
        if self.silent_since is None:
            self.silent_since = now
        left = self.silent_since + self.timeout - now
        if left <= 0:
            groups = [
                (state.value, np.flatnonzero(self.state == state).tolist())
                for state in (WorkerState.SUSPECT, WorkerState.DEAD)
            ]
            parts = [f"{', '.join(map(str, ws))} {name}" for name, ws in groups if ws]
            who = "worker" if len(self.state) == 1 else "workers"
            raise TailtrainError(
                f"no worker answered for {self.timeout:g} s: {who} {', '.join(parts)}"
            )
        return left

    def lost(self, worker: int, reason: str = "") -> bool:
        """``worker``'s connection failed: it is dead. Whether that is news."""
        if self.state[worker] == WorkerState.DEAD:
            return False
        self.state[worker] = WorkerState.DEAD
        self.events["dead"].append(worker)
        self.reasons.setdefault(worker, reason or "gone")
        log.warning(
            "worker %d is dead (%s); %d workers live",
            worker,
            self.reasons[worker],
            self.alive.sum(),
        )
        return True

    def stop(self, clock: Callable[[], float]) -> None:
        """STOP to every worker not dead, then their BYEs (and any message still coming);
        a worker without a BYE one bound after the STOP is given up: dead."""
        assert self.outbox is not None and self.mailbox is not None
        for w in np.flatnonzero(~self.dead).tolist():
            self.outbox.probe(Message(Kind.STOP, w), w + 1)  # ends its probe thread
            self.outbox.send(Message(Kind.STOP, w), w + 1, DOWN)
        self.outbox.flush()
        sent = clock()
        since = np.full(len(self.state), sent)
        while True:
            missing = ~(self.said_bye | self.dead)
            left = self.watch(missing, since, clock())
            if not missing.any() and not self.mailbox.wait(0.0):
                break
            if self.mailbox.wait(max(left, 1e-4)):
                message = self.mailbox.take(0.0)
                if message.kind is Kind.LOST:
                    self.lost(message.worker)
                else:
                    self.heard(message.worker)
            elif clock() - sent > self.bound:
                for w in np.flatnonzero(missing).tolist():
                    self.lost(w, "no BYE within the bound after STOP")
        if self.said_bye.all():  # else a worker's receiving thread may stay posted: a daemon
            self.mailbox.join(self.timeout)

    def reports(self) -> list[Any]:
        """Each worker's report (``runtime.ps.wire.send_report``), sent after its BYE; None for a
        worker that is dead."""
        parts: list[Any] = [None] * len(self.state)
        for w in np.flatnonzero(self.said_bye & ~self.dead).tolist():
            try:
                parts[w] = receive_report(w + 1)
            except Exception as exc:  # it died after its BYE
                self.lost(w, failure_reason(exc))
        return parts

    def take_events(self) -> dict[str, Any]:
        """The step row's liveness columns, then a clean slate: the events of the step, and
        ``live`` (ALIVE workers at the close) while any worker is missing."""
        row: dict[str, Any] = {c: v for c, v in self.events.items() if v}
        if not row and self.alive.all():  # the usual step: nothing to record
            return row
        row["live"] = int(self.alive.sum())
        self.events = {c: [] for c in LIVENESS_COLUMNS}
        return row

    def summary(self) -> dict[str, Any]:
        return {
            "dead_workers": np.flatnonzero(self.dead).tolist(),
            "hung_workers": sorted(self.hung),
            "rejoins": self.rejoins,
        }


def failure_reason(exc: BaseException) -> str:
    """A failed send's first sentence, without gloo's source location:
    ``[.../pair.cc:553] Connection closed by peer [127.0.0.1]:1234. This is...``."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip())
    return text.split(". ")[0].splitlines()[0] if text else type(exc).__name__

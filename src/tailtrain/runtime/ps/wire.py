"""The parameter server's wire: fixed-size point-to-point messages and their mailboxes.

Every message is one flat tensor in the model's dtype, ``[header (HEADER values), payload (D
values)]``, sent with ``torch.distributed.send`` on one tag per direction (``UP``: worker to
server, ``DOWN``: server to workers). The server receives from each worker on a thread of
its own: an any-source receive fails, and goes on failing when posted again, once one peer's
connection is reset mid-message (a worker that dies while its gradient is on the wire; checked
on gloo, torch 2.13), which would silence every healthy worker with it. Integers (jobs, versions)
travel exactly below 2^24 in float32 (``MAX_INDEX``). Liveness probes (PING, and the STOP
that ends a worker's probe thread) are header only, on their own tag ``PROBE``: a probe to a
frozen worker costs its socket a header, not a model (``runtime.ps.liveness``).

A :class:`Mailbox` is a thread per source that receives messages one after the other and
stamps each on arrival with this process's ``time.perf_counter()``, as it queues it (so the
queue is in stamp order across sources, and a source's last message is counted before the
main thread can take it), so stamps do not wait for the main thread; the main thread reads
them in order with bounded waits. Each thread keeps a receive posted: the server holds one
message's buffer (a model's size) per worker. gloo's ``irecv`` never reports
``is_completed()`` before ``wait()`` (torch 2.x), so a receiving thread, rather than polling,
is what makes an arrival visible at once. A blocking receive is bounded by the process
group's timeout (``--timeout``), except where no message is owed (``owed=False``: the probe
mailbox, which may hear nothing for a whole healthy run, and the server's, whose waits the
liveness rules bound, wait as long as it takes); a failure (most likely a peer that died) is
handed to ``on_error(src, exc)`` where one is given, and that source's thread ends while the
others go on (the server: ``Liveness.failed``, as for a failed send), else to the main thread
after ``runtime.reduce.GRACE`` seconds, so that the launcher names the rank that failed first.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import torch
import torch.distributed as dist

from tailtrain.errors import TailtrainError
from tailtrain.runtime.reduce import GRACE, UNBOUNDED_WAIT

#: tags of the two directions, of the clock handshake, and of the liveness probes
UP, DOWN, CLOCK, PROBE = 11, 12, 13, 14
#: round trips per worker to estimate its clock's offset from the server's (the shortest counts:
#: on a loaded machine a few are late by milliseconds)
PINGS = 16
#: header values before the payload
HEADER = 8
#: integers in a float32 header are exact below this
MAX_INDEX = 1 << 24


class Kind(IntEnum):
    """What a message says (header field ``KIND``)."""

    #: server -> worker: compute job ``job`` at ``version`` (payload: that version's model);
    #: a worker busy with another job drops it (an interrupt), and if ``blocks`` > 0 reports
    #: the blocks of job ``cancels`` it finished before this message arrived (LGC)
    JOB = 1
    #: server -> worker: stop now (payload unused)
    STOP = 2
    #: worker -> server: the whole gradient of ``job`` (payload), computed at ``version``
    GRAD = 3
    #: worker -> server: ``done`` of ``blocks`` blocks of ``job`` and the mean gradient
    #: over them (LGC Eq. 6); sent once for every JOB with ``blocks`` > 0 and ``cancels``
    PARTIAL = 4
    #: worker -> server: this worker has stopped and will send nothing more
    BYE = 5
    #: server -> worker on tag PROBE, header only: are you there? (the worker's probe thread
    #: drops it; a send that fails tells the server that the worker is gone,
    #: ``runtime.ps.liveness``); STOP on PROBE ends that thread
    PING = 6
    #: never on the wire: put in the server's own mailbox when a send to ``worker`` failed
    LOST = 7


@dataclass(frozen=True)
class Message:
    """One decoded message. Fields a kind does not use are 0 (``cancels``: -1)."""

    kind: Kind
    worker: int = 0
    job: int = 0
    version: int = 0
    #: JOB: units (micro-batches or blocks) to split the job into; GRAD/PARTIAL: units done
    units: int = 0
    #: JOB: blocks s to report on an interrupt (0: none); PARTIAL: s
    blocks: int = 0
    #: JOB: the job this one interrupts (-1: none); GRAD/PARTIAL: the mean loss
    aux: float = -1.0
    #: JOB: its start on the server's clock (for time-scheduled delays); GRAD: compute seconds
    seconds: float = 0.0
    payload: torch.Tensor | None = None
    #: when the receiving process got it (its own perf_counter)
    stamp: float = 0.0

    @property
    def cancels(self) -> int:
        return int(self.aux)

    @property
    def loss(self) -> float:
        return float(self.aux)


def encode(message: Message, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The flat tensor of ``message`` (a zero payload when it has none)."""
    for value in (message.job, message.version):
        if not -1 <= value < MAX_INDEX:
            raise TailtrainError(f"job or version {value} is beyond the wire's {MAX_INDEX}")
    head = torch.tensor(
        [
            message.kind,
            message.worker,
            message.job,
            message.version,
            message.units,
            message.blocks,
            message.aux,
            message.seconds,
        ],
        dtype=dtype,
    )
    body = torch.zeros(dim, dtype=dtype) if message.payload is None else message.payload
    return torch.cat([head, body.reshape(-1).to(dtype)])


def decode(buffer: torch.Tensor, stamp: float) -> Message:
    head = buffer[:HEADER].tolist()
    kind, worker, job, version, units, blocks, aux, seconds = head
    ints = (int(worker), int(job), int(version), int(units), int(blocks))
    return Message(Kind(int(kind)), *ints, aux, seconds, buffer[HEADER:], stamp)


def clock_server(workers: int, since: float = 0.0) -> float:
    """The server's half of the handshake: answer every worker's pings with its clock, then
    tell each the run's time zero (this clock, returned; ``since`` seconds ago for a resumed
    run, whose clock goes on). float64 messages, before any mailbox starts; every receive is
    bounded by the process group's timeout."""
    ping, now = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    for rank in range(1, workers + 1):
        for _ in range(PINGS):
            dist.recv(ping, src=rank, tag=CLOCK)
            now[0] = time.perf_counter()
            dist.send(now, dst=rank, tag=CLOCK)
    zero = time.perf_counter() - since
    for rank in range(1, workers + 1):
        dist.send(torch.tensor([zero], dtype=torch.float64), dst=rank, tag=CLOCK)
    return zero


def clock_worker() -> float:
    """A worker's half: the server's time zero on this worker's clock, with the offset of
    the shortest of ``PINGS`` round trips (Cristian's algorithm). Used only to aim injected
    delays; every measured time is the server's own."""
    best, offset = float("inf"), 0.0
    reply = torch.zeros(1, dtype=torch.float64)
    for _ in range(PINGS):
        sent = time.perf_counter()
        dist.send(torch.tensor([sent], dtype=torch.float64), dst=0, tag=CLOCK)
        dist.recv(reply, src=0, tag=CLOCK)
        back = time.perf_counter()
        if back - sent < best:
            best, offset = back - sent, float(reply[0]) - (sent + back) / 2
    dist.recv(reply, src=0, tag=CLOCK)
    return float(reply[0]) - offset


def send_report(report: Any) -> None:
    """A worker's last words to the server (its trace and counts), point to point: a
    collective would need the dead workers too."""
    dist.send_object_list([report], dst=0)


def receive_report(rank: int) -> Any:
    """Rank ``rank``'s :func:`send_report`; fails at once if that rank is dead."""
    box: list[Any] = [None]
    dist.recv_object_list(box, src=rank)
    return box[0]


class Mailbox:
    """Messages from ``src`` on ``tag``: one rank, None (any rank) or a tuple of ranks (a
    thread each), in one queue; a source's thread receives until ``last(message)`` says that
    one was its last. ``on_error(src, exc)``: where a source's receive failed (module
    docstring; not for ``src=None``, whose failure the main thread raises, nor is its wait
    ever unbounded); ``start=False``: the threads start at :meth:`start` (once ``on_error``
    can take a failure)."""

    def __init__(
        self,
        src: int | tuple[int, ...] | None,
        tag: int,
        size: int,
        dtype: torch.dtype,
        last: Callable[[Message], bool],
        owed: bool = True,
        on_error: Callable[[int, BaseException], None] | None = None,
        start: bool = True,
    ) -> None:
        self._items: collections.deque[Message] = collections.deque()
        self._owed = owed
        self._on_error = on_error
        self._ready = threading.Condition()
        self._error: BaseException | None = None
        self._args = (tag, size, dtype, last)
        self._threads = [
            threading.Thread(target=self._run, args=(one,), name="tailtrain-mailbox", daemon=True)
            for one in (src if isinstance(src, tuple) else (src,))
        ]
        if start:
            self.start()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _run(self, src: int | None) -> None:
        tag, size, dtype, last = self._args
        try:
            while True:
                buffer = torch.empty(size, dtype=dtype)
                if self._owed or src is None:
                    dist.recv(buffer, src=src, tag=tag)
                else:  # nothing is owed: wait however long, not --timeout
                    dist.group.WORLD.recv([buffer], src, tag).wait(UNBOUNDED_WAIT)
                with self._ready:  # stamped as queued: the queue stays in stamp order
                    message = decode(buffer, time.perf_counter())
                    if message.kind is Kind.PING:
                        continue  # a liveness probe: that it arrived is all it says
                    done = last(message)  # before the main thread can take it
                    self._items.append(message)
                    self._ready.notify_all()
                if done:
                    return
        except BaseException as exc:
            if self._on_error is not None and src is not None:
                self._on_error(src, exc)  # that source is gone; the other threads go on
                return
            # handed to the main thread, which raises it; most likely a peer died: let the
            # launcher name it first (``runtime.reduce``)
            time.sleep(GRACE)
            with self._ready:
                self._error = exc
                self._ready.notify_all()

    def put(self, message: Message) -> None:
        """Queue a message of this process's own (``Kind.LOST``)."""
        with self._ready:
            self._items.append(message)
            self._ready.notify_all()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a message; whether one is there (not taken)."""
        with self._ready:
            if not self._items and self._error is None and seconds > 0:
                self._ready.wait(seconds)
            self._raise()
            return bool(self._items)

    def take(self, timeout: float) -> Message:
        """The next message, waiting at most ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        with self._ready:
            while not self._items:
                self._raise()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TailtrainError(f"no message came within --timeout {timeout:g}s")
                self._ready.wait(left)
            return self._items.popleft()

    def _raise(self) -> None:
        if self._error is not None and not self._items:
            raise TailtrainError(f"receiving failed: {self._error}") from self._error

    def join(self, timeout: float) -> None:
        """Wait for every source's thread, ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))


class Outbox:
    """Sends on a thread of their own, in order, so that the caller never waits for the wire
    (a gloo send of a model costs about a millisecond here); :meth:`flush` waits until all
    have gone, bounded by ``timeout``. A failed send is raised by the next call; with
    ``on_error`` it is handed to ``on_error(dst, exc)`` instead and the other sends go on (the
    server: one dead worker must not silence the rest)."""

    def __init__(
        self,
        dim: int,
        dtype: torch.dtype,
        timeout: float,
        on_error: Callable[[int, BaseException], None] | None = None,
    ) -> None:
        self.dim, self.dtype, self.timeout = dim, dtype, timeout
        self._on_error = on_error
        self._queue: collections.deque[tuple[torch.Tensor, int, int] | None] = collections.deque()
        self._ready = threading.Condition()
        self._busy = 0
        self._to: collections.Counter[int] = collections.Counter()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tailtrain-outbox", daemon=True)
        self._thread.start()

    def send(self, message: Message, dst: int, tag: int) -> None:
        self._put(encode(message, self.dim, self.dtype), dst, tag)

    def probe(self, message: Message, dst: int) -> None:
        """Send ``message`` header only on tag ``PROBE`` (a PING, or the STOP ending the
        worker's probe thread)."""
        self._put(encode(message, 0, self.dtype), dst, PROBE)

    def pending(self, dst: int) -> int:
        """Sends to ``dst`` queued or still on the wire."""
        with self._ready:
            return self._to[dst]

    def _put(self, buffer: torch.Tensor, dst: int, tag: int) -> None:
        with self._ready:
            self._check()
            self._queue.append((buffer, dst, tag))
            self._busy += 1
            self._to[dst] += 1
            self._ready.notify_all()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                item = self._queue.popleft()
            if item is None:
                return
            try:
                dist.send(item[0], dst=item[1], tag=item[2])
            except BaseException as exc:  # raised by the caller's next send or flush
                if self._on_error is not None:
                    self._on_error(item[1], exc)
                    self._sent(item[1])
                    continue
                time.sleep(GRACE)  # as in ``Mailbox._run``
                with self._ready:
                    self._error = exc
                    self._ready.notify_all()
                return
            self._sent(item[1])

    def _sent(self, dst: int) -> None:
        with self._ready:
            self._busy -= 1
            self._to[dst] -= 1
            self._ready.notify_all()

    def flush(self) -> None:
        """Wait until every message has gone; then stop the thread."""
        deadline = time.monotonic() + self.timeout
        with self._ready:
            while self._busy and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TailtrainError(f"sends still pending after --timeout {self.timeout:g}s")
                self._ready.wait(left)
            self._check()
            self._queue.append(None)
            self._ready.notify_all()
        self._thread.join(self.timeout)

    def _check(self) -> None:
        if self._error is not None:
            raise TailtrainError(f"sending failed: {self._error}") from self._error

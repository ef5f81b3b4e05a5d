"""Partial collectives on torch.distributed: eager-SGD's solo, majority and quorum allreduce.

eager-SGD (Li et al., §4–§5, Fig. 6–7; its library fflib2) completes an allreduce without
waiting for the slow processes: an *initiator* activates the round and the activation spreads
to every process, who then joins the allreduce with whatever its send buffer holds.

Threads and groups (per process)::

    main thread ── call(step, g) ──► send buffer ──┐        (computes; blocks only to wait
         ▲                                          │         for a round it called in time)
         │ result of the latest round               ▼
    reducer thread: wait for activation of round r ─► SUM(buffer) on REDUCE group
    receiver thread: recv(any source) on ACTIVATION group ─► activate r, forward, count calls

The SUM is the backend's allreduce, except a small CPU buffer (``RECURSIVE_DOUBLING_BYTES``):
gloo's ring takes 2(P - 1) latency-bound steps, recursive doubling ⌈log2 P⌉ (+2 for P not a
power of two); at P = 8 on two cores that is 19 ms against 4 ms, more than the activation.

Both groups are ``dist.new_group`` groups of their own (activation: gloo; reduce: the job's
backend), so a round progresses while the main thread computes, sleeps or waits elsewhere.

**Messages** (activation group, three int64 ``[kind, a, sender]``, point to point):

- ``ACT r``: round r is activated. A process activated for the first time for round r (by its
  own call or by a message) sends ``ACT r`` to its partners (``partners``): up to
  ``DIRECT_ACTIVATION`` processes an initiator sends it to everyone and nobody forwards (one
  hop; each hop is a thread wake-up on every receiver, so on a few cores three hops of P log2 P
  messages cost more than P - 1 messages); beyond, every activated process sends it to its
  ⌈log2 P⌉ partners ``(rank + 2^j) mod P`` (dissemination: after hop j every offset
  < 2^(j+1) holds it, so everyone is reached within ⌈log2 P⌉ hops for any P). Later ``ACT r``
  are ignored, so several simultaneous initiators execute the round once (fflib2's consumable
  operations).
- ``CALL r``: a quorum call, sent to the round's counter rank ``r mod P`` (the counter rotates so
  no rank carries every round); the counter counts its own call without a message and
  activates round r at the K-th call. The K-th caller initiates by one hop to the counter.
- ``STOP n``: at the end, to every other rank: "I sent you n messages"; a receiver leaves once
  every peer's STOP came and all announced messages arrived, so nothing is left unreceived.
- ``ABORT``: the group failed and the sender leaves (:meth:`PartialCollective.abort`); the
  receiver leaves too, as a dead peer never sends its STOP.

**States of a round r on one process** (:class:`RoundState`): planned (its plan is known:
every rank computes it from the previous round's result with the rule, identically) →
activated (own call or ``ACT``) → reduced (the reducer's allreduce of round r returned) →
adopted (the main thread took it).

**Who may initiate** (``RoundPlan.collective``): solo: any process at its call; majority: only
the designated rank (``strategies.eager.majority_initiator``, from the shared seed); quorum: the
counter at the K-th call; allreduce (synchronous rounds: the staleness bound, model averages):
every process activates itself at its own call and no message is sent, so the allreduce
completes at the last call.

**A process calls round s** (``call``) with its gradient of step s; how it met the round
(:class:`CallKind`) is the round's state at the call:

- *late* (a round >= s already completed while it computed): the gradient goes to the send
  buffer, the process adopts the latest result only (eager-SGD §5) and goes on at once;
- *waiting* (round s was activated before its call): the gradient is parked in the buffer for
  the next round and the process waits for round s's result;
- *active* (its call came first): the gradient joins round s's contribution; it may initiate,
  then waits for the result.

A round contributes each process's send buffer (fresh and stale gradients; a late process
contributes what its buffer holds), at most ``capacity`` gradients per process per round, the
oldest first (the rest wait for the next round). The allreduce buffer (``wire``) is
``[sum g (D), sum of fresh g (D), slots (P, len(HEAD) + capacity * len(SLOT_COLUMNS))]``:
every process writes its slot (initiated, activation time, snapshot time, rows, grow; rows of
``job, version, start, finish, loss, ||g||^2, adopted, screened``) and zeros elsewhere, so one
SUM gives every rank the same arrivals.

Every wait for something owed is bounded by ``timeout`` (a ``datetime.timedelta`` on the
groups, a deadline on the condition waits) and ends in a one-line error naming the rank; only
the receiver's wait for the next message is not (none is owed: synchronous rounds send none).
Threads are daemons and are joined by :meth:`PartialCollective.close`. A hung main thread
stalls only the rounds that need its call (``runtime.drills.hang`` measures it): its progress
threads contribute its buffer; a stopped process stalls every round's data phase.
Times are seconds on the monotonic clock since rank 0 left the start barrier, on rank 0's machine
(its ranks share the clock, so activation times compare across them); a rank on another machine
counts from its own exit of that barrier (the barrier's skew).
"""

from __future__ import annotations

import contextlib
import datetime
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.errors import TailtrainError
from tailtrain.runtime.partial.wire import (
    ABORT,
    ACT,
    CALL,
    RECURSIVE_DOUBLING_BYTES,
    STOP,
    RoundResult,
    decode_message,
    empty_message,
    encode_message,
    pack_round,
    recursive_doubling,
    shared_origin,
    slot_width,
    unpack_round,
)
from tailtrain.runtime.reduce import SWITCH_INTERVAL, UNBOUNDED_WAIT
from tailtrain.strategies.eager import Collective, RoundPlan
from tailtrain.topology.partial import activation_hops, counter_of

#: gradients one process contributes per round at most (the rest wait a round)
CAPACITY = 4
#: completed rounds each rank keeps (``runtime.partial.rule`` keeps the steps of as many)
KEPT_ROUNDS = 64
#: up to this many processes an initiator activates everyone itself: one hop of P - 1 messages
#: instead of ⌈log2 P⌉ sequential hops and P ⌈log2 P⌉ messages, each a thread wake-up
DIRECT_ACTIVATION = 8
#: seconds between two looks of a watched wait at its ``watch`` (``--on-rank-loss shrink``)
WATCH_SLICE = 0.02


class CollectiveTimeout(TailtrainError):
    """A wait of the partial collective exceeded its timeout (a peer is gone or hung)."""


class CollectiveFailed(TailtrainError):
    """A thread of the partial collective failed (most often: a peer died)."""


def partners(rank: int, procs: int, initiator: bool = True) -> list[int]:
    """Where this rank sends an activation: up to ``DIRECT_ACTIVATION`` processes an initiator
    sends it to every other process and nobody forwards; beyond, everyone activated sends it
    to ``(rank + 2^j) mod P``, j < ⌈log2 P⌉ (dissemination)."""
    if procs <= DIRECT_ACTIVATION:
        return [p for p in range(procs) if p != rank] if initiator else []
    return [(rank + (1 << j)) % procs for j in range(activation_hops(procs))]


class RoundState(StrEnum):
    """Where round r is on one process (module docstring, "States of a round"); adopted is
    the main thread's (a call returns with the result), so ``_Shared`` tracks the first
    three."""

    #: not yet planned: round r - 1 has not been reduced
    UNPLANNED = "unplanned"
    #: its plan is known (every rank computes it identically from the previous result)
    PLANNED = "planned"
    #: its own call or an ``ACT`` activated it; the reducer may sum it
    ACTIVATED = "activated"
    #: the reducer's allreduce of round r returned (its result may have been dropped since:
    #: only ``KEPT_ROUNDS`` are kept)
    REDUCED = "reduced"


class CallKind(StrEnum):
    """How a call of round s met its round: the round's state at the call (module docstring,
    "A process calls round s"). A rank's calls leave it as their plain string values
    (``runtime.drills.hang``, ``runtime.drills.microbench``), so what they report is unchanged."""

    #: the round is reduced: the gradient waits for the next round, the latest result returns
    LATE = "late"
    #: the round is activated: the gradient waits for the next round, the call for this one
    WAITING = "waiting"
    #: the call came first: the gradient joins the round, which the call may initiate
    ACTIVE = "active"


@dataclass(frozen=True)
class Outcome:
    """What a call gave back: how it met its round (:class:`CallKind`), the round it called,
    the result it adopts (the latest) and the seconds spent inside the call."""

    kind: CallKind
    called: int
    result: RoundResult
    latency: float


@dataclass
class _Entry:
    row: np.ndarray
    grad: torch.Tensor
    not_before: int  # the first round that may take it


@dataclass
class _Shared:
    """State shared by the three threads, under ``PartialCollective.cond``."""

    plans: dict[int, RoundPlan | None] = field(default_factory=dict)
    activated: dict[int, float] = field(default_factory=dict)
    initiated: set[int] = field(default_factory=set)
    calls: dict[int, int] = field(default_factory=dict)
    results: dict[int, RoundResult] = field(default_factory=dict)
    latest: int = -1
    buffer: list[_Entry] = field(default_factory=list)
    closing: bool = False
    error: BaseException | None = None

    def round_state(self, r: int) -> RoundState:
        """Round ``r``'s state, from which of the fields above hold it."""
        if r <= self.latest:
            return RoundState.REDUCED
        if r in self.activated:
            return RoundState.ACTIVATED
        if r in self.plans:
            return RoundState.PLANNED
        return RoundState.UNPLANNED


AfterRound = Callable[[RoundResult], RoundPlan | None]


class PartialCollective:
    """One process's end of the partial collective (module docstring).

    ``after_round`` runs on the reducer thread after each round's allreduce, identically on
    every rank (same result): it returns the next round's plan, or None after the last round.
    """

    def __init__(
        self,
        rank: int,
        procs: int,
        dim: int,
        first: RoundPlan,
        after_round: AfterRound,
        *,
        backend: str = "gloo",
        device: torch.device | None = None,
        timeout: float = 300.0,
        hop_delay: float = 0.0,
        capacity: int = CAPACITY,
        groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None,
        watch: Callable[[], None] | None = None,
        bound: Callable[[], float] | None = None,
    ) -> None:
        self.rank, self.procs, self.dim, self.capacity = rank, procs, dim, capacity
        self.device = device or torch.device("cpu")
        self.timeout = timeout
        self.hop_delay = hop_delay  # emulated extra latency per activation hop (tests)
        self.after_round = after_round
        span = datetime.timedelta(seconds=timeout)
        if groups is None:  # every rank of the job
            self.act_group = dist.new_group(backend="gloo", timeout=span)
            self.red_group = dist.new_group(backend=backend, timeout=span)
        else:  # a shrunk generation's own (``runtime.partial.regroup``): rank = its index
            self.act_group, self.red_group = groups
        #: under ``--on-rank-loss shrink``: raises when the generation broke or a member died
        #: (looked at while the main thread waits for a round), and the learned deadline of
        #: that wait (``runtime.partial.regroup``)
        self.watch, self.bound = watch, bound
        #: set by the main thread: the next snapshot says a rank asks to join (a heal)
        self.grow_asked = False
        self.cond = threading.Condition()
        self.send_lock = threading.Lock()
        self.state = _Shared(plans={0: first})
        self.sent = np.zeros(procs, dtype=np.int64)
        self.pending: deque = deque()
        self.width = slot_width(capacity)
        self._switch = sys.getswitchinterval()
        self._aborted = False  # ABORT goes out once, even after a close() that failed
        sys.setswitchinterval(min(self._switch, SWITCH_INTERVAL))
        # the groups' own collectives: a generation's group is unknown to torch.distributed
        self.act_group.allreduce([torch.zeros(1)]).wait()  # the start barrier
        self.t0 = shared_origin(self.act_group)
        self.threads = [
            threading.Thread(target=self._guarded, args=(f, n), name=n, daemon=True)
            for f, n in ((self._receive, "tailtrain-receiver"), (self._reduce, "tailtrain-reducer"))
        ]
        for thread in self.threads:
            thread.start()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # ---- the main thread ------------------------------------------------------------------
    def plan(self, step: int) -> RoundPlan | None:
        """The plan of round ``step`` (None: the run is over); known once ``step - 1`` is."""
        with self.cond:
            self._wait(lambda: step in self.state.plans, f"the plan of round {step}", watched=True)
            return self.state.plans[step]

    def call(self, step: int, grad: torch.Tensor, row: np.ndarray) -> Outcome:
        """Call round ``step`` with this step's gradient (module docstring)."""
        began = self.now()
        with self.cond:
            s = self.state
            state = s.round_state(step)
            if state is RoundState.REDUCED:
                s.buffer.append(_Entry(row, grad, s.latest + 1))
                return Outcome(CallKind.LATE, step, s.results[s.latest], self.now() - began)
            plan = s.plans[step]
            if state is RoundState.ACTIVATED:
                kind = CallKind.WAITING
                s.buffer.append(_Entry(row, grad, step + 1))
            else:
                kind = CallKind.ACTIVE
                s.buffer.append(_Entry(row, grad, step))
                self._internal(step, plan)
            bound = None if self.bound is None else self.bound()
            self._wait(lambda: s.latest >= step, f"round {step}", bound=bound, watched=True)
            return Outcome(kind, step, s.results[s.latest], self.now() - began)

    def unsent(self) -> int:
        """Gradients called but in no round yet (a regroup drops them: they are counted)."""
        with self.cond:
            return len(self.state.buffer)

    def _internal(self, step: int, plan: RoundPlan) -> None:
        """This process's own call of round ``step`` may activate it (who may initiate)."""
        c = plan.collective
        if c in (Collective.ALLREDUCE, Collective.SOLO) or (
            c is Collective.MAJORITY and plan.initiator == self.rank
        ):
            self._activate(step, internal=True)
        elif c is Collective.QUORUM:
            counter = counter_of(step, self.procs)
            if counter == self.rank:
                self._count(step)
            else:
                self._send([counter], CALL, step)

    def close(self) -> None:
        """Leave after the last round: join the reducer, announce the messages sent, wait for
        every announced one, join the receiver. A peer lost meanwhile raises
        :class:`CollectiveFailed` (gloo's own error is a RuntimeError), so a shrinking run
        counts it in a census as any failure; with a learned ``bound`` the joins wait at most
        that long, not ``timeout``."""
        with self.cond:
            self.state.closing = True
            self.cond.notify_all()
        receiver, reducer = self.threads
        limit = self.timeout if self.bound is None else min(self.bound(), self.timeout)
        reducer.join(limit)
        try:
            if self.state.error is None:  # every rank is past its last round and its last send
                self.red_group.allreduce([torch.zeros(1, device=self.device)]).wait()
                for peer in range(self.procs):
                    self._send([peer], STOP, int(self.sent[peer]) + 1)
                receiver.join(limit)
                self._drain(everything=True)
        except RuntimeError as exc:  # gloo: a peer's connection closed, or its timeout
            line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            raise CollectiveFailed(f"rank {self.rank}: closing failed: {line}") from exc
        finally:
            sys.setswitchinterval(self._switch)
        if self.state.error is not None:
            raise self._failed()
        if any(t.is_alive() for t in self.threads):
            raise CollectiveTimeout(f"rank {self.rank}: the collective's threads did not stop")

    def abort(self, wait: float = 0.0) -> bool:
        """After a failure: stop the reducer, send ``ABORT`` to the peers (a surviving peer's
        receiver leaves on it, and ours on theirs; only the first call sends), and join both
        threads for at most ``wait`` seconds in all; whether both stopped. A thread blocked
        in a collective leaves once a peer of it exits (at the latest after ``timeout``)."""
        with self.cond:
            first, self._aborted = not self._aborted, True
            self.state.closing = True
            self.cond.notify_all()
        for peer in range(self.procs) if first else ():
            with contextlib.suppress(Exception):  # a dead peer's connection is gone
                self._send([peer], ABORT, 0)
        deadline = time.monotonic() + wait
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        sys.setswitchinterval(self._switch)
        return not any(t.is_alive() for t in self.threads)

    # ---- activation, counting, messages (any thread, under ``cond``) -----------------------
    def _activate(self, r: int, internal: bool) -> None:
        s = self.state
        if r in s.activated:
            return
        s.activated[r] = self.now()
        if internal:
            s.initiated.add(r)
        plan = s.plans.get(r)
        if plan is None or not plan.synchronous:  # a synchronous round sends no activation
            self._send(partners(self.rank, self.procs, internal), ACT, r)
        self.cond.notify_all()

    def _count(self, r: int) -> None:
        s = self.state
        s.calls[r] = s.calls.get(r, 0) + 1
        self._maybe_quorum(r)

    def _maybe_quorum(self, r: int) -> None:
        """The counter activates quorum round r at its K-th call (once its plan is known)."""
        s = self.state
        plan = s.plans.get(r)
        if plan is None or plan.collective is not Collective.QUORUM:
            return
        if s.calls.get(r, 0) >= plan.k and counter_of(r, self.procs) == self.rank:
            self._activate(r, internal=True)

    def _send(self, peers: list[int], kind: int, value: int) -> None:
        """One message to each of ``peers``, without waiting. The group's own ``send``:
        ``dist.isend``'s checks cost four times as much, and an activation sends P - 1."""
        peers = [p for p in peers if p != self.rank]
        if not peers:
            return
        message = encode_message(kind, value, self.rank)
        with self.send_lock:
            for peer in peers:  # every group holds every rank: group rank = rank
                try:
                    work = self.act_group.send([message], peer, 0)
                except RuntimeError as exc:  # gloo: the peer's connection closed
                    line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                    raise CollectiveFailed(f"rank {self.rank}: a send failed: {line}") from exc
                self.pending.append((work, message))
                self.sent[peer] += 1

    def _drain(self, everything: bool = False) -> None:
        """Complete finished sends (all of them at the end), bounded by the group timeout."""
        with self.send_lock:
            keep = 0 if everything else 4 * self.procs
            while len(self.pending) > keep:
                work, _ = self.pending.popleft()
                work.wait()

    # ---- the receiver thread -------------------------------------------------------------
    def _receive(self) -> None:
        got = np.zeros(self.procs, dtype=np.int64)
        announced = np.full(self.procs, -1, dtype=np.int64)
        announced[self.rank] = 0
        message = empty_message()
        while not np.all(got == announced):
            # idle until a message comes, however long: no message is owed to it (a run of
            # synchronous rounds sends none); the waits that expect one are bounded
            self.act_group.recv_anysource([message], 0).wait(UNBOUNDED_WAIT)
            kind, value, sender = decode_message(message)
            got[sender] += 1
            if kind == ABORT:
                return
            if kind == STOP:
                announced[sender] = value
                continue
            if kind == ACT and self.hop_delay > 0:
                time.sleep(self.hop_delay)
            with self.cond:
                if kind == ACT:
                    self._activate(value, internal=False)
                else:
                    self._count(value)

    # ---- the reducer thread --------------------------------------------------------------
    def _reduce(self) -> None:
        r = 0
        while True:
            with self.cond:
                s = self.state
                self._wait(lambda r=r, s=s: r in s.activated or s.closing, f"activation {r}")
                if r not in s.activated:
                    return
                plan, payload = s.plans[r], self._snapshot(r)
            payload = self._allreduce(payload)
            result = self._result(r, plan, payload.cpu())
            following = self.after_round(result)
            with self.cond:
                s.results[r], s.plans[r + 1], s.latest = result, following, r
                s.results.pop(r - KEPT_ROUNDS, None)
                self._maybe_quorum(r + 1)
                self.cond.notify_all()
            self._drain()
            if following is None:
                return
            r += 1

    def _allreduce(self, payload: torch.Tensor) -> torch.Tensor:
        """The round's SUM: gloo's ring takes 2(P-1) latency-bound steps, so a small CPU buffer
        goes by recursive doubling instead (``recursive_doubling``)."""
        small = payload.numel() * payload.element_size() <= RECURSIVE_DOUBLING_BYTES
        if payload.device.type == "cpu" and small and self.procs > 1:
            return recursive_doubling(payload, self.rank, self.procs, self.red_group)
        self.red_group.allreduce([payload]).wait()  # a SUM; the group's own (``__init__``)
        return payload

    def _snapshot(self, r: int) -> torch.Tensor:
        """This rank's contribution to round r: its buffer's oldest takeable gradients."""
        s = self.state
        taken = [e for e in s.buffer if e.not_before <= r][: self.capacity]
        s.buffer = [e for e in s.buffer if not any(e is t for t in taken)]
        head = [float(r in s.initiated), s.activated[r], self.now(), len(taken)]
        head.append(float(self.grow_asked))
        grads = [(e.grad, int(e.row[1]) == r) for e in taken]
        payload = pack_round(
            self.dim, self.procs, self.width, self.rank, grads, head, [e.row for e in taken]
        )
        return payload.to(self.device)

    def _result(self, r: int, plan: RoundPlan, payload: torch.Tensor) -> RoundResult:
        return unpack_round(r, plan, payload, self.dim, self.procs, self.now())

    # ---- helpers -------------------------------------------------------------------------
    def _wait(
        self,
        ready: Callable[[], bool],
        what: str,
        bound: float | None = None,
        watched: bool = False,
    ) -> None:
        """Wait on ``cond`` (held) until ``ready``, at most ``bound`` seconds (``timeout``
        unless given); ``watched`` (the main thread's waits): with a ``watch``, look at it
        every :data:`WATCH_SLICE` seconds."""
        limit = self.timeout if bound is None else min(bound, self.timeout)
        deadline = time.monotonic() + limit
        watch = self.watch if watched else None
        while not ready():
            if self.state.error is not None:
                raise self._failed()
            if watch is not None:
                watch()
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectiveTimeout(
                    f"rank {self.rank}: waited {limit:.3g}s for {what}; a peer may be gone"
                )
            self.cond.wait(min(left, 1.0 if watch is None else WATCH_SLICE))

    def _failed(self) -> CollectiveFailed | CollectiveTimeout:
        """The error of a failed progress thread, in one line that names its cause. gloo's
        own timeout on the groups is the same ``timeout`` as the condition waits', so it reads
        as theirs does: whichever of the two fires first, the user sees one kind of wait."""
        cause = self.state.error
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        error: CollectiveFailed | CollectiveTimeout
        if isinstance(cause, RuntimeError) and "Timed out" in first:  # gloo's wording
            error = CollectiveTimeout(
                f"rank {self.rank}: waited {self.timeout:.3g}s on a peer in a send, receive or"
                f" reduction; a peer may be gone (gloo: {first.rsplit('] ', 1)[-1][:160]})"
            )
        else:
            error = CollectiveFailed(
                f"rank {self.rank}: the collective failed: {type(cause).__name__}: {first[:200]}"
            )
        error.__cause__ = cause
        return error

    def _guarded(self, target: Callable[[], None], name: str) -> None:
        try:
            target()
        except BaseException as exc:
            with self.cond:
                if self.state.error is None:
                    self.state.error = exc
                self.cond.notify_all()

"""The parameter-server topology's ledger, shared by the simulator (``sim.ps``) and the runtime
(``runtime.ps``): who computes which model version, as one pure transition function, and a
step's record row (``step_row``; its ``StepStats`` are ``core.update.closed_step_stats``').

The server keeps, per worker, the version of the job it computes (or none), and a FIFO queue
of tokens; it alone starts jobs. ``transition(schedule, event) -> (schedule, starts)`` says
what an event does to that state and which jobs it starts. There is no clock, no tensor and no
I/O here: the simulated timeline (``sim.ps.timeline``) feeds it events in virtual-time order,
the real server (``runtime.ps``) in the order its messages come, and each turns the ``Start``
actions into work (a drawn duration, or a JOB message).

Worker phases (``Phase``): IDLE (waits for the next update), BUSY (computes exactly one job, at
one version) and ASKING (delivered and asks for its next job, not served yet: the simulator
holds a worker that finished at the same instant as other events until they are all in,
since one of them could close the step first).

Events:

- ``Update(v, mode, accept_stale)``: the update making version v. Under an interrupting mode
  (``SyncMode.PSI``, push & interrupt; ``PULL_INTERRUPT``, K-batch-sync's pull while the
  version lasts) every BUSY worker is interrupted and restarted at v (DBW [1] §2 PsI). Under
  pull with stale gradients dropped, n tokens of v join the queue (DBW §2 PI, footnote 3:
  TensorFlow's token queue, so at most n jobs of a version are ever started). Then every IDLE
  or ASKING worker that is not ``absent`` (dead), lowest index first, starts at v, or at the
  oldest token's version; with no token left it waits for the next update.
- ``Delivered(w, hold)``: worker w's gradient arrived (it is usable or not: ``usable``). Under
  pull (``refills``) it asks for a next job at once: at v, or at the oldest token (K-batch-
  async's unlimited pull, slow-and-stale [2] §II-C; DBW's PI with tokens). Under push it asks
  only if its gradient was stale and dropped (PsW: it takes the newest version, DBW §2);
  one whose gradient counts waits for the update, so K-async counts a worker at most once per
  step (slow-and-stale §II-C, Fig. 5). ``hold`` keeps it ASKING instead of serving it now:
  the server holds the worker that closes the step (it starts from the new version; with
  ``ServerPlan.complete_stragglers``, the drain, it does not hold it), the simulator also
  every worker that finished at a still-open instant.
- ``Ask(w)``: serve a held worker now (the instant is over, or the draining step closed).
- ``Lost(w)``: w's connection failed; its job will never come.

The step's closing rule (``step_closes``) and which arrivals count (``usable``) stay in
``strategies.base``; which jobs are older than the version (the drain) needs their times and
stays with the engines.

References: [1] Dynamic backup workers (DBW), /work/shared/papers/dynamic-backup-workers.md;
[2] Slow and stale gradients can win the race (K-async, K-batch-async, K-batch-sync) and
AdaSync, /work/shared/papers/slow-and-stale-gradients-adasync.md; [3] LGC (its stragglers
are the BUSY workers at the closing version), /work/shared/papers/live-gradient-compensation.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from tailtrain.core.update import isin, same_keys
from tailtrain.errors import TailtrainError
from tailtrain.strategies.base import ArrivalColumns, StepStats, SyncMode, uses_tokens

#: the version of a worker that computes nothing
IDLE = -1


class Phase(StrEnum):
    """Where a worker stands with the server."""

    IDLE = "idle"
    BUSY = "busy"
    ASKING = "asking"


@dataclass(frozen=True)
class Schedule:
    """The server's view of its workers, immutable. ``jobs[w]``: the version worker w computes
    (``IDLE``: none); ``tokens``: runs ``(version, count)``, oldest first. Plain ints, bools and
    strs only, so a checkpoint stores it as it is (``core.checkpoint``)."""

    version: int
    jobs: tuple[int, ...]
    asking: tuple[bool, ...]
    tokens: tuple[tuple[int, int], ...] = ()
    mode: str = SyncMode.PSI.value
    accept_stale: bool = False

    @classmethod
    def fresh(cls, workers: int) -> Schedule:
        """Before the first update: every worker IDLE, no token."""
        return cls(0, (IDLE,) * workers, (False,) * workers)

    @property
    def n(self) -> int:
        return len(self.jobs)

    def phase(self, worker: int) -> Phase:
        if self.jobs[worker] != IDLE:
            return Phase.BUSY
        return Phase.ASKING if self.asking[worker] else Phase.IDLE


@dataclass(frozen=True)
class Update:
    version: int
    mode: SyncMode
    accept_stale: bool
    absent: frozenset[int] = frozenset()


class Delivered(NamedTuple):
    # a NamedTuple, not a frozen dataclass: the simulator makes one per delivery, and a
    # tuple is built at half the cost
    worker: int
    hold: bool = False


@dataclass(frozen=True)
class Ask:
    worker: int


@dataclass(frozen=True)
class Lost:
    worker: int


Event = Update | Delivered | Ask | Lost


class Start(NamedTuple):
    """Start worker ``worker`` on ``version``; ``cancels``: interrupting the job it computes.
    A NamedTuple (immutable, built at half a frozen dataclass's cost: one per job started)."""

    worker: int
    version: int
    cancels: bool = False


def transition(s: Schedule, event: Event) -> tuple[Schedule, tuple[Start, ...]]:
    """The schedule after ``event`` and the jobs it starts (module docstring)."""
    if isinstance(event, Ask) and not s.asking[event.worker]:
        return s, ()  # nothing to serve: the same schedule
    ledger = _Ledger(s)
    starts: list[Start] = []
    ledger.apply(event, starts)
    return ledger.freeze(), tuple(starts)


def transition_all(s: Schedule, events: list[Event]) -> tuple[Schedule, list[Start]]:
    """Apply ``events`` in order; every job they start, in order."""
    if not events:
        return s, []
    ledger = _Ledger(s)
    starts: list[Start] = []
    for event in events:
        ledger.apply(event, starts)
    return ledger.freeze(), starts


def follows(s: Schedule, workers: list[int]) -> list[bool]:
    """Which of ``workers``, delivering in this order, would start a next job at once."""
    ledger = _Ledger(s)
    if not ledger.with_tokens:  # no queue: whoever asks is served, so who asks follows
        return [ledger.wants(w) for w in workers]
    starts: list[Start] = []
    out = []
    for w in workers:
        before = len(starts)
        ledger.delivered(w, False, starts)
        out.append(len(starts) > before)
    return out


class _Ledger:
    """A ``Schedule`` as mutable lists while a run of events applies: the one implementation
    of every event, and one immutable Schedule at the end of the run, not two n-tuples
    rebuilt per event (the simulator applies ~40 events a step)."""

    __slots__ = (
        "accept_stale",
        "asking",
        "jobs",
        "mode",
        "refills",
        "tokens",
        "version",
        "with_tokens",
    )

    def __init__(self, s: Schedule) -> None:
        self.version = s.version
        self.jobs, self.asking = list(s.jobs), list(s.asking)
        self.tokens = s.tokens
        self._set_mode(s.mode, s.accept_stale)

    def _set_mode(self, mode: str, accept_stale: bool) -> None:
        # read on every delivery: the mode's properties once per run of events
        self.mode, self.refills, self.with_tokens = _mode_facts(mode, accept_stale)
        self.accept_stale = accept_stale

    def freeze(self) -> Schedule:
        return Schedule(
            self.version,
            tuple(self.jobs),
            tuple(self.asking),
            self.tokens,
            self.mode.value,
            self.accept_stale,
        )

    def apply(self, event: Event, starts: list[Start]) -> None:
        """Apply ``event``; append the jobs it starts to ``starts``."""
        if isinstance(event, Delivered):
            self.delivered(event.worker, event.hold, starts)
        elif isinstance(event, Ask):
            w = event.worker
            if self.asking[w]:
                self.jobs[w], self.asking[w] = IDLE, False
                self._serve(w, starts)
        elif isinstance(event, Update):
            self._update(event, starts)
        elif isinstance(event, Lost):
            self.jobs[event.worker], self.asking[event.worker] = IDLE, False
        else:
            raise TypeError(f"not a parameter-server event: {event!r}")

    def _update(self, e: Update, starts: list[Start]) -> None:
        self._set_mode(e.mode, e.accept_stale)
        jobs, asking, n = self.jobs, self.asking, len(self.jobs)
        version, absent, with_tokens = e.version, e.absent, self.with_tokens
        if self.mode.interrupts:
            for w in range(n):
                if jobs[w] != IDLE:
                    starts.append(Start(w, version, cancels=True))
                    jobs[w], asking[w] = version, False
        tokens = self.tokens
        if with_tokens:
            tokens = (*tokens, (version, n - len(absent)))
        for w in range(n):
            if jobs[w] != IDLE or (absent and w in absent):
                continue
            asking[w] = False
            if not with_tokens:  # served without tokens: start at the new version
                jobs[w] = version
                starts.append(Start(w, version))
            elif tokens:  # served with tokens: the oldest token's version
                (token, count), rest = tokens[0], tokens[1:]
                tokens = rest if count == 1 else ((token, count - 1), *rest)
                jobs[w] = token
                starts.append(Start(w, token))
        self.version, self.tokens = version, tokens

    def wants(self, w: int) -> bool:
        """Whether worker ``w``, delivering now, asks for a next job at once: under pull, or
        (push) when its gradient is stale and dropped (DBW §2, PsW)."""
        if self.jobs[w] == IDLE:
            raise TailtrainError(f"worker {w} delivered without a job")
        return self.refills or (self.jobs[w] < self.version and not self.accept_stale)

    def delivered(self, w: int, hold: bool, starts: list[Start]) -> None:
        wants = self.wants(w)
        self.jobs[w] = IDLE
        if not wants or hold:
            self.asking[w] = wants
            return
        self.asking[w] = False
        self._serve(w, starts)  # it asks and is served at once

    def _serve(self, w: int, starts: list[Start]) -> None:
        """Start free worker ``w`` at the version, or at the oldest token's (none: it waits)."""
        if not self.with_tokens:
            self.jobs[w], self.asking[w] = self.version, False
            starts.append(Start(w, self.version))
            return
        if not self.tokens:
            return
        (version, count), rest = self.tokens[0], self.tokens[1:]
        self.tokens = rest if count == 1 else ((version, count - 1), *rest)
        self.jobs[w], self.asking[w] = version, False
        starts.append(Start(w, version))


@cache
def _mode_facts(mode: str, accept_stale: bool) -> tuple[SyncMode, bool, bool]:
    """A schedule's mode, whether it refills and whether it runs on tokens: a few enum
    look-ups that every run of events (several a simulated step) would repeat."""
    sync = SyncMode(mode)
    return sync, sync.refills, uses_tokens(sync, accept_stale)


# ---- the step's ledger -------------------------------------------------------------------------
#: a step row's columns, in order, as both engines write them (``step_row``)
ROW = (
    "step",
    "time",
    "k",
    "lr",
    "loss",
    "workers",
    "staleness",
    "partial_workers",
    "arrivals",
)
#: columns only the runtime writes: the contributors' jobs and weights, the stragglers' blocks
#: as they report them (LGC), the scalars, every arrival on the server's clock and the
#: server's own lag; the simulator keeps its rows small (one per virtual step, many steps)
MEASURED_ONLY = (
    "partial_units",
    "partial_jobs",
    "jobs",
    "weights",
    "grad_sq_sum",
    "mean_grad_sq",
    "arrived",
    "lag",
)
#: columns only the simulator writes: none
SIMULATED_ONLY: tuple[str, ...] = ()


def step_row(stats: StepStats, k: int, candidates: ArrivalColumns) -> dict[str, Any]:
    """The ``ROW`` columns of a step: the used candidates' workers and staleness, the
    stragglers whose partial work was offered (LGC), and how many arrived in all."""
    keys = candidates.keys
    # every candidate used, in order (most steps): no membership test
    idx = slice(None) if same_keys(keys, stats.used) else np.flatnonzero(isin(keys, stats.used))
    partial = candidates.partial
    return {
        "step": stats.step,
        "time": stats.time,
        "k": k,
        "lr": stats.lr,
        "loss": stats.loss,
        "workers": candidates.worker[idx].tolist(),
        "staleness": (stats.version - 1 - candidates.version[idx]).tolist(),
        "partial_workers": candidates.worker[partial].tolist() if partial.any() else [],
        "arrivals": len(stats.arrivals),
    }

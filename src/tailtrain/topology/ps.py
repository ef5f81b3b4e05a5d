"""The parameter-server topology's ledger, shared by the simulator (``sim.ps``) and the runtime
(``runtime.ps``): who computes which model version, as one pure transition function, and a
step's ``StepStats`` and record row (``step_stats``, ``step_row``).

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
from typing import Any

import numpy as np

from tailtrain.core.update import GradientStats, closed_step_stats, isin
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


@dataclass(frozen=True)
class Delivered:
    worker: int
    hold: bool = False


@dataclass(frozen=True)
class Ask:
    worker: int


@dataclass(frozen=True)
class Lost:
    worker: int


Event = Update | Delivered | Ask | Lost


@dataclass(frozen=True)
class Start:
    """Start worker ``worker`` on ``version``; ``cancels``: interrupting the job it computes."""

    worker: int
    version: int
    cancels: bool = False


def transition(s: Schedule, event: Event) -> tuple[Schedule, tuple[Start, ...]]:
    """The schedule after ``event`` and the jobs it starts (module docstring)."""
    if isinstance(event, Update):
        return _update(s, event)
    if isinstance(event, Delivered):
        return _delivered(s, event)
    if isinstance(event, Ask):
        if not s.asking[event.worker]:
            return s, ()
        return _serve(_set(s, event.worker, IDLE, False), event.worker)
    if isinstance(event, Lost):
        return _set(s, event.worker, IDLE, False), ()
    raise TypeError(f"not a parameter-server event: {event!r}")


def transition_all(s: Schedule, events: list[Event]) -> tuple[Schedule, list[Start]]:
    """Apply ``events`` in order; every job they start, in order."""
    starts: list[Start] = []
    for event in events:
        s, acts = transition(s, event)
        starts.extend(acts)
    return s, starts


def follows(s: Schedule, workers: list[int]) -> list[bool]:
    """Which of ``workers``, delivering in this order, would start a next job at once."""
    out = []
    for w in workers:
        s, acts = transition(s, Delivered(w))
        out.append(bool(acts))
    return out


def _set(s: Schedule, worker: int, job: int, asking: bool) -> Schedule:
    jobs = (*s.jobs[:worker], job, *s.jobs[worker + 1 :])
    ask = (*s.asking[:worker], asking, *s.asking[worker + 1 :])
    # the constructor, not dataclasses.replace: this runs for every worker event (~40 a step)
    return Schedule(s.version, jobs, ask, s.tokens, s.mode, s.accept_stale)


def _update(s: Schedule, e: Update) -> tuple[Schedule, tuple[Start, ...]]:
    # one pass over mutable copies of the workers' columns, one Schedule at the end: the
    # same events as a _set per worker, without rebuilding n-tuples n times
    mode = SyncMode(e.mode)
    jobs, asking = list(s.jobs), list(s.asking)
    tokens = s.tokens
    starts: list[Start] = []
    if mode.interrupts:
        for w in range(s.n):
            if jobs[w] != IDLE:
                starts.append(Start(w, e.version, cancels=True))
                jobs[w], asking[w] = e.version, False
    with_tokens = uses_tokens(mode, e.accept_stale)
    if with_tokens:
        tokens = (*tokens, (e.version, s.n - len(e.absent)))
    for w in range(s.n):
        if jobs[w] != IDLE or w in e.absent:
            continue
        asking[w] = False
        if not with_tokens:  # _serve without tokens: start at the new version
            jobs[w] = e.version
            starts.append(Start(w, e.version))
        elif tokens:  # _serve with tokens: the oldest token's version
            (version, count), rest = tokens[0], tokens[1:]
            tokens = rest if count == 1 else ((version, count - 1), *rest)
            jobs[w] = version
            starts.append(Start(w, version))
    out = Schedule(e.version, tuple(jobs), tuple(asking), tokens, mode.value, e.accept_stale)
    return out, tuple(starts)


def _delivered(s: Schedule, e: Delivered) -> tuple[Schedule, tuple[Start, ...]]:
    w = e.worker
    if s.jobs[w] == IDLE:
        raise TailtrainError(f"worker {w} delivered without a job")
    stale = s.jobs[w] < s.version
    wants = SyncMode(s.mode).refills or (stale and not s.accept_stale)
    if not wants or e.hold:
        return _set(s, w, IDLE, wants), ()
    return _serve(_set(s, w, IDLE, False), w)  # it asks and is served at once


def _serve(s: Schedule, w: int) -> tuple[Schedule, tuple[Start, ...]]:
    """Start free worker ``w`` at the version, or at the oldest token's (none: it waits)."""
    if not uses_tokens(SyncMode(s.mode), s.accept_stale):
        return _set(s, w, s.version, False), (Start(w, s.version),)
    if not s.tokens:
        return s, ()
    (version, count), rest = s.tokens[0], s.tokens[1:]
    tokens = rest if count == 1 else ((version, count - 1), *rest)
    s = Schedule(s.version, s.jobs, s.asking, tokens, s.mode, s.accept_stale)
    return _set(s, w, version, False), (Start(w, version),)


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


def step_stats(
    step: int,
    k: int,
    time: float,
    arrivals: ArrivalColumns,
    used: np.ndarray,
    scalars: GradientStats,
    lr: float,
) -> StepStats:
    """A closed step's ``StepStats``: every arrival (late and stale ones too, for DBW's
    estimator), the keys used, and the scalars over the fresh gradients."""
    return closed_step_stats(step, k, time, arrivals, used, scalars, lr)


def step_row(stats: StepStats, k: int, candidates: ArrivalColumns) -> dict[str, Any]:
    """The ``ROW`` columns of a step: the used candidates' workers and staleness, the
    stragglers whose partial work was offered (LGC), and how many arrived in all."""
    idx = np.flatnonzero(isin(candidates.keys, stats.used))
    return {
        "step": stats.step,
        "time": stats.time,
        "k": k,
        "lr": stats.lr,
        "loss": stats.loss,
        "workers": candidates.worker[idx].tolist(),
        "staleness": (stats.version - 1 - candidates.version[idx]).tolist(),
        "partial_workers": candidates.worker[candidates.partial].tolist(),
        "arrivals": len(stats.arrivals),
    }

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

``Delivered``, ``Ask`` and ``Lost`` name one worker (the runtime: one message) or several,
distinct, in event order (the simulator: a batch of arrivals in virtual-time order); several
are those events one after the other, applied in one pass over the schedule's arrays, so the
simulator's 2048 workers cost a few numpy operations an event batch, not a Python call each.

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

_INT, _BOOL = np.dtype(np.int64), np.dtype(bool)


class Phase(StrEnum):
    """Where a worker stands with the server."""

    IDLE = "idle"
    BUSY = "busy"
    ASKING = "asking"


def _frozen(values: Any, dtype: np.dtype) -> np.ndarray:
    """``values`` as a read-only array of ``dtype`` that the schedule owns: a copy, unless it
    is one already (``transition`` hands over the arrays it built)."""
    if isinstance(values, np.ndarray) and values.dtype == dtype and not values.flags.writeable:
        return values
    out = np.array(values, dtype=dtype)
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False)
class Schedule:
    """The server's view of its workers, immutable. ``jobs[w]``: the version worker w computes
    (``IDLE``: none); ``asking[w]``: whether it asks for a job; ``tokens``: runs
    ``(version, count)``, oldest first. ``jobs`` and ``asking`` are read-only arrays, one
    entry a worker, so that an event of many workers is a few array operations; a checkpoint
    stores them as tensors (``core.checkpoint``), and one written when they were tuples of
    ints loads as well."""

    version: int
    jobs: np.ndarray
    asking: np.ndarray
    tokens: tuple[tuple[int, int], ...] = ()
    mode: str = SyncMode.PSI.value
    accept_stale: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", _frozen(self.jobs, _INT))
        object.__setattr__(self, "asking", _frozen(self.asking, _BOOL))
        if self.jobs.ndim != 1 or self.jobs.shape != self.asking.shape:
            raise ValueError("a schedule's jobs and asking are one entry a worker each")

    @classmethod
    def fresh(cls, workers: int) -> Schedule:
        """Before the first update: every worker IDLE, no token."""
        return cls(0, np.full(workers, IDLE, dtype=_INT), np.zeros(workers, dtype=_BOOL))

    @property
    def n(self) -> int:
        return self.jobs.size

    def phase(self, worker: int) -> Phase:
        if self.jobs[worker] != IDLE:
            return Phase.BUSY
        return Phase.ASKING if self.asking[worker] else Phase.IDLE


#: one worker (the runtime's events) or several, distinct, in event order (the simulator's)
Workers = int | np.ndarray


@dataclass(frozen=True)
class Update:
    version: int
    mode: SyncMode
    accept_stale: bool
    absent: frozenset[int] = frozenset()


class Delivered(NamedTuple):
    """``worker``'s gradients arrived; ``hold`` (one flag, or one a worker) keeps it ASKING."""

    worker: Workers
    hold: bool | np.ndarray = False


class Ask(NamedTuple):
    worker: Workers


class Lost(NamedTuple):
    worker: Workers


Event = Update | Delivered | Ask | Lost


class Start(NamedTuple):
    """Start worker ``worker`` on ``version``; ``cancels``: interrupting the job it computes."""

    worker: int
    version: int
    cancels: bool = False


@dataclass(frozen=True, eq=False)
class Starts:
    """The jobs an event starts, in the order the server starts them: ``worker[i]`` on
    ``version[i]``, ``cancels[i]``: interrupting the job it computes. Arrays, which the
    simulator launches at once; iterating yields one ``Start`` a job (the runtime sends one
    JOB message each)."""

    worker: np.ndarray
    version: np.ndarray
    cancels: np.ndarray

    def __len__(self) -> int:
        return self.worker.size

    def __iter__(self):
        rows = zip(self.worker.tolist(), self.version.tolist(), self.cancels.tolist(), strict=True)
        return (Start(w, v, c) for w, v, c in rows)


def _handed(values: np.ndarray) -> np.ndarray:
    """An array built for a new schedule, made read-only so that the schedule takes it as it
    is (``_frozen``): no copy."""
    values.flags.writeable = False
    return values


_NO_WORKERS = _handed(np.empty(0, dtype=_INT))
NO_STARTS = Starts(_NO_WORKERS, _NO_WORKERS, _handed(np.empty(0, dtype=_BOOL)))


def transition(s: Schedule, event: Event) -> tuple[Schedule, Starts]:
    """The schedule after ``event`` and the jobs it starts (module docstring).

    An event of several workers (distinct, in event order) is those workers' events one after
    the other, applied in one pass over the arrays: the simulator delivers a whole batch of
    arrivals at once, the runtime each arrival as its message comes, through the same code."""
    if isinstance(event, Delivered):
        return _delivered(s, _workers(s, event.worker), event.hold)
    if isinstance(event, Ask):
        return _ask(s, _workers(s, event.worker))
    if isinstance(event, Update):
        return _update(s, event)
    if isinstance(event, Lost):
        jobs, asking = s.jobs.copy(), s.asking.copy()
        w = _workers(s, event.worker)
        jobs[w], asking[w] = IDLE, False
        return _after(s, jobs, asking, s.tokens), NO_STARTS
    raise TypeError(f"not a parameter-server event: {event!r}")


def follows(s: Schedule, workers: Workers) -> np.ndarray:
    """Which of ``workers``, delivering in this order and none held, would start a next job
    at once (``Delivered``: each that asks, while tokens last)."""
    return _asks(s, _workers(s, workers), False)[1]


def _workers(s: Schedule, worker: Workers) -> np.ndarray:
    """An event's workers as an array; several must be distinct (one event each)."""
    w = np.asarray(worker, dtype=_INT)
    if w.ndim == 0:
        return w.reshape(1)
    if w.size > 1:
        seen = np.zeros(s.n, dtype=_BOOL)
        seen[w] = True
        if np.count_nonzero(seen) != w.size:
            raise TailtrainError(f"an event names a worker twice: {w.tolist()}")
    return w


def _after(
    s: Schedule, jobs: np.ndarray, asking: np.ndarray, tokens: tuple[tuple[int, int], ...]
) -> Schedule:
    """``s`` with ``jobs``, ``asking`` (arrays the caller built and hands over) and ``tokens``."""
    return Schedule(s.version, _handed(jobs), _handed(asking), tokens, s.mode, s.accept_stale)


def _update(s: Schedule, e: Update) -> tuple[Schedule, Starts]:
    sync, _, with_tokens = _mode_facts(e.mode, e.accept_stale)
    jobs, asking, v = s.jobs.copy(), s.asking.copy(), e.version
    busy = jobs != IDLE
    interrupted = _NO_WORKERS
    if sync.interrupts:  # every BUSY worker restarts at v
        interrupted = busy.nonzero()[0]
        jobs[interrupted], asking[interrupted] = v, False
    free = ~busy  # an interrupted worker is busy again at once
    if e.absent:  # the dead are not served
        free[np.fromiter(e.absent, dtype=_INT, count=len(e.absent))] = False
    tokens = s.tokens
    live = s.n - len(e.absent)
    if with_tokens and live > 0:
        tokens = (*tokens, (v, live))
    free = free.nonzero()[0]
    asking[free] = False
    tokens, served = _serve(jobs, asking, tokens, v, with_tokens, free)
    after = Schedule(v, _handed(jobs), _handed(asking), tokens, sync.value, e.accept_stale)
    if interrupted.size == 0:
        return after, served
    # interrupts first, then the free workers, lowest index first
    return after, Starts(
        np.concatenate([interrupted, served.worker]),
        np.concatenate([np.full(interrupted.size, v, dtype=_INT), served.version]),
        np.concatenate([np.ones(interrupted.size, dtype=_BOOL), served.cancels]),
    )


def _wants(s: Schedule, w: np.ndarray, refills: bool) -> np.ndarray:
    """Whether each of workers ``w``, delivering now, asks for a next job at once: under pull,
    or (push) when its gradient is stale and dropped (DBW §2, PsW)."""
    job = s.jobs[w]
    idle = job == IDLE
    if idle.any():
        raise TailtrainError(f"worker {int(w[idle][0])} delivered without a job")
    if refills:
        return np.ones(w.size, dtype=_BOOL)
    if s.accept_stale:
        return np.zeros(w.size, dtype=_BOOL)
    return job < s.version


def _asks(s: Schedule, w: np.ndarray, hold: bool | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of workers ``w`` delivering in this order: which ask for a next job (``_wants``), and
    which are served at once: those that ask and are not held, while the queue lasts."""
    _, refills, with_tokens = _mode_facts(s.mode, s.accept_stale)
    wants = _wants(s, w, refills)
    served = wants & ~np.asarray(hold, dtype=_BOOL)
    supply = _supply(s.tokens, with_tokens)
    if supply is not None:
        served &= np.cumsum(served) <= supply
    return wants, served


def _delivered(s: Schedule, w: np.ndarray, hold: bool | np.ndarray) -> tuple[Schedule, Starts]:
    _, _, with_tokens = _mode_facts(s.mode, s.accept_stale)
    wants, served = _asks(s, w, hold)
    jobs, asking = s.jobs.copy(), s.asking.copy()
    jobs[w] = IDLE
    asking[w] = wants & np.asarray(hold, dtype=_BOOL)  # held, it asks; served or not, it does not
    tokens, starts = _serve(jobs, asking, s.tokens, s.version, with_tokens, w[served])
    return _after(s, jobs, asking, tokens), starts


def _ask(s: Schedule, w: np.ndarray) -> tuple[Schedule, Starts]:
    ask = w[s.asking[w]]
    if ask.size == 0:
        return s, NO_STARTS  # nothing to serve: the same schedule
    _, _, with_tokens = _mode_facts(s.mode, s.accept_stale)
    jobs, asking = s.jobs.copy(), s.asking.copy()
    jobs[ask], asking[ask] = IDLE, False
    tokens, starts = _serve(jobs, asking, s.tokens, s.version, with_tokens, ask)
    return _after(s, jobs, asking, tokens), starts


def _serve(
    jobs: np.ndarray,
    asking: np.ndarray,
    tokens: tuple[tuple[int, int], ...],
    version: int,
    with_tokens: bool,
    free: np.ndarray,
) -> tuple[tuple[tuple[int, int], ...], Starts]:
    """Start the free workers ``free``, in order, at ``version``, or each at the oldest token's
    (none left: the rest wait); the tokens left and the starts. Sets ``jobs`` and ``asking``."""
    supply = _supply(tokens, with_tokens)
    if supply is not None:
        free = free[:supply]
    if free.size == 0:
        return tokens, NO_STARTS
    if with_tokens:
        versions, tokens = _take_tokens(tokens, free.size)
    else:
        versions = np.full(free.size, version, dtype=_INT)
    jobs[free], asking[free] = versions, False
    return tokens, Starts(free, versions, np.zeros(free.size, dtype=_BOOL))


def _supply(tokens: tuple[tuple[int, int], ...], with_tokens: bool) -> int | None:
    """How many free workers the server can start now, in the order they ask: as many as
    there are tokens (DBW §2 footnote 3); None: every one (no queue)."""
    return sum(count for _, count in tokens) if with_tokens else None


def _take_tokens(
    tokens: tuple[tuple[int, int], ...], count: int
) -> tuple[np.ndarray, tuple[tuple[int, int], ...]]:
    """Dequeue ``count`` tokens (at most as many as there are), oldest first: their versions
    and the queue left (a few runs, one per update still queued)."""
    versions, counts, rest = [], [], list(tokens)
    while count and rest:
        version, left = rest[0]
        got = min(count, left)
        versions.append(version)
        counts.append(got)
        count -= got
        if got == left:
            rest.pop(0)
        else:
            rest[0] = (version, left - got)
    return np.repeat(np.array(versions, dtype=_INT), counts), tuple(rest)


@cache
def _mode_facts(mode: str, accept_stale: bool) -> tuple[SyncMode, bool, bool]:
    """A schedule's mode, whether it refills and whether it runs on tokens: a few enum
    look-ups that every event would repeat."""
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

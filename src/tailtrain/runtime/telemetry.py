"""Run records, measured traces, rank-tagged logs and profiler ranges of `tailtrain train`.

* ``steps.jsonl`` has the allreduce simulator's columns (``topology.allreduce.step_row``)
  with wall seconds in ``time``, plus ``step_time`` (the round's wall seconds, the slowest
  rank's) and, per rank, ``rank_compute`` (T~_n: its compute seconds, the injected ones
  included), ``rank_injected`` (the injected seconds slept within them), ``rank_wait``,
  ``rank_comm`` and ``rank_overhead``. Every second of the round is in exactly one of them:
  (rank_compute - rank_injected) + rank_injected + rank_wait + rank_comm + rank_overhead =
  step_time, each >= 0 (:func:`split_round`). Every rank leaves a collective together, so the
  last to arrive waits for nobody: ``rank_comm`` is the collective's own seconds, the smallest
  allreduce seconds over the ranks (T^c, ``comm_time``), and ``rank_wait`` the rest of the
  rank's allreduce seconds, measured on its own clock. (It was max_k T~_k - T~_n, which
  subtracted compute times that started at different instants on different ranks, and left
  ``rank_comm`` negative for a rank that started late.) ``rank_overhead`` is the runtime's own
  seconds around them (planning, the update, the clock, a lead that a faster rank's round had
  on this one). ``sync_time`` and ``s_eff`` need the time of micro-batches that were never
  computed, so they are null in rounds that dropped work.
* ``summary.json`` has simulate's keys, ``wall_time`` in place of ``virtual_time``, and the
  means per round and rank of the five parts (:func:`time_means`; the partial collective's
  per job and rank, below):
  ``mean_compute_time``, ``mean_injected_time``, ``mean_wait_time``, ``mean_comm_time``,
  ``mean_overhead_time``; they sum to ``mean_iteration_time``.
* Log lines name their rank (``launching.rank_entry.tag_logs``) and, from the runtime, their step.
* ``trace-rank{r}.csv`` (per rank) and ``trace.csv`` (rank 0, all ranks) hold every unit's
  measured seconds in the format ``trace:path=`` reads
  (``iteration,worker[,micro_batch][,censored],seconds``; a unit the threshold cut or never
  started is a censored row, a lower bound, so the law is estimated rather than read from the
  survivors, unless the cut unit ran to its end all the same, when its seconds are its time;
  one iteration per local step; a partial
  collective's unit is a rank's job, its iteration the job's index), so a real run can drive
  ``predict``, ``simulate`` and ``advise`` (:func:`write_traces`). The allreduce topology adds
  ``noncompute``: on the rows of a rank's last iteration in a round, the round's wall seconds
  less every second that rank computed (its wait, communication and overhead: the seconds
  its unit in flight ran before tau cut it are compute, and so is a real compute's run-on past
  tau, which no clock can stop), NaN on the other rows
  (no collective ends there) and in a round whose time never came; a replay charges it
  (``delays.trace``). The partial-collective topology writes it too, per job (below).
* **Partial collective** (``runtime.partial.rounds``): its ranks do not end their steps
  together, so a step is a rank's own: one job (compute, call of the collective, adopt), from
  its start to the next job's. :func:`split_step` splits it as :func:`split_round` splits a
  round, for one rank: the call's seconds before the round it adopts closed (its last
  snapshot) are ``wait``, those after it (the round's data phase, the rule, an injected T^c)
  ``comm``, the rest of the step ``overhead``. ``rank-steps.jsonl`` (rank 0) holds every
  rank's steps (``rank``, ``job`` and the :func:`time_row` columns, one rank each), the
  summary the five means over them (per job and rank: they sum to the mean step of a rank,
  not to ``mean_iteration_time``, which is per round of the collective), and each job's trace
  row its ``noncompute``: the step less the job's unit.
* :func:`run_record` makes a topology's run record; rank 0's also streams its step and
  evaluation rows to TensorBoard (``--tensorboard``, the scalars of ``simulate``'s
  ``tailtrain.tensorboard``) as they are recorded, until :func:`close_record`, and on a
  terminal advances ``simulate``'s progress bar by its step rows (``--no-progress`` hides it).
* :func:`phase` times a section and marks it as a ``torch.profiler.record_function`` range
  (``tailtrain.compute``, ``tailtrain.wait``, ``tailtrain.reduce``, ``tailtrain.comm``).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from torch.autograd import _profiler_enabled
from torch.profiler import record_function

from tailtrain.core.machine import append_machine, machine_row
from tailtrain.core.records import RunRecord, prepare_folder, write_jsonl
from tailtrain.core.scenario import Scenario, World
from tailtrain.delays.trace import write_trace_rows
from tailtrain.progress import step_progress
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Plan, StepStats
from tailtrain.topology.allreduce import Stops, step_row

#: the per-rank steps' parts of the partial-collective and parameter-server topologies
RANK_STEPS = "rank-steps.jsonl"


class phase:  # lower case: it reads as a function, ``with phase("compute") as timer``
    """Wall seconds of a section (``.seconds`` once it ends), also a profiler range
    ``tailtrain.<name>`` while a profiler runs. A class, not a ``@contextmanager``: the
    generator costs ~10 us a section, twice a round."""

    __slots__ = ("name", "range", "seconds", "start")

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = 0.0

    def __enter__(self) -> phase:
        # a range costs ~30 us even with no profiler running: a few % of a small model's round
        self.range = record_function(f"tailtrain.{self.name}") if _profiler_enabled() else None
        if self.range is not None:
            self.range.__enter__()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
        if self.range is not None:
            self.range.__exit__(*exc)


class RankLog(logging.LoggerAdapter):
    """Log lines tagged ``step S`` (``launching.rank_entry.tag_logs`` puts the rank on every
    line)."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("tailtrain.runtime"), {})
        self.step = 0

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"step {self.step}: {msg}", kwargs


class BoardSink:
    """A :class:`RunRecord` sink that logs each row to TensorBoard as it is added."""

    def __init__(self, folder: Path, metric: str) -> None:
        from tailtrain.tensorboard import TensorBoardLog

        self.board = TensorBoardLog(folder, metric)

    def write(self, name: str, row: dict[str, Any]) -> None:
        if name == "steps":
            self.board.add_step(row)
        else:
            self.board.add_eval(row)

    def close(self) -> None:
        self.board.close()


class ScoredLater:
    """A sink in front of ``sink`` for a record whose evaluations are scored after the run
    (the parameter server's snapshots, ``ps.Server.scorer``): step rows go on as they come,
    evaluation rows still to be scored (``_snapshot``) when it closes, by then filled in (the
    same row objects)."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.unscored: list[dict[str, Any]] = []

    def write(self, name: str, row: dict[str, Any]) -> None:
        if name == "evals" and "_snapshot" in row:
            self.unscored.append(row)
        else:
            self.sink.write(name, row)

    def close(self) -> None:
        for row in self.unscored:
            self.sink.write("evals", row)
        self.sink.close()


class Tee:
    """Several sinks as one: a run folder's files and TensorBoard both follow a record."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = sinks

    def write(self, name: str, row: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(name, row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def attach(record: RunRecord, sink: Any) -> None:
    """Make ``sink`` follow ``record`` too, beside any sink it has."""
    record.sink = sink if record.sink is None else Tee(record.sink, sink)


def run_record(config: TrainConfig, world: World, lead: bool) -> RunRecord:
    """A topology's run record, followed on the lead rank (:func:`follow`)."""
    return follow(RunRecord(), config, world, lead)


def follow(record: RunRecord, config: TrainConfig, world: World, lead: bool) -> RunRecord:
    """``record``, whose rows also go on the lead rank to ``config.tensorboard`` when set,
    and to a progress bar with ``config.progress`` when standard error is a terminal."""
    if lead and config.tensorboard is not None:
        metric = getattr(world.task, "metric_name", None) or "eval"
        attach(record, BoardSink(config.tensorboard, metric))
    if lead and config.progress and sys.stderr.isatty():
        attach(record, ProgressSink(config.scenario, config.strategy.describe()))
    return record


class ProgressSink:
    """A :class:`RunRecord` sink that advances simulate's progress bar (``tailtrain.progress``)
    by each step row: rounds or wall seconds, as the scenario's budget counts."""

    def __init__(self, scenario: Scenario, label: str) -> None:
        self.stack = ExitStack()
        self.advance = self.stack.enter_context(step_progress(scenario, label, True))(0)
        self.rounds = 0  # the rounds recorded so far

    def write(self, name: str, row: dict[str, Any]) -> None:
        if name == "steps":
            self.rounds = int(row["step"]) + 1
            self.advance(self.rounds, float(row["time"]))

    def close(self) -> None:
        self.stack.close()


def close_record(record: RunRecord) -> None:
    """Flush and detach a record's sink: a finished record goes back to the launcher by pickle."""
    if record.sink is not None:
        record.sink.close()
        record.sink = None


class Settled(NamedTuple):
    """A round's place on the run's clock (the end of the round) and its T^c."""

    time: float
    comm_time: float


@dataclass(frozen=True)
class RoundTimes:
    """What every rank knows after a round: per-rank counts and seconds (N,) each, and the
    round's wall seconds (NaN, as wait, comm and overhead, until its timings come)."""

    done: np.ndarray
    compute: np.ndarray
    injected: np.ndarray
    wait: np.ndarray
    comm: np.ndarray
    overhead: np.ndarray
    wall: float

    def full(self, units: int) -> np.ndarray:
        """T_n^(U) where observable: a rank that dropped work never measured its rest."""
        return np.where(self.done == units, self.compute, np.nan)


def split_round(rows: np.ndarray, timing: np.ndarray | None) -> RoundTimes:
    """A round's seconds, rank by rank, from the gathered rows [C_n, T~_n, injected, ...] and
    each rank's [allreduce, round seconds] (None: not come yet).

    Each rank measures its own phases on its own clock, and they do not overlap: its compute
    T~_n, then its allreduce A_n, within its round R_n <= the round's wall seconds max_k R_k.
    The collective ends for all ranks together, so T^c = min_k A_k (the last to arrive waits
    for nobody), wait_n = A_n - T^c and overhead_n = wall - T~_n - A_n: all >= 0 and, with
    T^c, summing to the wall seconds without a difference of two ranks' clocks.
    """
    done, compute, injected = rows[:, 0].astype(np.int64), rows[:, 1], rows[:, 2]
    if timing is None:
        unknown = np.full(len(compute), np.nan)
        return RoundTimes(done, compute, injected, unknown, unknown, unknown, math.nan)
    # NaN: a rank lost before it could send its timings (``runtime.elastic.shrink``)
    allreduce, wall = timing[:, 0], float(np.nanmax(timing[:, 1]))
    return _parts(rows, allreduce, np.full(len(compute), float(np.nanmin(allreduce))), wall)


def split_step(compute: float, injected: float, call: float, comm: float, wall: float):
    """One rank's step where the ranks do not end their steps together (the partial
    collective, the parameter server's workers): its compute T~ (``injected`` of it slept),
    its call of the collective, ``call`` seconds of which ``comm`` were the collective's own
    (the rest waited for others), within the step's ``wall`` seconds on its own clock; the
    parts as :func:`split_round` makes them, for one rank (N = 1)."""
    rows = np.array([[1.0, compute, injected]])
    return _parts(rows, np.array([call]), np.array([min(max(comm, 0.0), call)]), wall)


def _parts(rows: np.ndarray, calls: np.ndarray, comm: np.ndarray, wall: float) -> RoundTimes:
    """The five parts (module docstring) of ranks that spent ``calls`` seconds in a
    collective, ``comm`` of them its own, within ``wall`` seconds: wait = call - comm,
    overhead = wall - T~ - call."""
    done, compute, injected = rows[:, 0].astype(np.int64), rows[:, 1], rows[:, 2]
    return RoundTimes(
        done,
        compute,
        injected,
        wait=calls - comm,
        comm=comm,
        overhead=wall - compute - calls,
        wall=wall,
    )


def time_row(times: RoundTimes) -> dict[str, Any]:
    """A step's parts as record columns: ``step_time`` and, per rank, ``rank_compute`` (the
    injected seconds included), ``rank_injected``, ``rank_wait``, ``rank_comm``,
    ``rank_overhead`` (module docstring)."""
    return {
        "step_time": times.wall,
        "rank_compute": times.compute.tolist(),
        "rank_injected": times.injected.tolist(),
        "rank_wait": times.wait.tolist(),
        "rank_comm": times.comm.tolist(),
        "rank_overhead": times.overhead.tolist(),
    }


#: the parts of a round in ``summary.json``: column (or the compute alone) -> summary key
TIME_PARTS = {
    "compute": "mean_compute_time",
    "rank_injected": "mean_injected_time",
    "rank_wait": "mean_wait_time",
    "rank_comm": "mean_comm_time",
    "rank_overhead": "mean_overhead_time",
}


def time_means(steps: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per step and rank of each part of a step (module docstring) over the
    :func:`time_row` columns of ``steps``: they sum to the mean step. Rows without their
    timings (a run that failed) are left out."""
    rows = [r for r in steps if "rank_overhead" in r]
    if not rows:
        return {key: math.nan for key in TIME_PARTS.values()}
    # rows of a shrinking run hold fewer ranks after a loss: one flat array per part
    keep = [r for r in rows if not np.isnan(np.asarray(r["rank_overhead"], np.float64)).any()]
    if not keep:
        return {key: math.nan for key in TIME_PARTS.values()}
    table = {
        c: np.concatenate([np.asarray(r[c], np.float64) for r in keep])
        for c in TIME_PARTS
        if c[0] == "r"
    }
    compute = np.concatenate([np.asarray(r["rank_compute"], np.float64) for r in keep])
    table["compute"] = compute - table["rank_injected"]
    return {key: float(table[c].mean()) for c, key in TIME_PARTS.items()}


def allreduce_row(
    plan: Plan,
    stats: StepStats,
    times: RoundTimes,
    used: list[int],
    m: int,
    settled: Settled,
    dealt: np.ndarray | None = None,
) -> dict[str, Any]:
    """The record row of an allreduce round adapted on ``stats`` and timed by ``settled``;
    ``dealt``: on demand, the micro-batches each rank was dealt."""
    full = times.full(plan.local_steps * m)
    if plan.shares is not None:  # sync's T_n^(M) is a rank's compute only where its share is M
        full = np.where(np.asarray(plan.shares) == m, full, np.nan)
    if dealt is not None:  # on demand no rank computes sync's units: unmeasured
        full = np.full(len(full), np.nan)
    stops = Stops(times.done, times.compute, full, dealt)
    row = step_row(plan, stats, stops, used, m, settled.comm_time)
    row["time"] = settled.time
    row.update(time_row(times))
    return row


@dataclass
class TraceRows:
    """One rank's measured unit seconds, as rows of a ``trace:`` CSV; with ``charged``, each
    round's wall seconds too, for the ``noncompute`` column (module docstring)."""

    rank: int
    per_micro_batch: bool
    charged: bool = False
    #: (step, M, H, unit seconds, seconds of the unit tau cut, whether that unit ran to its
    #: end) of each round, made into
    #: rows only when asked (per round that would be a few numpy calls on the critical path)
    rounds: list[tuple[int, int, int, Sequence[float], float, bool]] = field(default_factory=list)
    #: each settled round's wall seconds, by step (:meth:`charge`)
    walls: dict[int, float] = field(default_factory=dict)
    #: seconds of injected sleep in the units so far, and the units' seconds (``asleep``)
    slept: float = 0.0
    timed: float = 0.0
    #: whether a threshold could cut the injected sleeps (``DelayModel.cuttable``)
    cuttable: bool = True

    def add(
        self,
        step: int,
        micro_batches: int,
        local_steps: int,
        times: Sequence[float],
        cut: float = float("nan"),
        cut_whole: bool = False,
        slept: float = 0.0,
        timed: float | None = None,
    ) -> None:
        """The counted units' seconds of round ``step`` (NaN: not counted), how long the unit
        tau preempted had run (NaN: none), whether it ran to its end (``cut`` its time, not
        a lower bound), the injected seconds the rank slept in its units and the seconds
        they took (default: the units' and the cut one's; a round of shares traces only M)."""
        self.rounds.append((step, micro_batches, local_steps, times, cut, cut_whole))
        self.slept += slept
        if timed is None:
            timed = math.fsum(t for t in (*times, cut) if not math.isnan(t))
        self.timed += timed

    def charge(self, step: int, wall: float) -> None:
        """Round ``step`` took ``wall`` seconds (the slowest rank's), once its timings came."""
        self.walls[step] = wall

    def table(self) -> np.ndarray:
        """Rows [iteration, rank, (micro-batch,) censored, seconds(, noncompute)] of every unit;
        delay-process iteration = step * H + h. A unit not counted is censored: the one tau
        cut at the seconds it had run, those never started at 0 (``delays.censored``). The
        cut unit is not censored when it ran to its end all the same (a compute that cannot
        be stopped, with no injected seconds left): its seconds are then its time, which a
        bound would have had completed beyond. ``noncompute`` is the round's wall less the
        counted and the cut unit's seconds: a run-on past tau charged there as well would be
        charged twice by a forecast that completes the unit (it read sync's E[T] from a real
        DropCompute trace 10 points high). A unit a threshold can cut (an injected sleep)
        whose compute before the sleep ran past tau is charged that run-on here too, which
        the simulator's preempt, leaving at tau, does not model: a few ms of a real model's
        compute against the injected seconds."""
        width = 4 + self.per_micro_batch + self.charged
        rows = [np.empty((0, width))]
        for step, micro_batches, local_steps, seconds, cut, whole in self.rounds:
            times = np.asarray(seconds, dtype=np.float64)
            dropped = np.isnan(times)
            censored = dropped.copy()
            if dropped.any():
                times = np.where(dropped, 0.0, times)
                if not np.isnan(cut):
                    first = np.argmax(dropped)
                    times[first] = cut
                    censored[first] = not whole
            unit = np.arange(times.size)
            iteration = step * local_steps + unit // micro_batches
            cols = [iteration, np.full(unit.size, self.rank)]
            if self.per_micro_batch:
                cols.append(unit % micro_batches)
            rows_of_round = [*cols, censored, times]
            if self.charged:
                # every second the rank computed: the counted units and the cut one's run
                rest = self.walls.get(step, math.nan) - times.sum()
                last = iteration == step * local_steps + local_steps - 1  # the round's last
                rows_of_round.append(np.where(last, rest, np.nan))
            rows.append(np.column_stack(rows_of_round))
        return np.concatenate(rows)


def write_trace(path: Path, table: np.ndarray, per_micro_batch: bool, charged: bool = False):
    """The format's one writer (beside its reader); the censored column only when a row is."""
    flag = -2 - charged  # the censored column
    censored = bool(len(table)) and bool(table[:, flag].any())
    kept = table if censored else np.delete(table, flag, axis=1)
    write_trace_rows(path, kept, per_micro_batch, censored=censored, noncompute=charged)


def write_traces(out: Path, rows: TraceRows, comm: Collectives) -> None:
    """Every rank writes its ``trace-rank{r}.csv`` and rank 0 every rank's rows, gathered, to
    ``trace.csv``: the allreduce and partial-collective topologies alike. A collective: every
    rank calls it."""
    gathered = comm.gather_objects((rows.table(), rows.slept, rows.timed)) or []  # rank 0's
    trace = np.concatenate([table for table, _, _ in gathered]) if gathered else None
    timed = sum(t for _, _, t in gathered)
    asleep = sum(s for _, s, _ in gathered) / timed if timed > 0 else None
    write_outputs(out, None, trace, rows, asleep, rows.cuttable)


def write_rank_steps(out: Path, steps: list[list[dict[str, Any]]]) -> None:
    """``rank-steps.jsonl``: every rank's steps in parts (``rank`` and ``job`` beside the
    :func:`time_row` columns), for a topology whose ranks do not end their steps together."""
    rows = [{"rank": r, **row} for r, rank in enumerate(steps) for row in rank]
    write_jsonl(prepare_folder(out) / RANK_STEPS, rows)


def write_outputs(
    out: Path,
    record: RunRecord | None,
    trace: np.ndarray | None,
    rows: TraceRows,
    asleep: float | None = None,
    cuttable: bool = True,
):
    """Every rank writes its trace; rank 0 (``record`` given) the record, and with ``trace``
    ``trace.csv`` and its machine row: ``asleep``, the share of the units' seconds that were
    injected sleeps, which hold no core and which a threshold can cut, unless ``cut`` is
    false (the delay's units could not be cut; ``delays.trace``)."""
    folder = prepare_folder(out)
    kind = (rows.per_micro_batch, rows.charged)
    write_trace(folder / f"trace-rank{rows.rank}.csv", rows.table(), *kind)
    if record is not None:
        record.write(folder)
    if trace is not None:
        write_trace(folder / "trace.csv", trace, *kind)
        row = machine_row() | ({} if asleep is None else {"asleep": round(asleep, 4)})
        row |= {} if cuttable else {"cut": False}
        append_machine(folder, row)  # what advise needs to see contention

"""Run records, measured traces, rank-tagged logs and profiler ranges of `tailtrain train`.

* ``steps.jsonl`` has the allreduce simulator's columns (``topology.allreduce.step_row``)
  with wall seconds in ``time``, plus ``rank_compute``, ``rank_injected``, ``rank_wait`` and
  ``rank_comm``: each rank's compute seconds, the injected seconds slept within them, its wait
  for the slowest rank's compute (max_k T~_k - T~_n, spent inside the allreduce) and the rest
  of its allreduce seconds. ``comm_time`` (T^c) is the smallest allreduce seconds over the
  ranks: the collective's own time, without waiting (``runtime.allreduce``).
  ``sync_time`` and ``s_eff`` need the time of micro-batches that were never computed, so they
  are null in rounds that dropped work.
* ``summary.json`` has simulate's keys, ``wall_time`` in place of ``virtual_time``.
* Log lines name their rank (``launch.tag_logs``) and, from the runtime, their step.
* ``trace-rank{r}.csv`` (per rank) and ``trace.csv`` (rank 0, all ranks) hold every unit's
  measured seconds in the format ``trace:path=`` reads
  (``iteration,worker[,micro_batch][,censored],seconds``; a unit the threshold cut or never
  started is a censored row, a lower bound, so the law is estimated rather than read from the
  survivors; one iteration per local step; a partial
  collective's unit is a rank's job, its iteration the job's index), so a real run can drive
  ``predict``, ``simulate`` and ``advise`` (:func:`write_traces`).
* :func:`run_record` makes a topology's run record; rank 0's also streams its step and
  evaluation rows to TensorBoard (``--tensorboard``, the scalars of ``simulate``'s
  ``tailtrain.tensorboard``) as they are recorded, until :func:`close_record`, and on a
  terminal advances ``simulate``'s progress bar by its step rows (``--no-progress`` hides it).
* :func:`phase` times a section and marks it as a ``torch.profiler.record_function`` range
  (``tailtrain.compute``, ``tailtrain.wait``, ``tailtrain.reduce``, ``tailtrain.comm``).
"""

from __future__ import annotations

import logging
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

from tailtrain.core.records import RunRecord, prepare_folder
from tailtrain.core.scenario import Scenario, World
from tailtrain.delays.trace import write_trace_rows
from tailtrain.progress import step_progress
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Plan, StepStats
from tailtrain.topology.allreduce import Stops, step_row


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
    """Log lines tagged ``step S`` (``launch.tag_logs`` puts the rank on every line)."""

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
    """What every rank knows after a round: per-rank counts and seconds (N,) each."""

    done: np.ndarray
    compute: np.ndarray
    injected: np.ndarray
    wait: np.ndarray
    comm: np.ndarray

    def full(self, units: int) -> np.ndarray:
        """T_n^(U) where observable: a rank that dropped work never measured its rest."""
        return np.where(self.done == units, self.compute, np.nan)


def allreduce_row(
    plan: Plan, stats: StepStats, times: RoundTimes, used: list[int], m: int, settled: Settled
) -> dict[str, Any]:
    """The record row of an allreduce round adapted on ``stats`` and timed by ``settled``."""
    stops = Stops(times.done, times.compute, times.full(plan.local_steps * m))
    row = step_row(plan, stats, stops, used, m, settled.comm_time)
    row["time"] = settled.time
    row["rank_compute"] = times.compute.tolist()
    row["rank_injected"] = times.injected.tolist()
    row["rank_wait"] = times.wait.tolist()
    row["rank_comm"] = times.comm.tolist()
    return row


@dataclass
class TraceRows:
    """One rank's measured unit seconds, as rows of a ``trace:`` CSV."""

    rank: int
    per_micro_batch: bool
    #: (step, M, H, unit seconds, seconds of the unit tau cut) of each round, made into rows
    #: only when asked (per round that would be a few numpy calls on the critical path)
    rounds: list[tuple[int, int, int, Sequence[float], float]] = field(default_factory=list)

    def add(
        self,
        step: int,
        micro_batches: int,
        local_steps: int,
        times: Sequence[float],
        cut: float = float("nan"),
    ) -> None:
        """The counted units' seconds of round ``step`` (NaN: not counted) and how long the
        unit tau preempted had run (NaN: none)."""
        self.rounds.append((step, micro_batches, local_steps, times, cut))

    def table(self) -> np.ndarray:
        """Rows [iteration, rank, (micro-batch,) censored, seconds] of every unit; delay-process
        iteration = step * H + h. A unit not counted is censored: the one tau cut at the
        seconds it had run, those never started at 0 (``delays.censored``)."""
        width = 5 if self.per_micro_batch else 4
        rows = [np.empty((0, width))]
        for step, micro_batches, local_steps, seconds, cut in self.rounds:
            times = np.asarray(seconds, dtype=np.float64)
            censored = np.isnan(times)
            if censored.any():
                times = np.where(censored, 0.0, times)
                if not np.isnan(cut):
                    times[np.argmax(censored)] = cut
            unit = np.arange(times.size)
            iteration = step * local_steps + unit // micro_batches
            cols = [iteration, np.full(unit.size, self.rank)]
            if self.per_micro_batch:
                cols.append(unit % micro_batches)
            rows.append(np.column_stack([*cols, censored, times]))
        return np.concatenate(rows)


def write_trace(path: Path, table: np.ndarray, per_micro_batch: bool) -> None:
    """The format's one writer (beside its reader); the censored column only when a row is."""
    censored = bool(len(table)) and bool(table[:, -2].any())
    kept = table if censored else np.delete(table, -2, axis=1)
    write_trace_rows(path, kept, per_micro_batch, censored=censored)


def write_traces(out: Path, rows: TraceRows, comm: Collectives) -> None:
    """Every rank writes its ``trace-rank{r}.csv`` and rank 0 every rank's rows, gathered, to
    ``trace.csv``: the allreduce and partial-collective topologies alike. A collective: every
    rank calls it."""
    tables = comm.gather_objects(rows.table())
    trace = np.concatenate(tables) if tables else None
    write_outputs(out, None, trace, rows)


def write_outputs(out: Path, record: RunRecord | None, trace: np.ndarray | None, rows: TraceRows):
    """Every rank writes its trace; rank 0 (``record`` given) the record and ``trace.csv``."""
    folder = prepare_folder(out)
    write_trace(folder / f"trace-rank{rows.rank}.csv", rows.table(), rows.per_micro_batch)
    if record is not None:
        record.write(folder)
    if trace is not None:
        write_trace(folder / "trace.csv", trace, rows.per_micro_batch)

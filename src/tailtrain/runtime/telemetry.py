"""Run records, measured traces, rank-tagged logs and profiler ranges of `tailtrain train`.

* ``steps.jsonl`` has the allreduce simulator's columns (``sim.allreduce_engine.step_row``)
  with wall seconds in ``time``, plus ``rank_compute``, ``rank_injected``, ``rank_wait`` and
  ``rank_comm``: each rank's compute seconds, the injected seconds slept within them, its wait
  (for the slowest rank, in the all-gather) and its allreduce seconds.
  ``sync_time`` and ``s_eff`` need the time of micro-batches that were never computed, so they
  are null in rounds that dropped work.
* ``summary.json`` has simulate's keys, ``wall_time`` in place of ``virtual_time``.
* Log lines name their rank (``launch.tag_logs``) and, from the runtime, their step.
* ``trace-rank{r}.csv`` (per rank) and ``trace.csv`` (rank 0, all ranks) hold every counted
  unit's measured seconds in the format ``trace:path=`` reads
  (``iteration,worker[,micro_batch],seconds``; one iteration per local step), so a real run
  can drive ``predict`` and ``simulate``.
* :func:`run_record` makes a topology's run record; rank 0's also streams its step and
  evaluation rows to TensorBoard (``--tensorboard``, the scalars of ``simulate``'s
  ``tailtrain.tensorboard``) as they are recorded, until :func:`close_record`.
* :func:`phase` times a section and marks it as a ``torch.profiler.record_function`` range
  (``tailtrain.compute``, ``tailtrain.wait``, ``tailtrain.reduce``, ``tailtrain.comm``).
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch.profiler import record_function

from tailtrain.runtime.config import TrainConfig
from tailtrain.sim.allreduce.engine import step_row, summarise
from tailtrain.sim.allreduce.timing import Stops
from tailtrain.sim.records import RunRecord, prepare_folder
from tailtrain.sim.scenario import World
from tailtrain.strategies.base import Plan, StepStats, Strategy


@dataclass
class Timer:
    seconds: float = 0.0


@contextmanager
def phase(name: str) -> Iterator[Timer]:
    """Wall seconds of a section, also a profiler range ``tailtrain.<name>``."""
    timer = Timer()
    start = time.perf_counter()
    with record_function(f"tailtrain.{name}"):
        try:
            yield timer
        finally:
            timer.seconds = time.perf_counter() - start


class RankLog(logging.LoggerAdapter):
    """Log lines tagged ``step S`` (``launch.tag_logs`` puts the rank on every line)."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("tailtrain.runtime"), {})
        self.step = 0

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"step {self.step}: {msg}", kwargs


class BoardSink:
    """A :class:`RunRecord` sink that logs each row to TensorBoard as it is added. The
    parameter server scores its evaluation snapshots after the run (``ps.Server.scorer``):
    those rows are logged when the sink closes, by then filled in (the same row objects)."""

    def __init__(self, folder: Path, metric: str) -> None:
        from tailtrain.tensorboard import TensorBoardLog

        self.board = TensorBoardLog(folder, metric)
        self.unscored: list[dict[str, Any]] = []

    def write(self, name: str, row: dict[str, Any]) -> None:
        if name == "steps":
            self.board.add_step(row)
        elif "_snapshot" in row:
            self.unscored.append(row)
        else:
            self.board.add_eval(row)

    def close(self) -> None:
        for row in self.unscored:
            self.board.add_eval(row)
        self.board.close()


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
    """A topology's run record; the lead rank's streams to ``config.tensorboard`` when set."""
    return stream_to_board(RunRecord(), config, world, lead)


def stream_to_board(record: RunRecord, config: TrainConfig, world: World, lead: bool) -> RunRecord:
    """``record``, whose rows also go to ``config.tensorboard`` from now on on the lead rank."""
    if lead and config.tensorboard is not None:
        metric = getattr(world.task, "metric_name", None) or "eval"
        attach(record, BoardSink(config.tensorboard, metric))
    return record


def close_record(record: RunRecord) -> None:
    """Flush and detach a record's sink: a finished record goes back to the launcher by pickle."""
    if record.sink is not None:
        record.sink.close()
        record.sink = None


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


def round_row(
    plan: Plan, stats: StepStats, times: RoundTimes, used: list[int], m: int
) -> dict[str, Any]:
    stops = Stops(times.done, times.compute, times.full(plan.local_steps * m))
    row = step_row(plan, stats, stops, used, m, stats.comm_time)
    row["rank_compute"] = times.compute.tolist()
    row["rank_injected"] = times.injected.tolist()
    row["rank_wait"] = times.wait.tolist()
    row["rank_comm"] = times.comm.tolist()
    return row


def run_summary(world: World, strategy: Strategy, record: RunRecord) -> dict[str, Any]:
    """simulate's summary keys, measured: ``wall_time`` in place of ``virtual_time``."""
    summary = {**world.summarise(strategy, record), **summarise(record)}
    summary["nonfinite"] = int(sum(row.get("nonfinite", 0) for row in record.steps))
    return {("wall_time" if k == "virtual_time" else k): v for k, v in summary.items()}


@dataclass
class TraceRows:
    """One rank's measured unit seconds, as rows of a ``trace:`` CSV."""

    rank: int
    per_micro_batch: bool
    rows: list[np.ndarray] = field(default_factory=list)

    def add(self, step: int, micro_batches: int, local_steps: int, times: np.ndarray) -> None:
        """The counted units of round ``step``; delay-process iteration = step * H + h."""
        unit = np.flatnonzero(~np.isnan(times))
        iteration = step * local_steps + unit // micro_batches
        cols = [iteration, np.full(unit.size, self.rank)]
        if self.per_micro_batch:
            cols.append(unit % micro_batches)
        self.rows.append(np.column_stack([*cols, times[unit]]))

    def table(self) -> np.ndarray:
        width = 4 if self.per_micro_batch else 3
        return np.concatenate(self.rows) if self.rows else np.empty((0, width))


def write_trace(path: Path, table: np.ndarray, per_micro_batch: bool) -> None:
    header = ["iteration", "worker", *(["micro_batch"] if per_micro_batch else []), "seconds"]
    order = np.lexsort(table[:, :-1].T[::-1]) if len(table) else np.arange(0)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for row in table[order]:
            writer.writerow([*(int(v) for v in row[:-1]), repr(float(row[-1]))])


def write_outputs(out: Path, record: RunRecord | None, trace: np.ndarray | None, rows: TraceRows):
    """Every rank writes its trace; rank 0 (``record`` given) the record and ``trace.csv``."""
    folder = prepare_folder(out)
    write_trace(folder / f"trace-rank{rows.rank}.csv", rows.table(), rows.per_micro_batch)
    if record is not None:
        record.write(folder)
    if trace is not None:
        write_trace(folder / "trace.csv", trace, rows.per_micro_batch)

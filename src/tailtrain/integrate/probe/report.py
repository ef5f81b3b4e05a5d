"""The probe's reporting, on rank 0: verdicts on each gathered window, and what it writes.

For each window rank 0 appends its rows to ``trace.csv`` (``TRACE_COLUMNS``, the format
``trace:path=`` and ``tailtrain advise`` read), judges the last ``horizon`` steps with
``tailtrain.persistence`` (the rule ``advise`` applies to a trace), logs the verdicts (logger
``tailtrain.probe``), appends them to ``verdicts.jsonl`` and, with ``tensorboard=``, logs the
scores. A folder keeps its runs: the first write of a run numbers it after the folder's last
(``prepare_trace``). A report that fails is logged and kept, never raised between steps
(``_report_kept``): the ranks keep gathering in step. docs/probe.md has the whole story.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tailtrain.core.machine import append_machine, machine_row
from tailtrain.delays.trace import read_trace, write_trace_rows
from tailtrain.errors import UsageError
from tailtrain.integrate.probe.window import LIVE_MIN_STEPS, SAMPLES, SECTIONS
from tailtrain.persistence import Slowness, classify_workers, per_sample_times, too_few_steps

log = logging.getLogger("tailtrain.probe")

#: what a probe trace's rows hold (``trace_header``; ``samples`` where they are known)
TRACE_COLUMNS = ("iteration", "worker", "seconds", "noncompute", "samples", "run")


#: the number each verdict is logged as (``ProbeReport.metrics``: a logger takes numbers)
VERDICT_LEVELS = {"healthy": 0, "intermittent": 1, "persistent": 2}


@dataclass(frozen=True)
class ProbeReport:
    """Rank 0's view after a window: per-rank verdicts over the last steps, and the medians
    of each section (seconds per step, ranks in order). ``per_sample``: the verdicts judged
    seconds per sample (the ranks computed different samples per step:
    ``persistence.per_sample_times``), so their ``median_seconds`` is per sample; ``run``:
    the run's number in the folder's ``trace.csv`` (None: no folder); ``groups``: a sharded
    job's replica groups."""

    step: int  # steps gathered so far
    elapsed: float  # wall seconds since the probe started
    verdicts: list[Slowness]  # ``worker`` is the rank
    sections: dict[str, list[float]] = field(default_factory=dict)
    per_sample: bool = False
    run: int | None = None
    #: a sharded job's replica groups (the ranks of each; None: not sharded): a slow rank
    #: makes its whole group slow, so a report names the group with the rank
    groups: list[list[int]] | None = None

    def group_of(self, rank: int) -> int | None:
        """The replica group ``rank`` belongs to (None: not a sharded job)."""
        return next((g for g, ranks in enumerate(self.groups or []) if rank in ranks), None)

    def named(self) -> dict[int, str]:
        """The ranks that are not healthy, and their verdicts."""
        return {v.worker: v.verdict for v in self.verdicts if v.verdict != "healthy"}

    def metrics(self) -> dict[str, float]:
        """The report as a logger's numbers (a trainer's loggers take numbers), per rank r:
        ``probe/{data,compute,wait}_s/rank{r}`` (the median seconds per step over the
        verdict's steps), and once there are verdicts ``probe/score/rank{r}`` (1 for a rank
        as fast as the others' median, lower when slower) and ``probe/verdict/rank{r}``
        (``VERDICT_LEVELS``: 0 healthy, 1 intermittent, 2 persistent)."""
        metrics = {
            f"probe/{name}_s/rank{rank}": float(seconds)
            for name, values in self.sections.items()
            for rank, seconds in enumerate(values)
        }
        for v in self.verdicts:
            metrics[f"probe/score/rank{v.worker}"] = float(v.score)
            metrics[f"probe/verdict/rank{v.worker}"] = float(VERDICT_LEVELS[v.verdict])
        return metrics

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": self.step,
            "elapsed": self.elapsed,
            "sections": self.sections,
            "per_sample": self.per_sample,
            "ranks": [v.as_dict() for v in self.verdicts],
            "groups": self.groups,
        }


class Reporting:
    """The report layer of ``StragglerProbe`` (rank 0): the last ``horizon`` steps, the
    verdicts on them, ``trace.csv``, ``verdicts.jsonl`` and TensorBoard (module docstring).
    ``Gathering`` hands it each window taken, through ``_report_kept``."""

    # the probe's, read here
    out: Path | None
    rank: int
    horizon: int
    warmup: int
    started: float
    on_report: Callable[[ProbeReport], None] | None
    groups: list[list[int]] | None
    remedy: dict[str, Any] | None
    accumulates: int

    def _init_reporting(self, world: int, tensorboard: str | Path | None) -> None:
        self.error: BaseException | None = None  # rank 0: the first report that failed
        #: rank 0: the last ``horizon`` steps (steps x ranks x sections), all a verdict reads:
        #: kept whole, a long run's history would grow without bound and be copied at every
        #: report (``trace.csv`` has every step)
        self.history = np.empty((0, world, len(SECTIONS) + 1))
        self.reported = 0  # rank 0: steps reported so far
        self.last: ProbeReport | None = None
        #: rank 0: this run's number in ``trace.csv`` and whether its rows have ``samples``,
        #: both decided at the first write (``prepare_trace``)
        self.run: int | None = None
        self.with_samples = False
        self._unknown_noted = False  # rank 0: a step without samples in a run with them, logged
        self.board = self._board(tensorboard) if self.rank == 0 else None
        if self.out is not None and self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)

    def _report_kept(self, window: np.ndarray) -> None:
        """``_report``, its error logged and the first one kept for ``flush`` / ``close``:
        raised between steps, it would come at a later gather than the one that failed, drop
        that window and, caught by the loop, leave rank 0 one gather behind the others."""
        try:
            self._report(window)
        except Exception as error:
            log.error("probe: the report at step %d failed: %r", self.reported, error)
            log.debug("probe: the failed report's traceback", exc_info=error)
            if self.error is None:
                self.error = error

    def _report(self, window: np.ndarray) -> None:
        first, self.reported = self.reported, self.reported + window.shape[0]
        self.history = np.concatenate([self.history, window])[-self.horizon :]
        if self.out is not None:
            self._write_trace(first, window)
        # the last ``horizon`` steps after the warm-up, by step count (history[0] is step
        # reported - len(history))
        kept_from = self.reported - self.history.shape[0]
        recent = self.history[max(self.warmup, self.reported - self.horizon) - kept_from :]
        # seconds per sample where the ranks computed different samples (after rebalance
        # deals a slow rank less, its seconds per step no longer show it slow)
        own, per_sample = per_sample_times(recent[:, :, 0] + recent[:, :, 1], recent[:, :, SAMPLES])
        sections = {name: np.median(recent[:, :, i], axis=0).tolist()
                    for i, name in enumerate(SECTIONS)}  # fmt: skip
        enough = own.shape[0] >= LIVE_MIN_STEPS and own.shape[1] >= 2
        verdicts = classify_workers(own) if enough else []
        elapsed = time.perf_counter() - self.started
        report = ProbeReport(
            self.reported, elapsed, verdicts, sections, per_sample, self.run, self.groups
        )
        self.last = report
        self._log(report)
        if self.on_report is not None:
            self.on_report(report)

    def _write_trace(self, first: int, window: np.ndarray) -> None:
        """Append the window's rows ``iteration,worker,seconds,noncompute[,samples],run``:
        seconds = data + compute, noncompute = the wait (the step's wall seconds on that
        rank less its seconds, as ``train`` writes it). The run's first write decides its
        number and whether it has ``samples`` (every step of its first window known), and
        makes room for it in the folder (``prepare_trace``)."""
        assert self.out is not None
        samples = window[:, :, SAMPLES]
        if self.run is None:
            self.with_samples = not np.isnan(samples).any()
            self.run = prepare_trace(self.out, self.with_samples)
            # advise's contention note; and a user's step is a computation: nothing cuts it
            # once begun (the hook checks tau between micro-batches, ``delays.trace``)
            row = machine_row(self.run) | {"cut": False}
            if self.remedy is not None:  # the watched hook's or step's rule: advise reads it
                row["remedy"] = self.remedy
            if self.accumulates > 1:  # loader batches per step: advise deals shares of one
                row["accumulates"] = self.accumulates
            append_machine(self.out, row)
        if self.with_samples and np.isnan(samples).any():
            if not self._unknown_noted:
                log.warning(
                    "probe: some steps after step %d have no sample count (probe.step() without "
                    "samples=, or a batch without a tensor); trace.csv has 0 samples for them",
                    first,
                )
                self._unknown_noted = True
            samples = np.nan_to_num(samples, nan=0.0)
        steps, ranks, _ = window.shape
        step, rank = np.meshgrid(first + np.arange(steps), np.arange(ranks), indexing="ij")
        columns = [step, rank, window[:, :, 0] + window[:, :, 1], window[:, :, 2]]
        columns += [samples] * self.with_samples + [np.full((steps, ranks), self.run)]
        table = np.column_stack([c.ravel() for c in columns])
        write_trace_rows(
            self.out / "trace.csv", table, per_micro_batch=False, append=True,
            noncompute=True, samples=self.with_samples, run=True,
        )  # fmt: skip

    def _log(self, report: ProbeReport) -> None:
        if not report.verdicts:
            return
        wait = report.sections["wait"]
        # the two sections' medians summed: a step's own time, near its median
        own = np.add(report.sections["data"], report.sections["compute"])
        for v in report.verdicts:
            if v.verdict != "healthy":
                # judged per sample (a rebalanced job), the step's own time too: a run before
                # the shares were dealt said it per step
                unit = (
                    f"sample ({1e3 * own[v.worker]:.3g} ms per step)" if report.per_sample
                    else "step"
                )  # fmt: skip
                group = report.group_of(v.worker)
                where = "" if group is None else (
                    f" in replica group {group} (ranks "
                    f"{', '.join(map(str, (report.groups or [])[group]))}: the group waits for it)"
                )  # fmt: skip
                few = too_few_steps(v, len(report.verdicts))  # "intermittent", slower in all
                log.warning(
                    "probe step %d: rank %d %s%s, score %.2f (%.2fx the others' median own "
                    "time, slower in %.0f%% of steps; own %.3g ms per %s, wait %.1f ms per "
                    "step; stalled %d steps in a row)%s",
                    report.step, v.worker, v.verdict, where, v.score, v.slowdown,
                    100 * v.slower_share, 1e3 * v.median_seconds, unit, 1e3 * wait[v.worker],
                    v.longest_stall,
                    "; too few steps yet to call it persistent" if few else "",
                )  # fmt: skip
        healthy = [v for v in report.verdicts if v.verdict == "healthy"]
        if healthy:
            log.info(
                "probe step %d: %d rank(s) healthy, scores %.2f..%.2f",
                report.step, len(healthy), min(v.score for v in healthy),
                max(v.score for v in healthy),
            )  # fmt: skip
        if self.out is not None:
            with (self.out / "verdicts.jsonl").open("a") as handle:
                handle.write(json.dumps(report.as_dict()) + "\n")
        if self.board is not None:
            scalars = {f"probe/score/rank{v.worker}": v.score for v in report.verdicts}
            scalars |= {f"probe/wait_s/rank{r}": w for r, w in enumerate(wait)}
            self.board.add_scalars(scalars, report.step, time.time())

    @staticmethod
    def _board(folder: str | Path | None) -> Any:
        if folder is None:
            return None
        from tailtrain.tensorboard import TensorBoardLog  # optional dependency, on demand

        return TensorBoardLog(Path(folder))

    def _close_board(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None


def trace_header(samples: bool) -> list[str]:
    """A probe trace's columns: ``TRACE_COLUMNS``, ``samples`` only where known."""
    return [c for c in TRACE_COLUMNS if samples or c != "samples"]


def prepare_trace(out: Path, samples: bool) -> int:
    """Make room in ``out`` for a run's rows and return its number (rank 0, at its first
    write): one more than the last run of ``trace.csv`` and ``verdicts.jsonl`` (a file or
    line without a ``run`` holds run 0), 0 in an empty folder. ``trace.csv`` is kept:

    * with this run's columns (``trace_header``): the rows are appended;
    * lacking only ``run`` or ``noncompute`` (an earlier probe's): rewritten once with run 0
      and noncompute NaN (the format's "not recorded"), to a temporary file then
      ``os.replace``, so a crash leaves the old file or the new, whole;
    * other columns (a ``train`` trace with ``micro_batch``; ``samples`` in one run and not in
      the other, which no row can be given unseen) or unreadable: moved aside whole, to the
      first free ``trace.N.csv``, with a warning naming it."""
    path = out / "trace.csv"
    runs = [_last_verdict_run(out / "verdicts.jsonl")]
    header = trace_header(samples)
    if path.exists():
        try:
            found, old = read_trace(path), _header(path)
        except UsageError:
            found, old = None, []
        missing, extra = {*header} - {*old}, {*old} - {*header}
        if found is not None and old == header:
            runs.append(found.runs[-1])
        elif found is not None and not extra and missing <= {"run", "noncompute"}:
            _rewrite(path, found, samples)
            runs.append(found.runs[-1])
        else:
            moved = next(out / f"trace.{n}.csv" for n in range(1, 10**6)
                         if not (out / f"trace.{n}.csv").exists())  # fmt: skip
            os.replace(path, moved)
            log.warning(
                "probe: %s has columns %s, not a probe run's %s: moved it to %s (kept whole)",
                path, ",".join(old) or "(unreadable)", ",".join(header), moved,
            )  # fmt: skip
    known = [r for r in runs if r is not None]
    return max(known) + 1 if known else 0


def _header(path: Path) -> list[str]:
    with path.open(newline="") as handle:
        return [name.strip() for name in next(csv.reader(handle), [])]


def _rewrite(path: Path, found: Any, samples: bool) -> None:
    """``path`` again with run 0 and noncompute NaN where it had none (atomically)."""
    rows = found.seconds.size
    noncompute = found.noncompute if found.noncompute is not None else np.full(rows, np.nan)
    run = found.run if found.run is not None else np.zeros(rows)
    columns = [found.iteration, found.worker, found.seconds, noncompute]
    columns += [found.samples] * samples + [run]
    temporary = path.with_name(f".{path.name}.tmp")
    write_trace_rows(
        temporary, np.column_stack(columns), per_micro_batch=False, noncompute=True,
        samples=samples, run=True,
    )  # fmt: skip
    os.replace(temporary, path)


def _last_verdict_run(path: Path) -> int | None:
    """The run of ``verdicts.jsonl``'s last readable line (0 for a line without one), or
    None without any."""
    if not path.exists():
        return None
    last = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            last = int(json.loads(line).get("run") or 0)
        except (ValueError, AttributeError, TypeError):
            continue  # a line cut short by a crash
    return last
